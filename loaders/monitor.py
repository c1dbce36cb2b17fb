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
    print(monitor.table())                             # one row per epoch
    monitor.plot("stalls.png")                         # wait and throughput over steps (matplotlib)

Its numbers go to any logger through ``on_log`` (a dict every ``log_every``
steps and at each epoch's end; TensorBoard: ``on_log=tensorboard_hook(writer)``),
see :mod:`loaders.monitor_out`.

The first ``warmup`` steps (default 1) are left out of the summary, because
the first batch also pays for worker start-up; its wait is reported apart as
``first_batch_s``. When the measured window is data-bound (``wait_fraction``
above ``data_bound_threshold``) or the GPU averages under ``low_gpu_util``
percent, the monitor warns once per epoch with concrete advice. Mid-epoch (every
50 steps) it warns data-bound only when the steps since the previous check are
data-bound too, so a start-up transient (workers starting, the first pool's
decode) that the epoch then absorbs warns at most at the epoch's end, if the
epoch as a whole stayed over the threshold.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, Literal

import numpy as np

from loaders.monitor_out import across_ranks, plot_steps, summary_metrics, summary_table
from loaders.monitor_summary import (
    DataBoundWarning,
    EpochCounters,
    LowGpuUtilWarning,
    StallSummary,
    batch_counter,
    data_bound_advice,
    low_gpu_advice,
)
from loaders.sysstats import _nvml, _Sampler  # noqa: F401  (_nvml: re-exported for tests)

__all__ = ["StallMonitor", "StallSummary", "DataBoundWarning", "LowGpuUtilWarning", "measure_overhead"]

_log = logging.getLogger(__name__)
_MIN_STEPS_TO_WARN = 10
_EVENT_EVERY = 50  # steps between postfix refreshes and mid-epoch checks


class StallMonitor:
    """Wraps a batch iterator and measures how long the training loop waits for data.

    Parameters: ``batch_size`` (int or callable(batch) -> int; default: the
    leading dim of the batch's first tensor/array, or of ``batch[samples_key]``),
    ``warmup`` steps left out of the summary, ``log_every`` steps between log
    lines (None: no periodic logging), ``data_bound_threshold`` wait fraction and
    ``low_gpu_util`` percent that trigger a warning, ``sample_every_s`` for the
    GPU/CPU/RAM sampler (None: off), ``gpu`` (CUDA index, default the current
    device), ``sync_cuda`` (synchronise CUDA after every step so queued GPU work
    counts as step time, not as wait: exact but slower), ``gpu_idle`` (measure the
    GPU's idle gaps between steps with CUDA events, :mod:`loaders.gpu_idle`;
    default: when torch has initialised CUDA), ``warn`` ("warnings",
    "logging" or None), ``on_log`` (``hook(metrics: dict, step: int)`` every
    ``log_every`` steps and at each epoch's end, see :mod:`loaders.monitor_out`),
    ``epoch_table`` (log :meth:`table` at each epoch's end).

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
        gpu_idle: bool | None = None,
        warn: Literal["warnings", "logging"] | None = "warnings",
        on_log: Callable[[dict[str, float], int], None] | None = None,
        epoch_table: bool = False,
    ) -> None:
        if warmup < 0 or (log_every is not None and log_every < 1):
            raise ValueError(f"warmup must be >= 0 and log_every >= 1 or None (got warmup={warmup!r}, log_every={log_every!r})")
        self.batch_size, self.samples_key, self.warmup = batch_size, samples_key, warmup
        self.log_every, self.logger = log_every, logger or _log
        self.data_bound_threshold, self.low_gpu_util = data_bound_threshold, low_gpu_util
        self.sample_every_s, self.gpu, self.sync_cuda, self.warn = sample_every_s, gpu, sync_cuda, warn
        self.gpu_idle = gpu_idle
        self.on_log, self.epoch_table = on_log, epoch_table
        self.history: list[StallSummary] = []
        self.traces: list[tuple[np.ndarray, np.ndarray]] = []  # per finished epoch: waits (s), arrival times (s from its start)
        self._steps_before = 0  # steps of the finished epochs: the hook's global step
        self._epoch = EpochCounters()
        self._sampler: _Sampler | None = None
        self._bar: Any = None

    # ------------------------------------------------------------------ the loop
    def wrap(self, iterable: Iterable[Any]) -> Generator[Any, None, None]:
        """Yield the batches of ``iterable``, timing each ``next()``; one call = one epoch."""
        return self._run(iter(iterable))

    def _run(self, it: Iterator[Any]) -> Generator[Any, None, None]:
        ep = self._epoch = EpochCounters()
        self._start_sampler()
        sync = self._cuda_sync()
        meter = ep.meter = self._idle_meter()
        pc, add, arrive, warmup = time.perf_counter, ep.waits.append, ep.arrivals.append, self.warmup
        t0 = pc()
        exhausted = False
        if warmup == 0:
            ep.start, ep.mark = t0, (t0, 0, 0.0, 0)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    exhausted = True
                    break
                t1 = pc()
                add(t1 - t0)
                arrive(t1)
                if ep.steps >= warmup:
                    if meter is not None:
                        meter.ready()
                    ep.wait_s += t1 - t0
                    if ep.count is not None:
                        ep.samples += ep.count(batch)
                ep.steps += 1
                if ep.steps >= ep.next_event:
                    self._event(ep, batch, t1)
                yield batch
                if meter is not None:
                    meter.done()
                if sync is not None:
                    sync()
                t0 = pc()
                if ep.steps == warmup:  # the measured window starts with the next wait
                    ep.start, ep.mark = t0, (t0, ep.steps, 0.0, 0)
        finally:
            ep.end = t0 if exhausted else pc()  # loop left early: the step in progress counts
            self._finish(ep)

    def _event(self, ep: EpochCounters, batch: Any, now: float) -> None:
        """Rare per-step work (every few dozen steps): first batch, postfix, log line, mid-epoch check."""
        if ep.steps == 1:
            ep.first_batch_s = ep.waits[0]
            ep.count = batch_counter(self.batch_size, self.samples_key, batch)
            if ep.count is not None and self.warmup == 0:
                ep.samples += ep.count(batch)
        marks = [ep.steps + _EVENT_EVERY - ep.steps % _EVENT_EVERY]
        if self.log_every:
            if ep.steps > self.warmup and ep.steps % self.log_every == 0:
                line, metrics = self._window(ep, now)
                self.logger.info("stall monitor: %s", line)
                if self.on_log is not None:
                    self.on_log(metrics, self._steps_before + ep.steps)
            marks.append(ep.steps + self.log_every - ep.steps % self.log_every)
        if ep.steps > self.warmup:
            if self._bar is not None:
                self._bar.set_postfix(self.postfix(), refresh=False)
            if ep.steps % _EVENT_EVERY == 0:
                # Data-bound mid-epoch needs the epoch so far *and* the steps since the previous check over
                # the threshold: a start-up transient (workers starting, the first pool's decode) keeps the
                # epoch's fraction high for a while but not the next window. The epoch's end judges it whole.
                previous, ep.check_mark = ep.check_mark, (now, ep.wait_s)
                self._check(ep, None, None if previous is None else (ep.wait_s - previous[1]) / max(now - previous[0], 1e-12))
        ep.next_event = min(marks)

    def _window(self, ep: EpochCounters, now: float) -> tuple[str, dict[str, float]]:
        """Log line and hook metrics for the steps since the previous ones (so they show the present, in O(log_every))."""
        t, steps, wait_s, samples = ep.mark
        n, wall = ep.steps - steps, max(now - t, 1e-12)
        recent = np.frombuffer(ep.waits[max(steps, self.warmup) :], dtype=np.float64) * 1e3  # a copy: never pin the growing array
        ep.mark = (now, ep.steps, ep.wait_s, ep.samples)
        p50, p95 = np.percentile(recent, [50, 95])
        m = {"data/wait_fraction": (ep.wait_s - wait_s) / wall, "data/wait_p50_ms": float(p50), "data/wait_p95_ms": float(p95), "data/batches_per_s": n / wall}
        line = f"steps {steps}-{ep.steps}: wait {m['data/wait_fraction']:.1%} (p95 {p95:.1f} ms), {n / wall:.1f} batches/s"
        if ep.count is not None:
            m["data/samples_per_s"] = (ep.samples - samples) / wall
            line += f", {m['data/samples_per_s']:,.0f} samples/s"
        s = self._sampler
        if s and s.gpu_util:
            m["sys/gpu_util"], m["sys/gpu_mem_gb"] = s.gpu_util[-1], s.gpu_mem[-1]
        if s and s.cpu:
            m["sys/cpu_percent"], m["sys/ram_gb"] = s.cpu[-1], s.ram[-1]
        return line + self._system_text(), m

    def _finish(self, ep: EpochCounters) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        summary = self.summary()
        self.history.append(summary)
        arrivals = np.frombuffer(ep.arrivals, dtype=np.float64)
        self.traces.append((np.frombuffer(ep.waits, dtype=np.float64).copy(), arrivals - (arrivals[0] if len(arrivals) else 0.0)))
        self._steps_before += ep.steps
        if self.log_every:
            self.logger.info("stall monitor, epoch done: %s (first batch %.3f s)", summary.line(), ep.first_batch_s or 0.0)
        if self.on_log is not None:
            self.on_log(summary_metrics(summary), self._steps_before)
        if self.epoch_table:
            self.logger.info("stall monitor, epochs so far:\n%s", self.table())
        self._check(ep, summary)

    def table(self) -> str:
        """The finished epochs' summaries, one row each (see :func:`loaders.monitor_out.summary_table`)."""
        return summary_table(self.history)

    def plot(self, path: str | Path, title: str = "") -> Path:
        """Draw wait per step and throughput over steps, all epochs so far, to the PNG ``path`` (needs matplotlib)."""
        traces = list(self.traces)
        if self._epoch.end is None and len(self._epoch.waits):  # the running epoch too
            arrivals = np.frombuffer(self._epoch.arrivals, dtype=np.float64)
            traces.append((np.frombuffer(self._epoch.waits, dtype=np.float64).copy(), arrivals - arrivals[0]))
        return plot_steps(traces, path, title)

    # ------------------------------------------------------------------ results
    def summary(self) -> StallSummary:
        """Measurements of the running (or last) epoch, over the steps after warm-up."""
        ep, s = self._epoch, self._sampler
        steps, wall, frac = self._live()
        waits = np.frombuffer(ep.waits[self.warmup :], dtype=np.float64) * 1e3
        p50, p95, wmax = (float(np.percentile(waits, 50)), float(np.percentile(waits, 95)), float(waits.max())) if len(waits) else (0.0, 0.0, 0.0)
        samples = ep.samples if ep.count is not None else None
        idle, idle_ms = ep.meter.result(wait=ep.end is not None) if ep.meter is not None else (None, None)
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
            gpu_idle_fraction=idle,
            gpu_idle_ms_per_step=idle_ms,
            gpu_mem_used_gb=max(s.gpu_mem) if s and s.gpu_mem else None,
            cpu_percent=float(np.mean(s.cpu)) if s and s.cpu else None,
            ram_used_gb=max(s.ram) if s and s.ram else None,
            data_bound=steps >= _MIN_STEPS_TO_WARN and frac > self.data_bound_threshold,
        )

    def summary_across_ranks(self, group: Any = None) -> dict[str, float]:
        """Under DDP, the running (or last) epoch's wait fraction of every rank: max, mean, the slowest rank.

        A collective (every rank calls it). Read the max: a rank whose loader keeps
        up waits for a data-bound peer inside the step, so its own wait reads ~0.
        See :func:`loaders.monitor_out.across_ranks`.
        """
        return across_ranks(self.summary(), group)

    def gpu_idle_gaps(self) -> dict[str, float]:
        """The GPU's idle gaps between steps of the running (or last) epoch: p50, p99, max, and the time in
        gaps over 5 ms (epoch starts, stalls) vs the rest ({} without CUDA events)."""
        meter = self._epoch.meter
        return meter.gap_stats() if meter is not None else {}

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
            sync: Callable[[], None] = torch.cuda.synchronize
            return sync
        return None

    def _idle_meter(self) -> Any:
        torch = sys.modules.get("torch")
        if self.gpu_idle is False or torch is None or not torch.cuda.is_available():
            return None
        if self.gpu_idle is None and not torch.cuda.is_initialized():
            return None
        from loaders.gpu_idle import GpuIdleMeter

        return GpuIdleMeter(torch)

    def _gpu_mean(self) -> float | None:
        """Mean NVML utilisation over the measured window (samples before warm-up ended are left out)."""
        s, start = self._sampler, self._epoch.start
        if not s or not s.gpu_util:
            return None
        util = np.asarray(s.gpu_util)
        if start is not None:
            late = util[np.asarray(s.gpu_times) >= start]
            util = late if len(late) else util
        return float(util.mean())

    def _check(self, ep: EpochCounters, summary: StallSummary | None, recent: float | None = None) -> None:
        """Warn (once per epoch and kind) when data-bound or when the GPU idles; cheap unless it warns.

        ``summary`` is the finished epoch's (None mid-epoch); ``recent`` the wait fraction since the previous
        mid-epoch check (None at the first one, which therefore never warns data-bound)."""
        steps, _, frac = self._live()
        if steps < _MIN_STEPS_TO_WARN:
            return
        gpu = self._gpu_mean()
        window_bound = summary is not None or (recent is not None and recent > self.data_bound_threshold)
        if frac > self.data_bound_threshold and window_bound and DataBoundWarning not in ep.warned:
            self._warn(ep, DataBoundWarning, data_bound_advice(summary or self.summary(), self.data_bound_threshold))
        if gpu is not None and gpu < self.low_gpu_util and LowGpuUtilWarning not in ep.warned:
            self._warn(ep, LowGpuUtilWarning, low_gpu_advice(summary or self.summary(), self.low_gpu_util, gpu))

    def _warn(self, ep: EpochCounters, kind: type[UserWarning], message: str) -> None:
        ep.warned.add(kind)
        if self.warn == "warnings":
            warnings.warn(message, kind, stacklevel=5)  # the user's for-loop
        elif self.warn == "logging":
            self.logger.warning("%s: %s", kind.__name__, message)


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
