"""Builder throughput vs. the users' on-the-fly pipeline and vs. the physical limits.

Measures in one run, on the same recipe:
  (a) our builder (`build_cache`, all cores) graphs/s and wall time;
  (b) a faithful re-implementation of the users' per-graph pipeline
      (networkx + pandas, per-node loops; benchmarks/user_pipeline.py), one process;
  (c) the limits: generation alone and zstd compression alone of the same
      records (same level), per core, scaled to all cores.
Appends the numbers to benchmarks/RESULTS.md.

    python benchmarks/bench_build.py --graphs 100000 --out /tmp/bench-build
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parent))
from _results import append, quick_defaults  # noqa: E402
from user_pipeline import UserStyleGenerator  # noqa: E402

from cachebuild.builder import BuildOptions, build_cache  # noqa: E402
from cachebuild.builder.causal_source import CausalSource  # noqa: E402
from cachebuild.causal import parse_causal_config  # noqa: E402
from cachebuild.config_file import load_toml  # noqa: E402
from cachebuild.format.codec import parse_codec  # noqa: E402


def user_rate(sample: int) -> float:
    gen = UserStyleGenerator(0)
    t = time.perf_counter()
    for _ in range(sample):
        gen.generate_pipeline(num_nodes=int(gen.rng.integers(5, 11)))
    return sample / (time.perf_counter() - t)


def limits(source: CausalSource, codec, sample: int) -> tuple[float, float, float]:
    """(generation graphs/s per core, compression graphs/s per core, raw bytes per graph)."""
    t = time.perf_counter()
    records = [r for block in source.blocks(0, 0, 0, sample) for r in block]
    gen = sample / (time.perf_counter() - t)
    payloads = [r[k].tobytes() for r in records for k, _ in source.fields() if k != "json"]
    cctx = codec.compressor()
    t = time.perf_counter()
    for p in payloads:
        cctx.compress(p)
    comp = sample / (time.perf_counter() - t)
    return gen, comp, sum(map(len, payloads)) / sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--config", type=Path, default=None, help="recipe (default: built-in = configs/causal-users-2026-01-15.toml)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/cachebuild-bench-build"))
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--user-sample", type=int, default=300, help="graphs timed through the user-style pipeline")
    ap.add_argument("--limit-sample", type=int, default=4096, help="graphs timed for the generation/compression limits")
    quick_defaults(ap, graphs=400, workers=2, user_sample=10, limit_sample=256, out=Path("/tmp/cachebuild-bench-build-quick"))
    args = ap.parse_args()

    table = load_toml(args.config) if args.config else {}
    cfg = parse_causal_config({k: v for k, v in table.items() if k not in ("build",)})
    source = CausalSource(cfg)
    codec = parse_codec("zstd", args.level)
    cores = args.workers

    u = user_rate(args.user_sample)
    gen1, comp1, raw_per_graph = limits(source, codec, args.limit_sample)
    shutil.rmtree(args.out, ignore_errors=True)
    opts = BuildOptions(out=args.out, records=args.graphs, codec=codec, workers=cores, progress=False)
    t = time.perf_counter()
    summary = build_cache(source, opts, unit="graphs")
    wall = time.perf_counter() - t
    ours = args.graphs / wall
    ideal = args.graphs / (gen1 * cores) + args.graphs / (comp1 * cores)
    shutil.rmtree(args.out, ignore_errors=True)
    rows = [
        ("graphs", f"{args.graphs:,} ({raw_per_graph / 1e3:.1f} KB raw each), {cores} workers, zstd level {args.level}"),
        ("our build wall time", f"{wall:.1f} s ({'meets' if wall < 30 else 'misses'} the < 30 s target)"),
        ("our build graphs/s (all cores)", f"{ours:,.0f}"),
        ("user-style pipeline graphs/s (1 process)", f"{u:,.0f}"),
        ("ratio ours / user-style", f"{ours / u:,.1f}x (target >= 50x)"),
        ("generation alone graphs/s per core", f"{gen1:,.0f}"),
        ("zstd alone graphs/s per core", f"{comp1:,.0f} ({comp1 * raw_per_graph / 1e6:,.0f} MB/s)"),
        ("ideal (gen + zstd) / cores", f"{ideal:.1f} s"),
        ("build / ideal", f"{wall / ideal:.2f}x (target <= 1.5x)"),
        ("stored / raw", f"{summary.stored_bytes / 1e6:,.0f} MB / {summary.raw_bytes / 1e6:,.0f} MB (ratio {summary.ratio:.2f}x incl. tar headers)"),
    ]
    append("bench_build: causal graphs", rows)


if __name__ == "__main__":
    main()
