"""Beyond one machine: the Dask build backend vs loky, and the loader over HTTP vs local disk.

Measures in one run:
  (a) build throughput of one recipe with 2 workers: joblib's loky backend vs a Dask
      LocalCluster (2 worker processes on 127.0.0.1), cluster start included; target:
      Dask within 1.2x of loky;
  (b) loader throughput (``graphs`` view, batch 256, 2 DataLoader workers, zstd cache)
      from local disk vs from a loopback HTTP server through the bounded local shard
      cache: a cold first epoch (local cache empty) and a warm second epoch; target:
      warm within 1.5x of local; and the time to the first batch, cold (stream
      construction with the manifest fetch included); target < 2 s.
Appends the numbers to benchmarks/RESULTS.md.

    python benchmarks/bench_remote.py --build-graphs 20000 --load-graphs 5000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from _results import append, quick_defaults  # noqa: E402
from remote_fixtures import serve_folder  # noqa: E402

from cachebuild.format.manifest import read_manifest  # noqa: E402
from cachebuild.jobs import run_causal_build  # noqa: E402


def build(out: Path, graphs: int, shard_mb: float, backend: str, workers: int, address: str | None = None) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    summary = run_causal_build(None, [], {"graphs": graphs, "build.shard_mb": shard_mb}, out, workers=workers, backend=backend, address=address, progress=False)
    return time.perf_counter() - t, summary.shards


def epoch(loader, n: int | None = None) -> tuple[float, int, float]:
    """(seconds, real graphs, seconds to the first batch) of one pass."""
    t = time.perf_counter()
    first = None
    graphs = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t
        graphs += int((~batch["is_pad"]).sum())
    return time.perf_counter() - t, graphs, first or 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-graphs", type=int, default=20_000)
    ap.add_argument("--build-shard-mb", type=float, default=32.0, help="small enough for >= 8 shards")
    ap.add_argument("--build-workers", type=int, default=2)
    ap.add_argument("--load-graphs", type=int, default=5_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="loader passes per source (the first remote one is cold)")
    ap.add_argument("--skip-build", action="store_true")
    quick_defaults(ap, build_graphs=600, build_shard_mb=0.5, load_graphs=300, epochs=2)
    args = ap.parse_args()

    from loaders import ShardStream, make_loader
    from loaders.remote import RemoteOptions

    work = Path(tempfile.mkdtemp(prefix="bench-remote-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    rows: list[tuple[str, str]] = []
    notes: list[str] = []
    load0 = os.getloadavg()
    t_all = time.perf_counter()
    try:
        # (a) build backends
        if not args.skip_build:
            import distributed

            results: dict[str, list[float]] = {}
            with distributed.LocalCluster(n_workers=args.build_workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as cluster:
                for _ in range(3):  # interleaved, best of three: the machine is shared
                    for key, backend, address in (("loky", "loky", None), ("dask", "dask", None), ("dask-running", "dask", cluster.scheduler_address)):
                        wall, shards = build(work / f"b-{key}", args.build_graphs, args.build_shard_mb, backend, args.build_workers, address)
                        results.setdefault(key, []).append(wall)
                        if key == "dask-running":
                            shutil.rmtree(work / f"b-{key}")
            same = sorted(p.name for p in (work / "b-loky").iterdir()) == sorted(p.name for p in (work / "b-dask").iterdir())
            loky, dask, running = min(results["loky"]), min(results["dask"]), min(results["dask-running"])
            g = args.build_graphs
            rows += [
                ("(a) recipe", f"{g:,} causal graphs, build.shard_mb {args.build_shard_mb:g} -> {shards} shards, {args.build_workers} workers, zstd"),
                ("(a) loky build", f"{loky:.1f} s, {g / loky:,.0f} graphs/s (runs: {', '.join(f'{x:.1f}' for x in results['loky'])} s)"),
                ("(a) dask build (LocalCluster start included)", f"{dask:.1f} s, {g / dask:,.0f} graphs/s (runs: {', '.join(f'{x:.1f}' for x in results['dask'])} s)"),
                (
                    "(a) dask build on a running 2-worker LocalCluster (--scheduler ADDRESS)",
                    f"{running:.1f} s, {g / running:,.0f} graphs/s (runs: {', '.join(f'{x:.1f}' for x in results['dask-running'])} s)",
                ),
                ("(a) dask / loky wall time: running cluster; cluster started by the build", f"{running / loky:.2f}x; {dask / loky:.2f}x (target <= 1.2x){'' if same else '; FILE LISTS DIFFER'}"),
            ]
            for b in ("b-loky", "b-dask"):
                shutil.rmtree(work / b, ignore_errors=True)

        # (b) loader: local vs loopback HTTP
        cache = work / "cache"
        run_causal_build(None, [], {"graphs": args.load_graphs}, cache, workers=2, progress=False)
        m = read_manifest(cache)
        size = sum(s.bytes + s.index_bytes for s in m.shards)
        kw = dict(view="graphs", batch_size=args.batch, shuffle=True, seed=0)

        local = make_loader(ShardStream(cache, **kw), num_workers=args.workers, pin_memory=False)
        local_runs = []
        for e in range(args.epochs):
            local.set_epoch(e)
            local_runs.append(epoch(local))
        del local

        opts = RemoteOptions(cache_dir=str(work / "local"), cache_limit_bytes=2 * size, prefetch=2, timeout_s=10, retries=2)
        with serve_folder(cache) as (url, _):
            t = time.perf_counter()
            stream = ShardStream(url, remote=opts, **kw)
            loader = make_loader(stream, num_workers=args.workers, pin_memory=False)
            setup = time.perf_counter() - t
            remote_runs = []
            for e in range(args.epochs):
                loader.set_epoch(e)
                remote_runs.append(epoch(loader))
            del loader
        local_s = min(r[0] for r in local_runs[1:] or local_runs)
        graphs = local_runs[0][1]
        cold, warm = remote_runs[0][0], min(r[0] for r in remote_runs[1:] or remote_runs)
        first_cold = setup + remote_runs[0][2]
        rows += [
            ("(b) cache", f"{m.records:,} graphs, {len(m.shards)} shards, {size / 1e6:.0f} MB zstd; batch {args.batch}, {args.workers} workers, graphs view"),
            ("(b) local disk, warm epoch", f"{graphs / local_s:,.0f} graphs/s ({local_s:.2f} s; first epoch {local_runs[0][0]:.2f} s, first batch {local_runs[0][2]:.2f} s)"),
            ("(b) HTTP loopback, cold first epoch", f"{graphs / cold:,.0f} graphs/s ({cold:.2f} s)"),
            ("(b) HTTP loopback, warm epoch (local shard cache)", f"{graphs / warm:,.0f} graphs/s ({warm:.2f} s)"),
            ("(b) local / HTTP warm throughput", f"{warm / local_s:.2f}x (target <= 1.5x)"),
            ("(b) local / HTTP cold throughput", f"{cold / local_s:.2f}x"),
            ("(b) time to first batch, cold (stream + loader + manifest + first shards)", f"{first_cold:.2f} s (target < 2 s)"),
        ]
        notes += [
            f"work folder {work} (tmpfs); HTTP: the standard library's ThreadingHTTPServer on 127.0.0.1 serving the cache; "
            f"local shard cache in the work folder, limit {2 * size / 1e6:.0f} MB, prefetch 2",
            f"epochs per source {args.epochs}; persistent workers; 'warm' is the best non-first epoch",
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes.append(
        f"total {time.perf_counter() - t_all:.0f} s; load average at start {tuple(round(x, 2) for x in load0)}, "
        f"at end {tuple(round(x, 2) for x in os.getloadavg())} (2 cores shared with other processes)"
    )
    append("bench_remote: Dask build backend, loader over HTTP", rows, notes)


if __name__ == "__main__":
    main()
