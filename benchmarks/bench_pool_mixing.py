"""How well pooled ``records`` batches mix on a cache sorted by label (issue 15 small records; fidelity).

The pooled read (``ShardStream(view="records", mix=...)`` over shared frames,
``build.share=65536``) keeps each zstd frame's records together and draws a
batch from a pool of frames. Where neighbouring records are alike (the users'
label-sorted HDF5 files and WAV folders), that could change what a batch holds.
This builds ``--records`` small records (ragged int32 tokens of 50..500 and an
int16 label, the labels in ``--labels`` sorted runs), reads one epoch per plan
(the default, ``mix=None``: a full shuffle; ``mix="auto"``; smaller pools) and
prints, per plan, the per-batch share of label 0: its standard deviation against
independent draws' (binomial), its range, and the fewest labels in a batch.

    python benchmarks/bench_pool_mixing.py
    python benchmarks/bench_pool_mixing.py --records 200000 --mixes auto,16384

Appends a table to benchmarks/RESULTS.md (not in quick mode, ``BENCH_QUICK=1``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import append, quick_defaults  # noqa: E402

from cachebuild import FunctionSource, build  # noqa: E402
from loaders import ShardStream  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--labels", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--mixes", default="auto,8192,4096", help="pooled plans to measure besides the default (comma-separated: auto or records per pool)")
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/cachebuild-bench-pool-mixing"))
    quick_defaults(ap, records=3000, mixes="auto,512", root=Path("/dev/shm/cachebuild-bench-pool-mixing-quick"))
    return ap.parse_args()


def sorted_tokens(records: int, labels: int) -> FunctionSource:
    """Token sequences whose label is ``index * labels // records``: one label's records, then the next's."""

    def record(rng: np.random.Generator, index: int) -> dict[str, Any]:
        n = int(rng.integers(50, 501))
        return {"tok": rng.integers(0, 32_000, n).astype(np.int32), "lab": np.array(index * labels // records, np.int16)}

    return FunctionSource.per_record(record, {"tok": "int32", "lab": "int16"})


def label_shares(root: Path, batch: int, mix: Any) -> tuple[np.ndarray, int, int | None]:
    """Share of label 0 in every full batch of epoch 0, the fewest labels a batch held, and the pool size."""
    stream = ShardStream(root, view="records", batch_size=batch, seed=0, **({} if mix is None else {"mix": mix}))
    shares, fewest = [], 1 << 30
    for b in stream:
        lab = b["lab"][~b["is_pad"]].numpy()
        if len(lab) == batch:
            shares.append(float((lab == 0).mean()))
            fewest = min(fewest, len(np.unique(lab)))
    return np.array(shares), fewest, getattr(stream.view, "mix", None)


def main() -> None:
    args = parse_args()
    t0 = time.time()
    shutil.rmtree(args.root, ignore_errors=True)
    try:
        build(sorted_tokens(args.records, args.labels), args.root, records=args.records, share=65536, progress=False)
        p = 1 / args.labels
        binomial = np.sqrt(p * (1 - p) / args.batch)
        rows = [("independent draws (binomial): sd of the per-batch label-0 share", f"{binomial:.4f}")]
        for text in ["default", *args.mixes.split(",")]:
            mix = None if text == "default" else text if text == "auto" else int(text)
            share, fewest, pool = label_shares(args.root, args.batch, mix)
            name = "mix=None (default: full shuffle)" if mix is None else f"mix={mix!r} ({pool:,} records a pool)"
            rows.append((name, f"sd {share.std():.4f} ({share.std() / binomial:.2f}x binomial), range {share.min():.3f}-{share.max():.3f}, fewest labels in a batch {fewest} of {args.labels}"))
            print(f"{name}: {rows[-1][1]}", flush=True)
    finally:
        shutil.rmtree(args.root, ignore_errors=True)
    notes = [
        f"{args.records:,} records (ragged int32 tokens of 50..500 + int16 label), labels in {args.labels} sorted runs, built with build.share=65536; batch {args.batch}, epoch 0, seed 0",
        f"total {time.time() - t0:.0f} s",
    ]
    append("bench_pool_mixing: per-batch label share on a label-sorted cache, pooled records reads vs the default", rows, notes)


if __name__ == "__main__":
    main()
