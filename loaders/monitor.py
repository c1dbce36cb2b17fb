"""Measure data-loading stalls in a training loop instead of guessing them from nvidia-smi.

``StallMonitor.wrap(loader)`` times each ``next()`` on the loader: that is
the time the trainer *waited* for its batch. The time between two ``next()``
calls is the *step*. Their ratio, ``wait_fraction``, says whether the loop is
data-bound. GPU utilisation and memory (NVML through ``pynvml`` from
``nvidia-ml-py``, optional), CPU and RAM (``psutil``) are sampled by a
background thread every ``sample_every_s`` seconds, never per step, so the
per-step cost stays at two ``perf_counter`` calls and a few additions.

Usage::

    monitor = StallMonitor(log_every=500)              # or attach(tqdm_bar)
    for batch in monitor.wrap(loader):
        ...
    print(monitor.summary().to_dict())

The first ``warmup`` steps (default 1) are left out of the summary, because
the first batch also pays for worker start-up; its wait is reported apart as
``first_batch_s``. When the measured window is data-bound (``wait_fraction``
above ``data_bound_threshold``) or the GPU averages under ``low_gpu_util``
percent, the monitor warns once per epoch with concrete advice.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Literal

import numpy as np

__all__ = ["StallMonitor", "StallSummary", "DataBoundWarning", "LowGpuUtilWarning", "measure_overhead"]

_log = logging.getLogger(__name__)
_MIN_STEPS_TO_WARN = 10
_EVENT_EVERY = 50  # steps between postfix refreshes and mid-epoch checks


class DataBoundWarning(UserWarning):
    """The trainer spent more than the threshold of its time waiting for batches."""


class LowGpuUtilWarning(UserWarning):
    """The GPU was busy less than the threshold percentage of the time."""


@dataclass(frozen=True)
class StallSummary:
    """One epoch's (or the running epoch's) measurements, over the steps after warm-up.

    ``gpu_*`` are None without NVML or a GPU; ``cpu_percent`` (system-wide mean)
    and ``ram_used_gb`` (system, peak) are None when system sampling is off.
    """

    steps: int
    samples: int | None
    wall_s: float
    wait_s: float
    wait_fraction: float
    wait_p50_ms: float
    wait_p95_ms: float
    wait_max_ms: float
    batches_per_s: float
    samples_per_s: float | None
    first_batch_s: float | None
    warmup: int
    gpu_util_mean: float | None
    gpu_mem_used_gb: float | None
    cpu_percent: float | None
    ram_used_gb: float | None
    data_bound: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One human line, as logged every ``log_every`` steps."""
        parts = [f"{self.steps} steps", f"wait {self.wait_fraction:.1%} (p95 {self.wait_p95_ms:.1f} ms)", f"{self.batches_per_s:.1f} batches/s"]
        if self.samples_per_s is not None:
            parts.append(f"{self.samples_per_s:,.0f} samples/s")
        if self.gpu_util_mean is not None:
            parts.append(f"gpu {self.gpu_util_mean:.0f}% {self.gpu_mem_used_gb or 0:.1f} GB")
        if self.cpu_percent is not None:
            parts.append(f"cpu {self.cpu_percent:.0f}% ram {self.ram_used_gb:.1f} GB")
        return ", ".join(parts)


