"""Does the trainer wait? Wait fraction of our loader vs. the users' pipelines, with a GPU-like consumer.

On a CPU-only machine a GPU step is modelled by a consumer that sleeps ``--step-ms``
per batch (default 20 ms: the CPU is free meanwhile, as it is while a GPU computes).
20 ms is a generous step for the example models (the twins MLP and the mel CNN take
~1-5 ms per batch on a data-centre GPU), so the baselines get more time to keep up
than they would on a GPU; the step time of each example model on this CPU is printed
for reference. Everything is measured with ``loaders.monitor.StallMonitor`` (one
warm-up step left out), through ``loaders.bench``'s drain loop:

* causal: our ``twins`` view (compact, ``--batch`` twin rows) and ``graphs`` view
  (``--graph-batch`` graphs) with 1 and 2 workers vs. the users' on-the-fly pipeline
  (``benchmarks/user_pipeline.py``: ``UserStyleCausalDataset`` + ``collate_fn_pad``,
  ``--batch`` rows, 1 and 2 workers). Targets: ours < 2 %, baseline > 50 %.
* mel: our ``mel`` view vs. the users' HDF5 per-item Dataset (``bench_mel.UserSegmentDataset``,
  ``shuffle=True``, default collate) on the same files, same batch and step time.
* floor: the same consumer on an in-memory iterator that only copies a batch-sized
  buffer: what the machine itself costs (scheduling on shared cores), not any loader.

    python benchmarks/bench_feed.py                    # ~3 minutes on 2 cores
    python benchmarks/bench_feed.py --seconds 3 --no-record   # quick look

Appends to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
from _results import append, quick_defaults  # noqa: E402

from loaders.bench import drain as bench_drain, run_bench  # noqa: E402
from loaders.loader import shutdown_workers  # noqa: E402
from cachebuild.jobs import run_causal_build, run_mel_build  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_feed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sleeper(step_ms: float):
    s = step_ms / 1e3
    return lambda batch: time.sleep(s)


def drain(loader, count, step_ms: float, seconds: float) -> dict:
    try:
        sm, n = bench_drain(lambda epoch: loader, count, sleeper(step_ms), seconds, None)
    finally:
        shutdown_workers(loader)
    return {
        "wait_fraction": sm.wait_fraction,
        "samples_per_s": sm.samples_per_s or 0.0,
        "first_batch_s": sm.first_batch_s or 0.0,
        "wait_p95_ms": sm.wait_p95_ms,
        "batches": n,
        "wait_ms": sm.wait_s / max(1, sm.steps) * 1e3,
    }


def floor(step_ms: float, seconds: float, nbytes: int) -> dict:
    """The consumer on an iterator that only copies a buffer of ``nbytes`` (one numpy memcpy, as the
    loader's main process does per batch): the machine's own cost, no loader, no IPC."""
    src, dst = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)

    def gen():
        while True:
            np.copyto(dst, src)
            yield {"x": dst}

    sm, n = bench_drain(lambda epoch: gen(), lambda b: 1, sleeper(step_ms), seconds, None)
    return {"wait_fraction": sm.wait_fraction, "wait_p95_ms": sm.wait_p95_ms, "batches": n, "wait_ms": sm.wait_s / max(1, sm.steps) * 1e3}


def baseline_causal(batch: int, workers: int, step_ms: float, seconds: float) -> dict:
    from user_pipeline import UserStyleCausalDataset, collate_fn_pad

    loader = torch.utils.data.DataLoader(UserStyleCausalDataset(max_nodes=10, seed=0), batch_size=batch, collate_fn=collate_fn_pad, num_workers=workers, persistent_workers=workers > 0)
    return drain(loader, lambda b: len(b["target_row"]), step_ms, seconds)


def baseline_mel(h5: Path, batch: int, workers: int, step_ms: float, seconds: float) -> dict:
    from bench_mel import UserSegmentDataset

    loader = torch.utils.data.DataLoader(UserSegmentDataset(h5), batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    return drain(loader, lambda b: len(b[1]), step_ms, seconds)


def model_step_ms(kind: str, batch: int, repeats: int = 5) -> float:
    """CPU ms per training step of an example model at ``batch`` (forward + backward + AdamW)."""
    torch.manual_seed(0)
    if kind == "twins":
        from train_causal import TwinMLP

        n = 10
        model = TwinMLP(n)
        args = (torch.randn(batch, n), torch.zeros(batch, n), torch.randn(batch), torch.randn(batch, 2 * n + n * n))
        target = torch.randn(batch, n)
    else:
        from train_mel import MelCNN

        model = MelCNN()
        args = (torch.randn(batch, 1, 64, 1),)
        target = torch.rand(batch)
    opt = torch.optim.AdamW(model.parameters())

    def step():
        out = model(*args)
        loss = ((out - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    t = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - t) / repeats * 1e3


def pct(x: float) -> str:
    return f"{x:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=3000, help="graphs in the causal cache")
    ap.add_argument("--files", type=int, default=2000, help="files in the mel cache / the users' HDF5")
    ap.add_argument("--batch", type=int, default=4096, help="twin rows per batch (ours twins and the causal baseline)")
    ap.add_argument("--graph-batch", type=int, default=32, help="graphs per batch of our graphs view")
    ap.add_argument("--mel-batch", type=int, default=4096, help="segments per batch (ours mel and the users' Dataset)")
    ap.add_argument("--step-ms", type=float, default=20.0, help="the consumer's step time (a GPU step that frees the CPU)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per measurement")
    ap.add_argument("--work", default=None, help="work folder (default: a fresh one in /dev/shm)")
    ap.add_argument("--no-record", action="store_true", help="do not append to RESULTS.md")
    quick_defaults(ap, graphs=200, files=40, batch=1024, graph_batch=16, mel_batch=1024, step_ms=5.0, seconds=0.5)
    args = ap.parse_args()

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-feed-", dir=base))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    t_all = time.perf_counter()
    try:
        log(f"building caches in {work}")
        causal = work / "causal"
        run_causal_build(None, [], {"graphs": args.graphs, "build.shard_mb": 32}, causal, workers=2, progress=False)
        from bench_mel import write_user_h5

        h5 = work / "user.h5"
        write_user_h5(h5, args.files)
        mel = work / "mel"
        run_mel_build(None, [], {}, mel, from_h5=h5, workers=2, progress=False)

        S, sec = args.step_ms, args.seconds
        rows: list[tuple[str, str]] = []
        res: dict[str, dict] = {}

        def ours(key: str, cache: Path, view: str, batch: int, workers: int) -> None:
            log(f"ours {key}")
            r = run_bench(cache, view=view, batch_size=batch, workers=workers, seconds=sec, step_ms=S, sample=2)
            res[key] = {
                "wait_fraction": r.wait_fraction,
                "samples_per_s": r.samples_per_s,
                "first_batch_s": r.first_batch_s,
                "wait_p95_ms": r.wait_p95_ms,
                "batches": r.batches,
                "wait_ms": r.wait_fraction * r.wall_s / max(1, r.batches - 1) * 1e3,
            }

        res["floor"] = floor(S, sec, 1_300_000)
        for w in (1, 2):
            ours(f"twins w{w}", causal, "twins", args.batch, w)
            ours(f"graphs w{w}", causal, "graphs", args.graph_batch, w)
            log(f"baseline causal w{w}")
            res[f"user causal w{w}"] = baseline_causal(args.batch, w, S, sec)
            ours(f"mel w{w}", mel, "mel", args.mel_batch, w)
            log(f"baseline mel w{w}")
            res[f"user mel w{w}"] = baseline_mel(h5, args.mel_batch, w, S, sec)

        def line(key: str, unit: str) -> str:
            r = res[key]
            return (
                f"wait {pct(r['wait_fraction'])} ({r['wait_ms']:.2f} ms/step, p95 {r['wait_p95_ms']:.1f} ms), {r['samples_per_s']:,.0f} {unit}/s, "
                f"first batch {r['first_batch_s']:.2f} s, {r['batches']} batches"
            )

        fl = res["floor"]
        rows.append((f"floor: in-memory iterator, one 1.3 MB numpy copy per step, {S:g} ms consumer", f"wait {pct(fl['wait_fraction'])} ({fl['wait_ms']:.2f} ms/step, p95 {fl['wait_p95_ms']:.1f} ms)"))
        for w in (1, 2):
            rows.append((f"ours `twins` compact, batch {args.batch} rows, {w} worker(s)", line(f"twins w{w}", "rows")))
            rows.append((f"ours `graphs`, batch {args.graph_batch} graphs, {w} worker(s)", line(f"graphs w{w}", "graphs")))
            rows.append((f"users' on-the-fly causal pipeline, batch {args.batch} rows, {w} worker(s)", line(f"user causal w{w}", "rows")))
        for w in (1, 2):
            rows.append((f"ours `mel`, batch {args.mel_batch} segments, {w} worker(s)", line(f"mel w{w}", "segments")))
            rows.append((f"users' HDF5 per-item Dataset, batch {args.mel_batch} segments, {w} worker(s)", line(f"user mel w{w}", "segments")))
        best_ours = min(res[k]["wait_fraction"] for k in res if k.startswith(("twins", "graphs")))
        best_user = min(res[k]["wait_fraction"] for k in res if k.startswith("user causal"))
        rows.append(("causal: best ours / best baseline wait (targets < 2% / > 50%)", f"{pct(best_ours)} / {pct(best_user)}"))
        best_mel = min(res[k]["wait_fraction"] for k in res if k.startswith("mel"))
        best_umel = min(res[k]["wait_fraction"] for k in res if k.startswith("user mel"))
        rows.append(("mel: best ours / best users' Dataset wait", f"{pct(best_mel)} / {pct(best_umel)}"))
        twin_ms, cnn_ms = model_step_ms("twins", args.batch), model_step_ms("mel", args.mel_batch)
        notes = [
            f"consumer: time.sleep({S:g} ms) per batch, standing in for a GPU step (no GPU was lent: CPU only); {sec:g} s per measurement after 1 warm-up step",
            f"example models on this CPU (forward+backward+AdamW, 1 process): TwinMLP at {args.batch} rows {twin_ms:.1f} ms/step, MelCNN at {args.mel_batch} segments {cnn_ms:.1f} ms/step; on a GPU both take a few ms, so {S:g} ms favours the baselines",
            f"data: {args.graphs} graphs (default recipe, zstd), {args.files} mel files (bench_mel's users' HDF5 layout, raw-codec cache built from it); work folder {work}",
            f"total {time.perf_counter() - t_all:.0f} s; load average at start {tuple(round(x, 2) for x in load0)}, at end {tuple(round(x, 2) for x in os.getloadavg())} "
            f"({os.cpu_count()} cores shared with other processes: the floor row is the machine's own noise)",
        ]
        if args.no_record:
            for k, v in rows:
                print(f"| {k} | {v} |")
            for n in notes:
                print(f"- {n}")
        else:
            append("Feeding the GPU: wait fraction with a GPU-like consumer (bench_feed)", rows, notes)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
