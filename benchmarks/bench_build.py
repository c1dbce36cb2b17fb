"""Build wall time against its ideal, for the code before a change and after it, in one run.

Measures in one run, on the default causal recipe:
  (a) the limits, single core, this checkout: generation alone (``source.blocks``),
      and zstd compression alone of the exact payloads the shards store (``.npy``
      header + data, JSON text; one frame each, the writer's batch call), per graph;
      plus what the format itself costs on top (JSON encoding, sha256 of the stored
      bytes, crc32 of raw payloads), measured, not assumed; and the shard writer alone
      (``ShardWriter`` over the same records, in this process), so the writer's own work
      (what is neither the format's floor nor the write's kernel floor) is a number;
  (b) `cachebuild generate --graphs N --codec C` as a subprocess, for each code tree
      given (``--code NAME=DIR``, e.g. main's commit in a worktree, and this checkout),
      interleaved, ``--rounds`` times: wall time and CPU time of the whole process tree;
  (c) after each build, the output folder's write floor: the same number of bytes written
      into as many files by as many processes as the build had workers, in writes of the
      writer's run size from one reused buffer, right after the build's files are deleted
      (the kernel's page allocation for the output, which no build can avoid; on a VM it
      varies several-fold with the host's memory state, so it is measured next to each build);
  (d) optionally, the users' per-graph networkx/pandas pipeline (``--user-sample``).
The ideal is the limit spread over all cores: generation + compression for zstd,
generation alone for ``--codec none``. Appends the table to benchmarks/RESULTS.md.

    git worktree add --detach /tmp/main-1d3ec8c 1d3ec8c
    python benchmarks/bench_build.py --graphs 100000 --out /dev/shm/bench-build \\
        --code before=/tmp/main-1d3ec8c --code after=.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _results import append, quick_defaults  # noqa: E402

from cachebuild.builder.causal_source import CausalSource  # noqa: E402
from cachebuild.causal import parse_causal_config  # noqa: E402
from cachebuild.config_file import load_toml  # noqa: E402
from cachebuild.format.codec import parse_codec  # noqa: E402
from cachebuild.format.json_text import compact_encoder  # noqa: E402
from cachebuild.format.npy import npy_header  # noqa: E402
from cachebuild.format.shard_writer import ShardWriter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

try:  # the writer's crc32 of raw members (cachebuild/format/member_block.py)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32


def _cpu(fn: Any) -> tuple[Any, float]:
    """(result, CPU seconds of this process)."""
    c = time.process_time()
    out = fn()
    return out, time.process_time() - c


def _rate(fn: Any, data: bytes) -> float:
    """Bytes per CPU second of ``fn(data)``, best of 3."""
    return max(len(data) / max(_cpu(lambda: fn(data))[1], 1e-9) for _ in range(3))


def writer_cpu(records: list[dict[str, Any]], fields: list[tuple[str, str]], codec: str, level: int, out: Path) -> dict[str, float]:
    """CPU microseconds per record of one ``ShardWriter`` writing ``records`` into ``out`` (best of 2,
    each into a new file; user and kernel) and its bytes per record."""
    times = []
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        writer = ShardWriter(out, "shard-00000.tar", fields, parse_codec(codec, level), first_record=0)
        shard, cpu = _cpu(lambda: (writer.add_block(records), writer.close())[1])
        times.append(cpu)
    shutil.rmtree(out, ignore_errors=True)
    return {"us": min(times) / len(records) * 1e6, "stored": shard.bytes / len(records)}


def limits(source: CausalSource, level: int, sample: int, codecs: tuple[str, ...] = (), out: Path | None = None) -> dict[str, float]:
    """Single-core CPU microseconds per graph: generation, compression, JSON; bytes per graph; hash rates;
    and for each of ``codecs``, the shard writer alone (``writer_<codec>_us``, written under ``out``)."""
    records, gen = _cpu(lambda: [r for block in source.blocks(0, 0, 0, sample) for r in block])
    array_fields = [k for k, d in source.fields() if d != "json"]
    encode = compact_encoder()  # the writer's JSON encoder (json.dumps's text)
    texts, js = _cpu(lambda: [encode(r["json"]).encode() for r in records])
    payloads = [b"".join((npy_header(r[k]), r[k].data)) for r in records for k in array_fields] + texts
    cctx = parse_codec("zstd", level).compressor()
    batch = getattr(cctx, "multi_compress_to_buffer", None)
    compress = (lambda: batch(payloads)) if batch else (lambda: [cctx.compress(p) for p in payloads])
    comp = min(_cpu(compress)[1] for _ in range(2))
    block = os.urandom(64 << 20)
    writers: dict[str, float] = {}
    for codec in codecs if out is not None else ():
        w = writer_cpu(records, list(source.fields()), codec, level, out)
        writers |= {f"writer_{codec}_us": w["us"], f"writer_{codec}_stored": w["stored"]}
    return writers | {
        "gen_us": gen / sample * 1e6,
        "zstd_us": comp / sample * 1e6,
        "json_us": js / sample * 1e6,
        "raw_bytes": sum(map(len, payloads)) / sample,
        "sha256_Bps": _rate(lambda d: hashlib.sha256(d).digest(), block),
        "crc32_Bps": _rate(crc32, block),
    }


_FLOOR_WRITER = """
import os, resource, sys
out, size, chunk, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
buf = memoryview(os.urandom(chunk))
r = resource.getrusage(resource.RUSAGE_SELF)
for name in names:
    fd = os.open(os.path.join(out, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = size
    while left:
        left -= os.write(fd, buf[: min(chunk, left)])
    os.fsync(fd)
    os.close(fd)
print(resource.getrusage(resource.RUSAGE_SELF).ru_stime - r.ru_stime)
"""


def write_floor(out: Path, stored: int, files: int, procs: int, chunk: int = 8 << 20) -> dict[str, float]:
    """Write ``stored`` bytes into ``files`` files under ``out`` from ``procs`` processes at once, in
    ``chunk``-byte writes of one reused buffer: wall s and kernel s of the writes (the output's floor)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    names = [f"floor-{i:05d}" for i in range(max(files, 1))]
    t = time.perf_counter()
    writers = [
        subprocess.Popen([sys.executable, "-c", _FLOOR_WRITER, str(out), str(stored // len(names)), str(chunk), *names[k::procs]], stdout=subprocess.PIPE, text=True)
        for k in range(min(procs, len(names)))
    ]
    kernel = sum(float(w.communicate()[0]) for w in writers)
    wall = time.perf_counter() - t
    if any(w.returncode for w in writers):
        raise SystemExit(f"the floor's writer failed in {out}")
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "sys": kernel}


def run_build(code: Path, graphs: int, codec: str, workers: int, out: Path, pack: str = "default") -> dict[str, float]:
    """One ``cachebuild generate`` in a fresh process tree: wall s, CPU s (all its processes), stored bytes,
    then the write floor of the same bytes in the same folder (:func:`write_floor`)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", str(graphs), "--out", str(out), "--codec", codec, "--workers", str(workers), "-q"]
    cmd += [] if pack == "default" else ["--pack", pack]
    env = {**os.environ, "PYTHONPATH": str(code)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=code)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tars = [p.stat().st_size for p in out.iterdir() if p.suffix == ".tar"]
    shutil.rmtree(out, ignore_errors=True)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    floor = write_floor(out, sum(tars), len(tars), workers)
    return {"wall": wall, "cpu": cpu, "sys": after.ru_stime - before.ru_stime, "stored": sum(tars), "floor_sys": floor["sys"], "floor_wall": floor["wall"]}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def codec_rows(codec: str, runs: dict[str, list[dict[str, float]]], lim: dict[str, float], graphs: int, cores: int) -> list[tuple[str, str]]:
    """Table rows of one codec: each code's wall and CPU against the ideal and the format's floor."""
    per_graph = lim["gen_us"] + (lim["zstd_us"] if codec == "zstd" else 0.0)
    ideal = graphs * per_graph / 1e6 / cores
    rows = [(f"{codec}: ideal ({'generation + zstd' if codec == 'zstd' else 'generation'}) / {cores} cores", f"{ideal:.1f} s ({per_graph:.0f} us CPU per graph)")]
    stored = statistics.median(r["stored"] for rs in runs.values() for r in rs) / graphs
    floor = lim["json_us"] + stored / lim["sha256_Bps"] * 1e6 + (lim["raw_bytes"] / lim["crc32_Bps"] * 1e6 if codec == "none" else 0.0)
    rows.append(
        (
            f"{codec}: the format's floor on top (JSON, sha256{', crc32' if codec == 'none' else ''})",
            f"{floor:.0f} us per graph ({stored / 1e3:.1f} KB stored per graph): ideal + floor = {graphs * (per_graph + floor) / 1e6 / cores:.1f} s",
        )
    )
    if f"writer_{codec}_us" in lim:
        rows.append(writer_row(codec, runs, lim))
    for name, rs in runs.items():
        wall = [r["wall"] for r in rs]
        cpu = statistics.median(r["cpu"] for r in rs)
        sys_s = statistics.median(r["sys"] for r in rs)
        rows += [
            (
                f"{codec} {name}: wall, median of {len(rs)} (range); stored",
                f"{_spread(wall)} = {statistics.median(wall) / ideal:.2f}x ideal; {statistics.median(r['stored'] for r in rs) / 1e9:.2f} GB",
            ),
            (f"{codec} {name}: CPU of all processes", f"{cpu:.1f} s ({cpu / graphs * 1e6:.0f} us per graph, of which kernel {sys_s:.1f} s) = {cpu / (ideal * cores):.2f}x the ideal's CPU"),
            (
                f"{codec} {name}: kernel s, build vs its output's write floor (same bytes, files and processes, 8 MB writes), each round",
                "; ".join(f"{r['sys']:.1f} vs {r['floor_sys']:.1f}" for r in rs) + f" (median excess {statistics.median(r['sys'] - r['floor_sys'] for r in rs):+.1f} s)",
            ),
        ]
    return rows


def writer_row(codec: str, runs: dict[str, list[dict[str, float]]], lim: dict[str, float]) -> tuple[str, str]:
    """The shard writer alone (:func:`writer_cpu`) against what any writer of its bytes pays: the format's floor,
    zstd, and the kernel's floor for writing them (per byte, from the builds' write floors of this run)."""
    us, stored = lim[f"writer_{codec}_us"], lim[f"writer_{codec}_stored"]
    fmt = lim["json_us"] + stored / lim["sha256_Bps"] * 1e6 + (lim["raw_bytes"] / lim["crc32_Bps"] * 1e6 if codec == "none" else 0.0)
    zstd = lim["zstd_us"] if codec == "zstd" else 0.0
    kernel = statistics.median(r["floor_sys"] / r["stored"] for rs in runs.values() for r in rs) * stored * 1e6
    return (
        f"{codec}: the shard writer alone, 1 core, this checkout: format's floor{' + zstd' if zstd else ''} + write's kernel floor + its own work",
        f"{us:.0f} us per graph = {fmt:.0f}{f' + {zstd:.0f}' if zstd else ''} + {kernel:.0f} + {us - fmt - zstd - kernel:.0f}",
    )


def user_rate(sample: int) -> float:
    """Graphs/s of the users' per-graph pipeline (one process)."""
    from user_pipeline import UserStyleGenerator

    gen = UserStyleGenerator(0)
    t = time.perf_counter()
    for _ in range(sample):
        gen.generate_pipeline(num_nodes=int(gen.rng.integers(5, 11)))
    return sample / (time.perf_counter() - t)


def _codes(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs or [f"this={ROOT}"]:
        name, _, path = spec.partition("=")
        cli = Path(path) / "cachebuild"
        if not path or not ((cli / "cli.py").exists() or (cli / "cli" / "__main__.py").exists()):  # a module before the house issue, a package since
            raise SystemExit(f"--code {spec!r}: expected NAME=DIR with DIR a cachebuild checkout")
        out[name] = Path(path).resolve()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--config", type=Path, default=None, help="recipe for the limits (default: built-in = configs/causal-users-2026-01-15.toml)")
    ap.add_argument("--out", type=Path, default=Path("/dev/shm/cachebuild-bench-build"), help="build folder (deleted after each build)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--codecs", default="zstd,none")
    ap.add_argument("--packs", default="default", help="records per tar member to build with, comma-separated (interleaved like code trees): 'default' (the build's own choice) or N")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR", help="a code tree to build with (repeat: interleaved); default: this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--user-sample", type=int, default=0, help="graphs timed through the user-style pipeline (0: skip)")
    ap.add_argument("--limit-sample", type=int, default=8192, help="graphs timed for the generation/compression limits")
    quick_defaults(ap, graphs=400, workers=2, rounds=1, limit_sample=256, out=Path("/tmp/cachebuild-bench-build-quick"))
    args = ap.parse_args()

    codes, codecs, cores = _codes(args.code), args.codecs.split(","), args.workers
    packs = args.packs.split(",")
    variants = {(n if p == "default" else f"{n} --pack {p}"): (path, p) for n, path in codes.items() for p in packs}
    table = load_toml(args.config) if args.config else {}
    source = CausalSource(parse_causal_config({k: v for k, v in table.items() if k != "build"}))
    lim = limits(source, args.level, args.limit_sample, tuple(codecs), args.out)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in variants} for c in codecs}
    for r in range(args.rounds):
        for codec in codecs:
            for name in list(variants)[:: 1 if r % 2 == 0 else -1]:  # alternate the order between rounds
                runs[codec][name].append(run_build(*variants[name][:1], args.graphs, codec, cores, args.out, variants[name][1]))
                print(f"round {r + 1} {codec} {name}: {runs[codec][name][-1]}", flush=True)
    rows = [
        ("graphs", f"{args.graphs:,} ({lim['raw_bytes'] / 1e3:.1f} KB raw each), {cores} workers, zstd level {args.level}, out {args.out}"),
        (
            "limits per graph, 1 core",
            f"generation {lim['gen_us']:.0f} us, zstd {lim['zstd_us']:.0f} us, JSON encoding {lim['json_us']:.1f} us; sha256 {lim['sha256_Bps'] / 1e9:.2f} GB/s, crc32 {lim['crc32_Bps'] / 1e9:.2f} GB/s",
        ),
        ("code trees", ", ".join(f"{n} = {p}" for n, p in codes.items())),
    ]
    for codec in codecs:
        rows += codec_rows(codec, runs[codec], lim, args.graphs, cores)
    if args.user_sample:
        u = user_rate(args.user_sample)
        best = min(statistics.median(x["wall"] for x in rs) for rs in runs[codecs[0]].values())
        rows.append(("user-style pipeline graphs/s (1 process); ours / it", f"{u:,.0f}; {args.graphs / best / u:,.1f}x"))
    load = os.getloadavg()
    append("bench_build: build time vs. ideal, before/after", rows, [f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (other work on the machine)"])


if __name__ == "__main__":
    main()