def _nvml(gpu: int | None) -> tuple[Any, Any] | None:
    """(pynvml, device handle) for the trainer's GPU, or None when NVML is unavailable.

    The CUDA device (``gpu``, default torch's current one) is matched to NVML by
    UUID when torch has initialised CUDA, else through ``CUDA_VISIBLE_DEVICES``
    (NVML counts physical devices, CUDA only the visible ones).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver or no device
        return None
    torch = sys.modules.get("torch")
    index = gpu
    try:
        if torch is not None and torch.cuda.is_initialized():
            index = torch.cuda.current_device() if gpu is None else gpu
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
    except Exception:  # an older torch without .uuid, or an unknown UUID: use the index below
        pass
    index = index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    try:
        if index < len(visible) and not visible[index].isdigit():
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(visible[index])
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(visible[index]) if index < len(visible) else index)
    except Exception:  # no such device: GPU stats unavailable
        return None


class _Sampler:
    """Background thread sampling GPU util/memory (NVML) and CPU/RAM (psutil) every ``interval`` s."""

    def __init__(self, interval: float, gpu: int | None) -> None:
        self.interval, self.gpu = interval, gpu
        self.gpu_util: list[float] = []
        self.gpu_mem: list[float] = []
        self.cpu: list[float] = []
        self.ram: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: tuple[Any, Any] | None = None

    def start(self) -> None:
        import psutil

        self._nv = _nvml(self.gpu)
        psutil.cpu_percent(interval=None)  # prime: the next call measures since now
        self._thread = threading.Thread(target=self._loop, name="stall-monitor-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        import psutil

        self.cpu.append(psutil.cpu_percent(interval=None))
        self.ram.append(psutil.virtual_memory().used / 1e9)
        if self._nv is not None:
            nv, handle = self._nv
            try:
                self.gpu_util.append(float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
                self.gpu_mem.append(nv.nvmlDeviceGetMemoryInfo(handle).used / 1e9)
            except Exception:  # the device went away: stop asking
                self._nv = None

    def stop(self) -> None:
        """Stop the thread; take one last sample so short epochs still get numbers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # bounded: one NVML/psutil sample at most
            self._thread = None
            self.sample()


def _batch_counter(batch_size: int | Callable[[Any], int] | None, samples_key: str | None, batch: Any) -> Callable[[Any], int] | None:
    """How to count samples in a batch, decided once from the first batch (None: unknown)."""
    if isinstance(batch_size, int):
        return lambda b: batch_size
    if callable(batch_size):
        return batch_size
    if samples_key is not None:
        return lambda b: len(b[samples_key])
    if getattr(batch, "ndim", 0) >= 1:
        return lambda b: b.shape[0]
    keys = batch.keys() if isinstance(batch, Mapping) else range(len(batch)) if isinstance(batch, (tuple, list)) else ()
    for k in keys:
        if getattr(batch[k], "ndim", 0) >= 1:
            return lambda b, k=k: b[k].shape[0]
    return None


class _Epoch:
    """Running counters of one pass over the loader (slots: cheap per-step updates)."""

    __slots__ = ("waits", "steps", "samples", "wait_s", "start", "end", "first_batch_s", "warned", "count", "next_event", "mark")

    def __init__(self) -> None:
        self.waits = array("d")
        self.steps = self.samples = 0
        self.wait_s = 0.0
        self.start: float | None = None
        self.end: float | None = None
        self.first_batch_s: float | None = None
        self.warned: set[type] = set()
        self.count: Callable[[Any], int] | None = None
        self.next_event = 1  # the first step resolves the batch-size counter
        self.mark: list = [0.0, 0, 0.0, 0]  # (time, steps, wait_s, samples) at the last log line


