"""The feeding path on a real CUDA GPU: H2D bandwidth, copy/compute overlap, trainers' wait and utilisation.

    python benchmarks/bench_gpu.py --out gpu.json --md gpu.md      # ~6.5 minutes on a 16-core H100 machine (2 and 8 workers)
    python benchmarks/bench_gpu.py --quick                         # a short look (2 worker counts, 4 s runs)
    make gpu-check                                                 # the gpu tests, then this, one results file

Sections (each runs on its own; a failure is recorded and the next one runs):

* ``h2d``: host-to-device bandwidth of our pinned batches (``loaders.device.move``: one copy of the
  packed buffer) vs ``torch.empty(..., pin_memory=True)`` copied with ``copy_`` (the same bytes) vs
  pageable memory, for the ``twins`` (compact and full rows), ``graphs`` and ``mel`` views.
* ``overlap``: ``to_device`` over pinned full-row ``twins`` batches with a ~3 ms compute step: the
  wall time of N steps vs the step alone, the copy alone and copy-then-step on one stream, and a
  profiler trace: the share of H2D copy time that ran while a compute kernel ran.
* ``trainers``: ``examples/train_causal.py`` and ``examples/train_mel.py``, ours and ``--baseline``, with
  2 and 8 DataLoader workers (``--workers 2,4,8,12`` for the whole sweep): wait fraction, mean GPU utilisation (NVML, sampled every 0.2 s),
  samples/s; the model's step alone on a GPU-resident batch for reference.
* ``expand``: ``twins`` rows/s end to end on the GPU, compact + ``expand_compact`` vs the full-row view.
* ``bench_cli``: ``cachebuild bench --consumer model`` (the CLI's own GPU consumer).

Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import faulthandler
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "examples"))


def log(msg: str) -> None:
    print(f"[bench_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env_info() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0), "cores": os.cpu_count()}
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # no NVML: recorded, not fatal
        info["driver"] = f"unknown ({exc})"
    return info


def cli(*args: str, timeout: float = 600) -> str:
    cmd = [sys.executable, "-c", "from cachebuild.cli import main; main()", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)
    return out.stdout


def build_caches(root: Path, graphs: int, mel_files: int) -> dict[str, Path]:
    caches = {"causal": root / "causal", "mel": root / "mel"}
    t = time.perf_counter()
    cli("generate", "--graphs", str(graphs), "--out", str(caches["causal"]))
    cli("mel", "--synthetic", str(mel_files), "--out", str(caches["mel"]))
    log(f"caches built in {time.perf_counter() - t:.1f} s: {graphs} graphs, {mel_files} mel files")
    return caches


def median_ms(fn: Callable[[], Any], reps: int = 30, warm: int = 5) -> float:
    """Median device time of ``fn`` (CUDA events on the current stream)."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def pinned_batches(cache: Path, view: str, batch_size: int, count: int = 6, **kw: Any) -> list[Any]:
    from loaders import ShardStream, make_loader
    from loaders.loader import shutdown_workers

    loader = make_loader(ShardStream(cache, view=view, batch_size=batch_size, shuffle=True, seed=0, **kw), num_workers=2)
    out = []
    for b in loader:
        out.append(b)
        if len(out) == count:
            break
    shutdown_workers(loader)
    return out


