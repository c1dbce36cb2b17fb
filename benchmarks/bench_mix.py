"""Mixed batches before/after: the loader rows of bench_load (twins) and bench_mel (mel view), old vs new code, interleaved.

Issue 9 replaced the clustered epoch plan (a batch = consecutive items of a
few records) with pools of records whose items are permuted together
(``loaders/pools.py``). This script measures what that costs, on the same
caches, running the relevant readers of ``bench_load.py`` (``ours(...,
"twins", 4096, compact=True)`` and the default keys) and ``bench_mel.py``
(``ours_rate``, the ``mel`` view) from two source trees in alternation
(old, new, old, new, ...; each measurement in a fresh process), so machine
drift hits both alike; plus the users' pipelines once, for the >= 20x check.

    python benchmarks/bench_mix.py --old /tmp/cachebuild-94ce19b --rounds 3

``--old`` is a checkout of the code before the change (``git archive 94ce19b | tar -x -C DIR``).
Each child exits with ``os._exit`` right after printing its result, and a
child with no result after ``seconds + 45`` s is killed and run again: on
both trees a ``mel`` loader with 2 workers whose short epochs are restarted
in a loop (``bench_mel.measure``) sometimes waits forever on its hand-over
thread (``loaders/handover.py``, ``loaders/loader.py``; the table counts
these).
Appends a table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW = HERE.parent

_CHILD = r"""
import json, os, sys
from pathlib import Path
kind, cache, workers, batch, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
if kind == "mel":
    import bench_mel
    d = bench_mel.ours_rate(cache, workers, batch, limit)
elif kind == "mel_user":
    import bench_mel
    d = bench_mel.user_rate(cache, workers, batch, limit)
elif kind == "twins_user":
    import peers
    d = peers.user_pipeline_rate(workers, batch, limit)
else:
    import bench_load
    d = bench_load.ours(cache, "twins", batch, workers, limit, compact=(kind == "twins_compact"))
print("RESULT " + json.dumps(d), flush=True)
os._exit(0)  # skip interpreter shutdown: collecting the measured pass's generator after its workers were stopped can hang (see the module docstring)
"""


HANGS: dict[str, int] = {}
"""Measurements cut by the watchdog and run again, per tree (see the module docstring)."""


def measure(tree: Path, kind: str, cache: Path, workers: int, batch: int, limit: float, tries: int = 4) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'benchmarks'}")
    for _ in range(tries):
        try:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, kind, str(cache), str(workers), str(batch), str(limit)], env=env, cwd=tree, capture_output=True, text=True, check=False, timeout=limit + 45
            )
        except subprocess.TimeoutExpired:
            HANGS[str(tree)] = HANGS.get(str(tree), 0) + 1
            print(f"  {kind} w{workers} in {tree}: no result after {limit + 45:.0f} s, run again", flush=True)
            continue
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            raise RuntimeError(f"{kind} in {tree} failed:\n{out.stderr[-3000:]}")
        return json.loads(line[-1][7:])
    raise RuntimeError(f"{kind} w{workers} in {tree}: no result in {tries} tries")


def _rate(d: dict) -> float:
    for key in ("segments_per_s", "items_per_s", "rows_per_s"):
        if key in d:
            return float(d[key])
    raise KeyError(f"no rate in {sorted(d)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="checkout of the code before the change")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per reader")
    ap.add_argument("--mel-files", type=int, default=5000)
    ap.add_argument("--graphs", type=int, default=5000)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    sys.path[:0] = [str(NEW), str(HERE)]
    import bench_mel
    from _results import append
    from cachebuild.jobs import run_causal_build

    t0 = time.time()
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-mix-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        h5 = work / "user.h5"
        bench_mel.write_user_h5(h5, args.mel_files)
        caches = {"mel raw": bench_mel.build(h5, work / "mel-none", "none") and work / "mel-none", "mel zstd": bench_mel.build(h5, work / "mel-zstd", "zstd") and work / "mel-zstd"}
        causal = work / "causal"
        run_causal_build(None, [], {"graphs": args.graphs}, causal, progress=False)
        cases = [("mel", caches["mel raw"], w, 8192, f"mel view raw, batch 8192, w{w}") for w in (0, 2)]
        cases += [("mel", caches["mel zstd"], 2, 8192, "mel view zstd, batch 8192, w2"), ("mel", caches["mel raw"], 2, 1024, "mel view raw, batch 1024, w2")]
        cases += [("twins_compact", causal, w, 4096, f"twins compact zstd, 4096 rows, w{w}") for w in (0, 2)]
        cases += [("twins", causal, 2, 4096, "twins default keys zstd, 4096 rows, w2")]
        runs: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for kind, cache, w, batch, label in cases:
                for name, tree in (("old", args.old), ("new", NEW)) if r % 2 == 0 else (("new", NEW), ("old", args.old)):
                    v = _rate(measure(tree, kind, cache, w, batch, args.seconds))
                    runs.setdefault((label, name), []).append(v)
                    print(f"round {r} {name} {label}: {v:,.0f}/s", flush=True)
        user_mel = _rate(measure(NEW, "mel_user", h5, 2, 8192, args.seconds))
        user_twins = _rate(measure(NEW, "twins_user", causal, 2, 4096, args.seconds))
        rows = []
        for _, _, _, _, label in cases:
            old, new = statistics.median(runs[(label, "old")]), statistics.median(runs[(label, "new")])
            rows.append(
                (
                    label,
                    f"old {old:,.0f}/s, new {new:,.0f}/s: {new / old:.2f}x "
                    f"(runs old {', '.join(f'{v:,.0f}' for v in runs[(label, 'old')])}; new {', '.join(f'{v:,.0f}' for v in runs[(label, 'new')])})",
                )
            )
        best_mel = max(statistics.median(runs[(c[4], "new")]) for c in cases if c[0] == "mel" and c[3] == 8192)
        best_twins = max(statistics.median(runs[(c[4], "new")]) for c in cases if c[0] == "twins_compact")
        rows += [
            ("users' HDF5 per-item mel Dataset, batch 8192, w2", f"{user_mel:,.0f} segments/s; new mel view best {best_mel / user_mel:,.0f}x (target >= 20x)"),
            ("users' per-row causal pipeline, 4096 rows, w2", f"{user_twins:,.0f} rows/s; new twins compact best {best_twins / user_twins:,.0f}x (target >= 20x here; bench_load's >= 300x)"),
        ]
        if not args.no_record:
            append(
                "bench_mix: mixed batches (issue 9), old plan vs new, interleaved",
                rows,
                [
                    f"old = {args.old} (commit 94ce19b, clustered plan), new = this tree (pools of 1,024 records, mel chunk 1, twins chunk 8)",
                    f"{args.rounds} rounds alternating old/new, {args.seconds:.0f} s per reader after warm-up, each in a fresh process; medians",
                    f"measurements that hung and were run again: old {HANGS.get(str(args.old), 0)}, new {HANGS.get(str(NEW), 0)}",
                    f"data: {args.mel_files} mel files (bench_mel's users' HDF5 layout) built raw and zstd, {args.graphs} causal graphs (default recipe, zstd); work folder {work}",
                    f"total {time.time() - t0:.0f} s; load average at start {tuple(round(x, 2) for x in load0)}, at end {tuple(round(x, 2) for x in os.getloadavg())} (2 cores shared with other processes)",
                ],
            )
        else:
            for k, v in rows:
                print(f"{k}: {v}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