class StallMonitor:
    """Wraps a batch iterator and measures how long the training loop waits for data.

    Parameters: ``batch_size`` (int or callable(batch) -> int; default: the
    leading dim of the batch's first tensor/array, or of ``batch[samples_key]``),
    ``warmup`` steps left out of the summary, ``log_every`` steps between log
    lines (None: no periodic logging), ``data_bound_threshold`` wait fraction and
    ``low_gpu_util`` percent that trigger a warning, ``sample_every_s`` for the
    GPU/CPU/RAM sampler (None: off), ``gpu`` (CUDA index, default the current
    device), ``sync_cuda`` (synchronise CUDA after every step so queued GPU work
    counts as step time, not as wait: exact but slower), ``warn`` ("warnings",
    "logging" or None).

    One ``wrap`` call is one epoch; it ends when the loader is exhausted or the
    wrapped iterator is closed (leaving a plain ``for`` loop does that at once;
    call ``.close()`` on it when something else, e.g. a tqdm bar, still holds
    it). ``summary()`` works at any time, on the epoch so far.
    """

    def __init__(
        self,
        *,
        batch_size: int | Callable[[Any], int] | None = None,
        samples_key: str | None = None,
        warmup: int = 1,
        log_every: int | None = None,
        logger: logging.Logger | None = None,
        data_bound_threshold: float = 0.10,
        low_gpu_util: float = 30.0,
        sample_every_s: float | None = 1.0,
        gpu: int | None = None,
        sync_cuda: bool = False,
        warn: Literal["warnings", "logging"] | None = "warnings",
    ) -> None:
        if warmup < 0 or (log_every is not None and log_every < 1):
            raise ValueError(f"warmup must be >= 0 and log_every >= 1 or None (got warmup={warmup!r}, log_every={log_every!r})")
        self.batch_size, self.samples_key, self.warmup = batch_size, samples_key, warmup
        self.log_every, self.logger = log_every, logger or _log
        self.data_bound_threshold, self.low_gpu_util = data_bound_threshold, low_gpu_util
        self.sample_every_s, self.gpu, self.sync_cuda, self.warn = sample_every_s, gpu, sync_cuda, warn
        self.history: list[StallSummary] = []
        self._epoch = _Epoch()
        self._sampler: _Sampler | None = None
        self._bar: Any = None

    # ------------------------------------------------------------------ the loop
    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield the batches of ``iterable``, timing each ``next()``; one call = one epoch."""
        return self._run(iter(iterable))

    def _run(self, it: Iterator[Any]) -> Iterator[Any]:
        ep = self._epoch = _Epoch()
        self._start_sampler()
        sync = self._cuda_sync()
        pc, add, warmup = time.perf_counter, ep.waits.append, self.warmup
        t0 = pc()
        exhausted = False
        if warmup == 0:
            ep.start, ep.mark = t0, [t0, 0, 0.0, 0]
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    exhausted = True
                    break
                t1 = pc()
                add(t1 - t0)
                if ep.steps >= warmup:
                    ep.wait_s += t1 - t0
                    if ep.count is not None:
                        ep.samples += ep.count(batch)
                ep.steps += 1
                if ep.steps >= ep.next_event:
                    self._event(ep, batch, t1)
                yield batch
                if sync is not None:
                    sync()
                t0 = pc()
                if ep.steps == warmup:  # the measured window starts with the next wait
                    ep.start, ep.mark = t0, [t0, ep.steps, 0.0, 0]
        finally:
            ep.end = t0 if exhausted else pc()  # loop left early: the step in progress counts
            self._finish(ep)

    def _event(self, ep: _Epoch, batch: Any, now: float) -> None:
        """Rare per-step work (every few dozen steps): first batch, postfix, log line, mid-epoch check."""
        if ep.steps == 1:
            ep.first_batch_s = ep.waits[0]
            ep.count = _batch_counter(self.batch_size, self.samples_key, batch)
            if ep.count is not None and self.warmup == 0:
                ep.samples += ep.count(batch)
        marks = [ep.steps + _EVENT_EVERY - ep.steps % _EVENT_EVERY]
        if self.log_every:
            if ep.steps > self.warmup and ep.steps % self.log_every == 0:
                self.logger.info("stall monitor: %s", self._window_line(ep, now))
            marks.append(ep.steps + self.log_every - ep.steps % self.log_every)
        if ep.steps > self.warmup:
            if self._bar is not None:
                self._bar.set_postfix(self.postfix(), refresh=False)
            if ep.steps % _EVENT_EVERY == 0:
                self._check(ep, None)
        ep.next_event = min(marks)

    def _window_line(self, ep: _Epoch, now: float) -> str:
        """Log line for the steps since the previous one (so it shows the present, in O(log_every))."""
        t, steps, wait_s, samples = ep.mark
        n, wall = ep.steps - steps, max(now - t, 1e-12)
        recent = np.frombuffer(ep.waits[max(steps, self.warmup) :], dtype=np.float64) * 1e3  # a copy: never pin the growing array
        ep.mark = [now, ep.steps, ep.wait_s, ep.samples]
        line = f"steps {steps}-{ep.steps}: wait {(ep.wait_s - wait_s) / wall:.1%} (p95 {np.percentile(recent, 95):.1f} ms), {n / wall:.1f} batches/s"
        if ep.count is not None:
            line += f", {(ep.samples - samples) / wall:,.0f} samples/s"
        return line + self._system_text()

    def _finish(self, ep: _Epoch) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        summary = self.summary()
        self.history.append(summary)
        if self.log_every:
            self.logger.info("stall monitor, epoch done: %s (first batch %.3f s)", summary.line(), ep.first_batch_s or 0.0)
        self._check(ep, summary)

    # ------------------------------------------------------------------ results
    def summary(self) -> StallSummary:
        """Measurements of the running (or last) epoch, over the steps after warm-up."""
        ep, s = self._epoch, self._sampler
        steps, wall, frac = self._live()
        waits = np.frombuffer(ep.waits[self.warmup :], dtype=np.float64) * 1e3
        p50, p95, wmax = (float(np.percentile(waits, 50)), float(np.percentile(waits, 95)), float(waits.max())) if len(waits) else (0.0, 0.0, 0.0)
        samples = ep.samples if ep.count is not None else None
        return StallSummary(
            steps=steps,
            samples=samples,
            wall_s=wall,
            wait_s=ep.wait_s,
            wait_fraction=frac,
            wait_p50_ms=p50,
            wait_p95_ms=p95,
            wait_max_ms=wmax,
            batches_per_s=steps / wall if wall > 0 else 0.0,
            samples_per_s=(samples / wall if wall > 0 else 0.0) if samples is not None else None,
            first_batch_s=ep.first_batch_s,
            warmup=self.warmup,
            gpu_util_mean=self._gpu_mean(),
            gpu_mem_used_gb=max(s.gpu_mem) if s and s.gpu_mem else None,
            cpu_percent=float(np.mean(s.cpu)) if s and s.cpu else None,
            ram_used_gb=max(s.ram) if s and s.ram else None,
            data_bound=steps >= _MIN_STEPS_TO_WARN and frac > self.data_bound_threshold,
        )

    def postfix(self) -> dict[str, str]:
        """Short strings for a tqdm postfix: epoch wait fraction and rates, latest GPU/CPU sample (O(1))."""
        steps, wall, frac = self._live()
        ep, s = self._epoch, self._sampler
        out = {"wait": f"{frac:.0%}", "b/s": f"{steps / wall if wall else 0.0:.1f}"}
        if ep.count is not None:
            out["smp/s"] = f"{ep.samples / wall if wall else 0.0:.3g}"
        if s and s.gpu_util:
            out["gpu"] = f"{s.gpu_util[-1]:.0f}%"
        if s and s.cpu:
            out["cpu"] = f"{s.cpu[-1]:.0f}%"
        return out

    def _live(self) -> tuple[int, float, float]:
        """(measured steps, wall seconds, wait fraction) of the running epoch, in O(1)."""
        ep = self._epoch
        steps = max(0, ep.steps - self.warmup)
        end = ep.end if ep.end is not None else time.perf_counter()
        wall = max(end - ep.start, 0.0) if ep.start is not None and steps else 0.0
        return steps, wall, (ep.wait_s / wall if wall > 0 else 0.0)

    def _system_text(self) -> str:
        s = self._sampler
        text = f", gpu {s.gpu_util[-1]:.0f}% {s.gpu_mem[-1]:.1f} GB" if s and s.gpu_util else ""
        return text + (f", cpu {s.cpu[-1]:.0f}% ram {s.ram[-1]:.1f} GB" if s and s.cpu else "")

    def attach(self, bar: Any) -> Any:
        """Keep ``bar``'s postfix (a tqdm) up to date every few dozen steps; returns ``bar``."""
        self._bar = bar
        return bar

    def close(self) -> None:
        """Stop the background sampler (also done when an epoch ends or its loop is left)."""
        if self._sampler is not None:
            self._sampler.stop()

    # ------------------------------------------------------------------ helpers
    def _start_sampler(self) -> None:
        self.close()
        self._sampler = _Sampler(self.sample_every_s, self.gpu) if self.sample_every_s else None
        if self._sampler is not None:
            self._sampler.start()

    def _cuda_sync(self) -> Callable[[], None] | None:
        torch = sys.modules.get("torch")
        if self.sync_cuda and torch is not None and torch.cuda.is_available():
            return torch.cuda.synchronize
        return None

    def _gpu_mean(self) -> float | None:
        s = self._sampler
        return float(np.mean(s.gpu_util)) if s and s.gpu_util else None

    def _check(self, ep: _Epoch, summary: StallSummary | None) -> None:
        """Warn (once per epoch and kind) when data-bound or when the GPU idles; cheap unless it warns."""
        steps, _, frac = self._live()
        if steps < _MIN_STEPS_TO_WARN:
            return
        gpu = self._gpu_mean()
        if frac > self.data_bound_threshold and DataBoundWarning not in ep.warned:
            self._warn(ep, DataBoundWarning, _data_bound_advice(summary or self.summary(), self.data_bound_threshold))
        if gpu is not None and gpu < self.low_gpu_util and LowGpuUtilWarning not in ep.warned:
            self._warn(ep, LowGpuUtilWarning, _low_gpu_advice(summary or self.summary(), self.low_gpu_util))

    def _warn(self, ep: _Epoch, kind: type[UserWarning], message: str) -> None:
        ep.warned.add(kind)
        if self.warn == "warnings":
            warnings.warn(message, kind, stacklevel=5)  # the user's for-loop
        elif self.warn == "logging":
            self.logger.warning("%s: %s", kind.__name__, message)