# --------------------------------------------------------------------------- h2d
def h2d(caches: dict[str, Path]) -> dict[str, Any]:
    from loaders.device import _packed_of, move

    dev = torch.device("cuda")
    cases = [
        ("twins compact", "causal", "twins", 16384, {"compact": True}),
        ("twins full rows", "causal", "twins", 4096, {}),
        ("graphs", "causal", "graphs", 1024, {}),
        ("mel", "mel", "mel", 8192, {}),
    ]
    res: dict[str, Any] = {}
    for name, cache, view, bs, kw in cases:
        batches = pinned_batches(caches[cache], view, bs, **kw)
        packed = _packed_of(batches[0])
        nbytes = int(packed.buffer.numel()) if packed is not None else sum(v.numel() * v.element_size() for v in batches[0].values())
        ring = iter(range(10**9))
        ours = median_ms(lambda: move(batches[next(ring) % len(batches)], dev))
        pinned_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        page_src = torch.empty(nbytes, dtype=torch.uint8)
        pinned_src.fill_(1), page_src.fill_(1)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        ref = median_ms(lambda: dst.copy_(pinned_src, non_blocking=True))
        page = median_ms(lambda: dst.copy_(page_src, non_blocking=True))
        gbs = lambda ms: nbytes / ms / 1e6  # noqa: E731
        res[name] = {
            "batch": bs,
            "bytes": nbytes,
            "packed": packed is not None,
            "pinned": bool(packed.buffer.is_pinned()) if packed is not None else None,
            "ours_ms": ours,
            "pinned_copy_ms": ref,
            "pageable_ms": page,
            "ours_gbs": gbs(ours),
            "pinned_gbs": gbs(ref),
            "pageable_gbs": gbs(page),
            "ours_vs_pinned": ref / ours,
        }
        log(f"h2d {name}: {nbytes / 1e6:.1f} MB, ours {gbs(ours):.1f} GB/s, pinned copy_ {gbs(ref):.1f}, pageable {gbs(page):.1f}")
    return res


