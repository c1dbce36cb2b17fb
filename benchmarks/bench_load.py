"""Loader throughput vs. peers, baselines and the decompression limit, on the same records.

In one run, on one causal cache built by `cachebuild generate` (zstd and raw
variants, in /dev/shm), with 0 and 2 workers:
  - ours: graphs view (graphs/s, payload MB/s, first batch, peak RSS per worker;
    default delta="auto" = computed as int - base for causal caches), the same
    view reading the stored delta, and twins compact (rows/s);
  - WebDataset on our shards (per-sample decode, batched), LitData on the same
    records (`litdata.optimize`, zstd and none; bench extra), vectorised on-the-fly
    generation, and the users' per-row pipeline;
  - the limit: zstd decompression + one copy of the same bytes on all cores;
  - resume: `load_state_dict` in a fresh loader to its first batch.
Appends a table to benchmarks/RESULTS.md.

    python benchmarks/bench_load.py --graphs 5000 --seconds 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))
import peers  # noqa: E402
from _results import append, quick_defaults  # noqa: E402

from cachebuild.format import load_index, read_manifest  # noqa: E402
from cachebuild.jobs import run_causal_build  # noqa: E402
from loaders import ShardStream, make_loader  # noqa: E402
from loaders.loader import shutdown_workers  # noqa: E402


class RssWatch:
    """Peak memory of this process's children (DataLoader workers), sampled: RSS (which counts
    the mmapped shard pages they touched) and USS (their private memory)."""

    def __init__(self) -> None:
        self.peak = 0
        self.peak_uss = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.25):
            for c in me.children(recursive=True):
                try:
                    info = c.memory_full_info()
                    self.peak = max(self.peak, info.rss)
                    self.peak_uss = max(self.peak_uss, info.uss)
                except psutil.Error:
                    pass

    def __enter__(self) -> "RssWatch":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def payload_per_record(cache: Path, fields: list[str]) -> float:
    """Mean decoded array bytes per record for ``fields`` (from the indexes)."""
    m = read_manifest(cache)
    cols = [m.field_names.index(f) for f in fields]
    total = sum(int(load_index(cache / s.index)["nbytes"][:, cols].sum()) for s in m.shards)
    return total / m.records


def ours(cache: Path, view: str, batch: int, workers: int, limit_s: float, **opts) -> dict:
    per_graph = payload_per_record(cache, ["adj", "base", "int", "delta", "targets", "values"])

    def make():
        return make_loader(ShardStream(cache, view=view, batch_size=batch, seed=0, **opts), num_workers=workers)

    def count(b):
        real = int((~b["is_pad"]).sum())
        return real, int(real * per_graph) if view == "graphs" else 0

    with RssWatch() as rss:
        m = peers._measure(make, count, limit_s, peers._warmup(workers))
    unit = "graphs" if view == "graphs" else "rows"
    return {f"{unit}_per_s": m["items_per_s"], "payload_mb_per_s": m["mb_per_s"], "first_batch_s": m["first_batch_s"], "worker_rss_mb": rss.peak / 1e6, "worker_uss_mb": rss.peak_uss / 1e6}


def ours_pool(cache: Path, batch: int, workers: int, limit_s: float, **context: Any) -> dict:
    """``twins`` with ``compact="pool"``: rows/s of the batches delivered *plus* the consumer's context
    loading (``TwinsContext.load`` of every batch, on the CPU: the pools decoded in this process, ahead
    on its thread), without ``expand``, as ``compact=True`` is measured without ``expand_compact``."""
    from loaders import TwinsContext

    contexts: list[TwinsContext] = []

    def make():
        loader = make_loader(ShardStream(cache, view="twins", batch_size=batch, seed=0, compact="pool"), num_workers=workers)
        contexts.append(TwinsContext(loader, **context))
        return loader

    def count(b):
        contexts[-1].load(b)
        return int((~b["is_pad"]).sum()), 0

    try:
        with RssWatch() as rss:
            m = peers._measure(make, count, limit_s, peers._warmup(workers))
    finally:
        for c in contexts:
            c.close()
    return {"rows_per_s": m["items_per_s"], "first_batch_s": m["first_batch_s"], "pools_loaded": contexts[-1].loads, "worker_rss_mb": rss.peak / 1e6}


def expand_times(cache: Path, batch: int, repeats: int = 15) -> dict:
    """Median CPU seconds of ``TwinsContext.expand`` (its pools held) vs ``expand_compact`` for batch 1 of epoch 0."""
    import statistics

    from loaders import TwinsContext, expand_compact

    pool = ShardStream(cache, view="twins", batch_size=batch, seed=0, compact="pool")
    pb, cb = pool.batch(1), ShardStream(cache, view="twins", batch_size=batch, seed=0, compact=True).batch(1)
    out = {}
    with TwinsContext(pool, prefetch=False) as ctx:
        ctx.load(pb)
        for name, fn in (("pool_expand_s", lambda: ctx.expand(pb)), ("compact_expand_s", lambda: expand_compact(cb))):
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            out[name] = statistics.median(times)
    return out


def resume_time(cache: Path, workers: int) -> float:
    """Seconds from a fresh loader's load_state_dict to its first batch (cut after 10 batches)."""
    a = make_loader(ShardStream(cache, view="graphs", batch_size=256, seed=0), num_workers=workers)
    it = iter(a)
    for _ in range(max(1, min(10, len(a) // 2))):
        next(it)
    state = a.state_dict()
    shutdown_workers(a)
    t = time.perf_counter()
    b = make_loader(ShardStream(cache, view="graphs", batch_size=256, seed=0), num_workers=workers)
    b.load_state_dict(state)
    next(iter(b))
    dt = time.perf_counter() - t
    shutdown_workers(b)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=6.0, help="measuring time per reader")
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/cachebuild-bench-load"))
    ap.add_argument("--skip-litdata", action="store_true")
    ap.add_argument("--user-batch", type=int, default=4096, help="twin rows per batch of the users' per-row pipeline")
    # quick: the users' pipeline makes every row in Python (~5,000 rows/s a core): 512-row batches keep its warm-up short
    quick_defaults(ap, graphs=300, seconds=0.3, skip_litdata=True, user_batch=512, root=Path("/dev/shm/cachebuild-bench-load-quick"))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    shutil.rmtree(args.root, ignore_errors=True)
    caches = {}
    for codec in ("zstd", "none"):
        caches[codec] = args.root / codec
        run_causal_build(None, [], {"graphs": args.graphs, "build.codec": codec}, caches[codec], progress=False)
    rows: list[tuple[str, str]] = []
    res: dict[str, dict] = {}
    lim = args.seconds

    def rec(name: str, d: dict) -> dict:
        res[name] = d
        print(f"{name:<42} {peers._fmt(d)}", flush=True)
        return d

    for codec, cache in caches.items():
        for w in (0, 2):
            rec(f"ours graphs {codec} w{w}", ours(cache, "graphs", 256, w, lim))
            rec(f"ours graphs stored-delta {codec} w{w}", ours(cache, "graphs", 256, w, lim, delta="stored"))
            rec(f"ours twins compact {codec} w{w}", ours(cache, "twins", 4096, w, lim, compact=True))
            if peers.installed("webdataset"):
                rec(f"webdataset {codec} w{w}", peers.webdataset_rate(cache, w, 256, lim))
    if not args.skip_litdata:
        try:
            for comp in ("zstd", None):
                opt = peers.litdata_prepare(caches["zstd"], args.root / f"litdata-{comp}", comp)
                for w in (0, 2):
                    rec(f"litdata {comp or 'none'} w{w}", peers.litdata_rate(opt, w, 256, lim))
                # LitData's default window decoding can stall with workers + shuffle: also its per-sample mode
                rec(f"litdata {comp or 'none'} w2 batch_decode=False", peers.litdata_rate(opt, 2, 256, lim, batch_decode=False))
        except ImportError as exc:
            print(f"litdata not installed ({exc}); skipped")
    rec("on-the-fly vectorised w2", peers.onthefly_vectorised_rate(2, 256, lim))
    for w in (0, 2):
        rec(f"users' per-row pipeline w{w}", peers.user_pipeline_rate(w, args.user_batch, lim))
    limit = rec("zstd limit", peers.decompression_limit(caches["zstd"], cores))
    for w in (0, 2):
        res[f"resume w{w}"] = {"s": resume_time(caches["zstd"], w)}
        print(f"resume w{w}: {res[f'resume w{w}']['s']:.3f} s")

    def best(prefix: str, key: str) -> float:
        vals = [d[key] for n, d in res.items() if n.startswith(prefix) and key in d]
        return max(vals) if vals else float("nan")

    for name, d in res.items():
        rows.append((name, peers._fmt(d)))
    ours_z, ours_r = best("ours graphs zstd", "graphs_per_s"), best("ours graphs none", "graphs_per_s")
    lit_z, lit_n = best("litdata zstd", "graphs_per_s"), best("litdata none", "graphs_per_s")
    fly = best("on-the-fly", "graphs_per_s")
    user_rows = best("users' per-row", "rows_per_s")
    twins = best("ours twins compact", "rows_per_s")
    mb = best("ours graphs zstd", "payload_mb_per_s")
    rows += [
        ("ratio: ours graphs/s vs LitData, zstd", f"{ours_z / lit_z:.2f}x (target >= 2x)"),
        ("ratio: ours graphs/s (raw) vs LitData (none)", f"{ours_r / lit_n:.2f}x (target >= 2x)"),
        ("ratio: ours graphs/s vs on-the-fly vectorised", f"{ours_z / fly:.2f}x zstd, {ours_r / fly:.2f}x raw (target >= 3x)"),
        ("ratio: ours payload MB/s vs zstd limit (all cores)", f"{mb / limit['mb_per_s_all']:.0%} (target >= 75%)"),
        ("ratio: twins compact rows/s vs users' pipeline", f"{twins / user_rows:,.0f}x (target >= 300x)"),
        ("first batch (ours, worst)", f"{max(d['first_batch_s'] for n, d in res.items() if n.startswith('ours')):.3f} s (target < 0.5 s)"),
        ("resume to first batch (worst)", f"{max(res['resume w0']['s'], res['resume w2']['s']):.3f} s (target < 1 s)"),
    ]
    append(
        f"bench_load: {args.graphs} causal graphs in /dev/shm",
        rows,
        [f"{lim:.0f} s per reader; graphs view batch 256, twins batch 4096 rows, users' pipeline batch {args.user_batch} rows; best of 0/2 workers in the ratios"],
    )
    shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