def _data_bound_advice(sm: StallSummary, threshold: float) -> str:
    return (
        f"training is data-bound: the loop waited for its next batch {sm.wait_fraction:.0%} of the time "
        f"({sm.wait_s:.2f} s of {sm.wall_s:.2f} s over {sm.steps} steps, p95 wait {sm.wait_p95_ms:.1f} ms; threshold {threshold:.0%}). "
        "To feed it faster: (1) more loader workers (num_workers, up to the free CPU cores); "
        "(2) a deeper prefetch (prefetch_factor: more batches in flight); "
        "(3) no decompression and no disk: a raw cache on tmpfs, `cachebuild generate --codec none` then `make ramdisk-stage`; "
        "(4) larger blocks/batches, so per-batch overhead is paid less often."
    )


def _low_gpu_advice(sm: StallSummary, low: float) -> str:
    why = (
        "the GPU idles while the loop waits for data: follow the data-bound advice (more workers, deeper prefetch, raw cache on tmpfs)"
        if sm.data_bound
        else "the loop is not waiting for data, so each step gives the GPU too little work: larger batches, fewer host syncs per step (.item(), .cpu(), printing), mixed precision or torch.compile"
    )
    return f"GPU utilisation averaged {sm.gpu_util_mean:.0f}% (< {low:.0f}%) over {sm.wall_s:.1f} s: {why}."


def measure_overhead(steps: int = 100_000) -> float:
    """Seconds the monitor adds per step, from a trivial iterator with and without it."""
    items = range(steps)
    t = time.perf_counter()
    for _ in items:
        pass
    bare = time.perf_counter() - t
    monitor = StallMonitor(batch_size=1, sample_every_s=None, warn=None)
    t = time.perf_counter()
    for _ in monitor.wrap(items):
        pass
    return max(0.0, (time.perf_counter() - t - bare) / steps)
