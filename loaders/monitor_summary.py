"""What the stall monitor counts and reports: one epoch's counters, its summary, its warnings.

:class:`StallSummary` is one epoch's measurements (what
:meth:`loaders.monitor.StallMonitor.summary` returns), :class:`EpochCounters`
the running counters of one pass (cheap per-step updates), and the two
warnings the monitor gives with their advice. Split out of
:mod:`loaders.monitor` so that :mod:`loaders.monitor_out` (tables, metrics,
plots) needs only this module.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Callable

__all__ = ["StallSummary", "EpochCounters", "DataBoundWarning", "LowGpuUtilWarning", "batch_counter", "data_bound_advice", "low_gpu_advice"]


class DataBoundWarning(UserWarning):
    """The trainer spent more than the threshold of its time waiting for batches."""


class LowGpuUtilWarning(UserWarning):
    """The GPU was busy less than the threshold percentage of the time."""


@dataclass(frozen=True)
class StallSummary:
    """One epoch's (or the running epoch's) measurements, over the steps after warm-up.

    ``gpu_util_mean`` (NVML, over the measured window) is None without NVML or a GPU;
    ``gpu_idle_*`` (CUDA events: the GPU's idle gaps between steps, see
    :mod:`loaders.gpu_idle`) are None without CUDA; ``cpu_percent`` (system-wide mean)
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
    gpu_idle_fraction: float | None
    gpu_idle_ms_per_step: float | None
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
        if self.gpu_idle_fraction is not None:
            parts.append(f"gpu idle {self.gpu_idle_fraction:.1%}")
        if self.gpu_util_mean is not None:
            parts.append(f"gpu {self.gpu_util_mean:.0f}% {self.gpu_mem_used_gb or 0:.1f} GB")
        if self.cpu_percent is not None:
            parts.append(f"cpu {self.cpu_percent:.0f}% ram {self.ram_used_gb:.1f} GB")
        return ", ".join(parts)


def batch_counter(batch_size: int | Callable[[Any], int] | None, samples_key: str | None, batch: Any) -> Callable[[Any], int] | None:
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

            def rows_of(b: Any, key: Any = k) -> int:
                return int(b[key].shape[0])

            return rows_of
    return None


class EpochCounters:
    """Running counters of one pass over the loader (slots: cheap per-step updates)."""

    __slots__ = ("waits", "arrivals", "steps", "samples", "wait_s", "start", "end", "first_batch_s", "warned", "count", "next_event", "mark", "check_mark", "meter")

    def __init__(self) -> None:
        self.waits = array("d")
        self.arrivals = array("d")  # perf_counter when each batch arrived (throughput over steps, for plots)
        self.steps = self.samples = 0
        self.wait_s = 0.0
        self.start: float | None = None
        self.end: float | None = None
        self.first_batch_s: float | None = None
        self.warned: set[type] = set()
        self.count: Callable[[Any], int] | None = None
        self.next_event = 1  # the first step resolves the batch-size counter
        self.mark: tuple[float, int, float, int] = (0.0, 0, 0.0, 0)  # (time, steps, wait_s, samples) at the last log line
        self.check_mark: tuple[float, float] | None = None  # (time, wait_s) at the last mid-epoch check
        self.meter: Any = None  # GpuIdleMeter when CUDA is in use


def data_bound_advice(sm: StallSummary, threshold: float) -> str:
    return (
        f"training is data-bound: the loop waited for its next batch {sm.wait_fraction:.0%} of the time "
        f"({sm.wait_s:.2f} s of {sm.wall_s:.2f} s over {sm.steps} steps, p95 wait {sm.wait_p95_ms:.1f} ms; threshold {threshold:.0%}). "
        "To feed it faster: (1) more loader workers (num_workers, up to the free CPU cores; for twins batches of "
        "compact='pool', whose work is the TwinsContext's decode in this process, TwinsContext(..., decoder='process', processes=N) instead); "
        "(2) a deeper prefetch (prefetch_factor: more batches in flight); "
        "(3) no decompression and no disk: a raw cache on tmpfs, `cachebuild generate --codec none` then `make ramdisk-stage`; "
        "(4) larger blocks/batches, so per-batch overhead is paid less often."
    )


def low_gpu_advice(sm: StallSummary, low: float, util: float | None = None) -> str:
    """The LowGpuUtilWarning text; ``util``: the utilisation that was checked (default: the summary's)."""
    shown = sm.gpu_util_mean if util is None else util
    why = (
        "the GPU idles while the loop waits for data: follow the data-bound advice (more workers, deeper prefetch, raw cache on tmpfs)"
        if sm.data_bound
        else "the loop is not waiting for data, so each step gives the GPU too little work: larger batches, fewer host syncs per step (.item(), .cpu(), printing), mixed precision or torch.compile"
    )
    return f"GPU utilisation averaged {shown:.0f}% (< {low:.0f}%) over {sm.wall_s:.1f} s: {why}."