# --------------------------------------------------------------------------- overlap
def _compute_step(target_ms: float) -> Callable[[], Any]:
    """A step of about ``target_ms`` on the current stream: a chain of fp32 matmuls."""
    x = torch.randn(2048, 2048, device="cuda")
    one = median_ms(lambda: x @ x, reps=10)
    reps = max(1, round(target_ms / one))

    def step() -> Any:
        y = x
        for _ in range(reps):
            y = (y @ x) * 1e-3
        return y

    return step


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def trace_overlap(trace_json: dict) -> dict[str, Any]:
    """Share of H2D copy time during which some compute kernel ran (from a Kineto chrome trace)."""
    events = [e for e in trace_json.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"])
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    starts = np.array([k[0] for k in kernels])
    total = covered = 0.0
    for c in copies:
        a, b = c["ts"], c["ts"] + c["dur"]
        total += b - a
        i = max(0, int(np.searchsorted(starts, a)) - 1)
        while i < len(kernels) and kernels[i][0] < b:
            covered += max(0.0, min(b, kernels[i][1]) - max(a, kernels[i][0]))
            i += 1
    kinds = sorted({c.get("name", "") for c in copies})
    return {"h2d_copies": len(copies), "h2d_us": total, "h2d_overlapped_us": covered, "overlap_share": covered / total if total else None, "copy_kinds": kinds}


def overlap(caches: dict[str, Path], out_dir: Path, steps: int = 40) -> dict[str, Any]:
    from loaders import to_device
    from loaders.device import move

    dev = torch.device("cuda")
    batches = pinned_batches(caches["causal"], "twins", 4096, count=8)
    step = _compute_step(3.0)
    ring = lambda: (batches[i % len(batches)] for i in range(steps))  # noqa: E731

    def through_to_device() -> None:
        for b in to_device(ring(), dev):
            step()

    def serial() -> None:
        for b in ring():
            move(b, dev, non_blocking=False)
            step()

    t_step = median_ms(lambda: [step() for _ in range(steps)], reps=5, warm=1)
    t_copy = median_ms(lambda: [move(b, dev) for b in ring()], reps=5, warm=1)
    t_both = median_ms(through_to_device, reps=5, warm=1)
    t_serial = median_ms(serial, reps=5, warm=1)
    hidden = (t_step + t_copy - t_both) / t_copy if t_copy else None
    res: dict[str, Any] = {"steps": steps, "step_ms": t_step / steps, "copy_ms": t_copy / steps, "to_device_ms": t_both / steps, "serial_ms": t_serial / steps, "copy_hidden_share": hidden}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        through_to_device()
        torch.cuda.synchronize()
    path = out_dir / "to_device_trace.json"
    prof.export_chrome_trace(str(path))
    res.update(trace_overlap(json.loads(path.read_text())))
    with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    log(
        f"overlap: step {res['step_ms']:.2f} ms, copy {res['copy_ms']:.2f} ms, to_device {res['to_device_ms']:.2f} ms/step, "
        f"serial {res['serial_ms']:.2f} ms/step, hidden {hidden:.0%}, trace overlap {res['overlap_share']}"
    )
    return res


# --------------------------------------------------------------------------- trainers
def model_step_ms(kind: str, batch: int, size: int) -> float:
    """The example model's optimiser step alone, on a batch already on the GPU (the compute a loader must hide under)."""
    from train_causal import TwinMLP
    from train_mel import MelCNN

    dev = torch.device("cuda")
    if kind.startswith("causal"):
        n = 10
        model = TwinMLP(n, size).to(dev)
        args = (torch.randn(batch, n, device=dev), torch.zeros(batch, n, device=dev), torch.randn(batch, device=dev), torch.randn(batch, 2 * n + n * n, device=dev))
        target = torch.randn(batch, n, device=dev)
    else:
        model = MelCNN(size).to(dev)
        args = (torch.randn(batch, 1, 64, 1, device=dev).half() * 50,)
        target = torch.rand(batch, device=dev).round()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        out = model(*args)
        loss = ((out - target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return median_ms(step, reps=30, warm=5)


_TRAINER_KEYS = (
    "steps",
    "samples_per_s",
    "wait_fraction",
    "gpu_idle_fraction",
    "gpu_idle_ms_per_step",
    "gpu_util_mean",
    "wait_p95_ms",
    "first_batch_s",
    "cpu_percent",
    "process_s",
    "gap_p50_ms",
    "gap_p99_ms",
    "gap_max_ms",
    "idle_in_gaps_over_5ms_ms",
)


def run_trainer(script: str, extra: list[str], seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "examples" / script), "--json", "--seconds", str(seconds), *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 240, env=env, cwd=str(REPO))
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    d["process_s"] = time.perf_counter() - t
    return d


def trainers(caches: dict[str, Path], workers: list[int], seconds: float, out_dir: Path, res: dict[str, Any], save: Callable[[], None]) -> dict[str, Any]:
    """Every trainer run, filling ``res`` (saved after each run, so a cut-off sweep keeps what it measured)."""
    from train_mel import write_h5_from_cache

    h5 = out_dir / "users_mel.h5"
    write_h5_from_cache(str(caches["mel"]), h5)
    setups = {
        "causal": ("train_causal.py", ["--cache", str(caches["causal"]), "--steps", "10000000", "--batch-size", "16384", "--hidden", "1024"], 16384, 1024),
        "causal-h2048": ("train_causal.py", ["--cache", str(caches["causal"]), "--steps", "10000000", "--batch-size", "16384", "--hidden", "2048"], 16384, 2048),
        "mel": ("train_mel.py", ["--cache", str(caches["mel"]), "--batch-size", "8192", "--width", "128", "--h5", str(h5)], 8192, 128),
    }
    for kind, (script, args, batch, size) in list(setups.items()):
        res[f"{kind} model step alone ms"] = model_step_ms(kind, batch, size)
        log(f"{kind}: model step alone {res[f'{kind} model step alone ms']:.2f} ms at batch {batch}")
        for w in workers if kind != "causal-h2048" else workers[:1]:  # a longer step: does the idle time vanish?
            variants = [("ours", []), ("baseline", ["--baseline"]), ("resident", ["--resident", "16"])]
            if kind == "causal" and w == workers[0]:  # where does the main process's share of the idle time come from?
                variants += [("ours handover 0", ["--handover", "0"]), ("ours switch 0.5 ms", ["--switch-interval", "0.0005"])]
            for pipeline, flag in variants:
                if (pipeline == "resident" and w != workers[0]) or (pipeline == "baseline" and kind == "causal-h2048"):
                    continue  # the ideal loader does not depend on the worker count
                key = f"{kind} {pipeline} w{w}"
                try:
                    d = run_trainer(script, [*args, "--workers", str(w), *flag], seconds)
                except Exception as exc:  # one failed run must not lose the others
                    res[key] = {"error": str(exc)[-800:]}
                    log(f"{key}: FAILED {str(exc)[-300:]}")
                    continue
                res[key] = {"batch": batch, **{k: d.get(k) for k in _TRAINER_KEYS}}
                save()
                log(f"{key}: wait {d.get('wait_fraction')}, gpu idle {d.get('gpu_idle_fraction')}, gpu util {d.get('gpu_util_mean')}, samples/s {d.get('samples_per_s')}")
    return res


# --------------------------------------------------------------------------- expand
def expand(caches: dict[str, Path], workers: int, seconds: float, batch: int = 16384) -> dict[str, Any]:
    from loaders import ShardStream, expand_compact, make_loader, to_device
    from loaders.loader import shutdown_workers

    res: dict[str, Any] = {}
    for name, compact in (("compact + expand_compact", True), ("full-row view", False)):
        loader = make_loader(ShardStream(caches["causal"], view="twins", batch_size=batch, shuffle=True, seed=0, compact=compact), num_workers=workers)
        rows, t0, acc = 0, None, torch.zeros((), device="cuda")
        for epoch in range(1000):
            loader.set_epoch(epoch)
            for b in to_device(loader, "cuda"):
                full = expand_compact(b) if compact else b
                acc += full["base_samples"][:, 0, 0].sum() + full["int_samples"][:, 0, 0].sum()  # touch what a model reads
                if t0 is None:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    continue
                rows += int(b["is_pad"].shape[0])
                if time.perf_counter() - t0 >= seconds:
                    break
            if t0 is not None and time.perf_counter() - t0 >= seconds:
                break
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        shutdown_workers(loader)
        res[name] = {"rows_per_s": rows / dt, "workers": workers, "batch": batch}
        log(f"expand {name}: {rows / dt:,.0f} rows/s")
    res["compact / full"] = res["compact + expand_compact"]["rows_per_s"] / res["full-row view"]["rows_per_s"]
    return res


def bench_cli(caches: dict[str, Path], workers: int) -> dict[str, Any]:
    out = cli("bench", str(caches["causal"]), "--view", "twins", "--workers", str(workers), "--consumer", "model", "--seconds", "6", "--json")
    text = out.strip()
    return json.loads(text[text.index("{") :])


# --------------------------------------------------------------------------- report
def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def _num(v: Any, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def table(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name, d in r.get("h2d", {}).items():
        rows.append(
            (
                f"H2D {name} ({d['bytes'] / 1e6:.1f} MB/batch): ours / pinned `copy_` / pageable",
                f"{d['ours_gbs']:.1f} / {d['pinned_gbs']:.1f} / {d['pageable_gbs']:.1f} GB/s (packed {d['packed']}, pinned {d['pinned']})",
            )
        )
    o = r.get("overlap")
    if o:
        rows.append(("overlap: step / copy / to_device / copy-then-step, ms per step", f"{o['step_ms']:.2f} / {o['copy_ms']:.2f} / {o['to_device_ms']:.2f} / {o['serial_ms']:.2f}"))
        rows.append(
            (
                "overlap: copy time hidden (wall) / H2D time under a kernel (profiler)",
                f"{_pct(o['copy_hidden_share'])} / {_pct(o['overlap_share'])} ({o['h2d_copies']} copies: {', '.join(o['copy_kinds'])})",
            )
        )
    for key, d in r.get("trainers", {}).items():
        if isinstance(d, float):
            rows.append((key, f"{d:.2f}"))
        elif "error" in d:
            rows.append((key, "FAILED: " + d["error"].splitlines()[-1][:150]))
        else:
            step = r["trainers"].get(f"{key.split()[0]} model step alone ms")
            alone = f" ({d['samples_per_s'] * step / 1e3 / d['batch']:.0%} of the model alone)" if step and d.get("samples_per_s") else ""
            gaps = (
                (
                    f"; idle gaps p50 {_num(d.get('gap_p50_ms'), '.3f')} / p99 {_num(d.get('gap_p99_ms'), '.2f')} / max {_num(d.get('gap_max_ms'), '.1f')} ms, "
                    f"{_num(d.get('idle_in_gaps_over_5ms_ms'), '.0f')} ms in gaps > 5 ms"
                )
                if d.get("gap_p50_ms") is not None
                else ""
            )
            rows.append(
                (
                    f"{key}: GPU idle (events) / GPU util (NVML) / loop wait / samples/s",
                    f"{_pct(d['gpu_idle_fraction'])} / {_num(d['gpu_util_mean'], '.1f')} % / {_pct(d['wait_fraction'])} / {_num(d['samples_per_s'])}{alone}{gaps}",
                )
            )
    for key, d in r.get("expand", {}).items():
        rows.append((f"twins on GPU, {key}", f"{d:.2f}x" if isinstance(d, float) else f"{d['rows_per_s']:,.0f} rows/s ({d['workers']} workers, batch {d['batch']})"))
    b = r.get("bench_cli")
    if b:
        rows.append(("`cachebuild bench --consumer model` (twins)", f"wait {_pct(b.get('wait_fraction'))}, {_num(b.get('samples_per_s'))} rows/s, GPU util {b.get('gpu_util_mean')}"))
    for k, v in r.get("errors", {}).items():
        rows.append((f"section {k}", "FAILED: " + v.strip().splitlines()[-1][:200]))
    return rows


def section(r: dict[str, Any], name: str, fn: Callable[[], Any], limit_s: float = 420) -> None:
    """Run one section; its failure is recorded, and a hang ends the process with every thread's stack."""
    t = time.perf_counter()
    faulthandler.dump_traceback_later(limit_s, exit=True)
    try:
        r[name] = fn()
    except Exception:
        r.setdefault("errors", {})[name] = traceback.format_exc()
        log(f"section {name} FAILED:\n{traceback.format_exc()}")
    faulthandler.cancel_dump_traceback_later()
    log(f"section {name}: {time.perf_counter() - t:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 worker counts, 4 s per trainer run, smaller caches")
    ap.add_argument("--workers", default="2,8", help="DataLoader worker counts for the trainer runs (2,4,8,12: the whole sweep, ~10 minutes)")
    ap.add_argument("--seconds", type=float, default=5.0, help="wall time of each trainer run (after its warm-up)")
    ap.add_argument("--sections", default="h2d,overlap,expand,bench_cli,trainers", help="in this order by default: the short sections first, so a cut-off sweep loses only trainer runs")
    ap.add_argument("--root", default="/dev/shm/cachebuild-gpu-bench", help="where the caches are built (tmpfs)")
    ap.add_argument("--out", default=None, help="write every number as JSON here")
    ap.add_argument("--md", default=None, help="write the results table (markdown) here")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured (run it on a GPU machine)")
        return 0
    workers = [int(w) for w in args.workers.split(",")] if not args.quick else [2, 8]
    seconds = 4.0 if args.quick else args.seconds
    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    out_dir = Path(args.out).parent if args.out else Path(tempfile.mkdtemp())
    r: dict[str, Any] = {"env": env_info()}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(r, indent=1, default=str))

    log(f"environment: {r['env']}")
    caches = build_caches(root, 4000 if args.quick else 20000, 1024 if args.quick else 8192)
    jobs = {
        "h2d": lambda: h2d(caches),
        "overlap": lambda: overlap(caches, out_dir),
        "trainers": lambda: trainers(caches, workers, seconds, root, r.setdefault("trainers", {}), save),
        "expand": lambda: expand(caches, max(workers), seconds),
        "bench_cli": lambda: bench_cli(caches, max(workers)),
    }
    for name in args.sections.split(","):
        runs = len(workers) * 5 + 6 if name == "trainers" else 1  # the sweep's runs, each ~seconds + 12 s of start-up
        section(r, name, jobs[name], limit_s=max(420.0, runs * (seconds + 20)))
        save()
    rows = table(r)
    env = r["env"]
    notes = [
        f"device {env['device']}, driver {env['driver']}, torch {env['torch']} (CUDA {env['cuda']}), {env['cores']} CPU cores",
        "trainers: no per-step CUDA synchronisation (the GPU queue stays full). GPU idle = device time between the end of "
        "step i's work and the arrival of batch i+1 on the trainer's stream (CUDA events, loaders.gpu_idle), over the device "
        "time of the run: the starvation that matters. Loop wait = time blocked in next(): with an asynchronous GPU the loop "
        "must block somewhere, and blocking while the GPU has queued work costs nothing. GPU util = NVML, sampled every 0.2 s "
        "after the warm-up step. 'of the model alone' = samples/s over the rate of the model's step on a GPU-resident batch",
        "causal: TwinMLP hidden 1024, batch 16,384 twin rows; mel: MelCNN width 128, batch 8,192 segments",
    ]
    md = "\n".join(["| measure | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows] + [""] + [f"- {n}" for n in notes])
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")
    if args.record:
        from _results import append

        append("bench_gpu: the feeding path on a CUDA GPU", rows, notes)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
