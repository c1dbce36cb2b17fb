"""Where a :class:`~loaders.monitor.StallMonitor`'s numbers go: any logger, TensorBoard, a table, a picture.

* ``StallMonitor(log_every=N, on_log=hook)`` calls ``hook(metrics, step)``
  every ``N`` steps (the window since the previous call) and once at each
  epoch's end (the whole epoch), with a flat ``dict[str, float]``
  (:data:`METRIC_KEYS`) and the monitor's global step (across epochs). Any
  logger fits: ``wandb.log(m, step=s)``, ``lightning_module.log_dict(m)``,
  ``mlflow.log_metrics(m, step=s)``, or :func:`tensorboard_hook` for a
  ``torch.utils.tensorboard.SummaryWriter`` (needs ``pip install tensorboard``).
* :func:`summary_table` (``StallMonitor.table()``, logged at each epoch's end
  with ``epoch_table=True``): one row per epoch.
* :func:`across_ranks` (``StallMonitor.summary_across_ranks()``): under DDP,
  every rank's wait fraction in one dict. Needed because a rank whose own
  loader keeps up waits for a data-bound peer inside the step's collective
  (step time, not wait), so rank 0 alone can read 0 % while the job is data-bound.
* :func:`plot_steps` (``StallMonitor.plot(path)``, ``cachebuild bench --plot``):
  wait per step and throughput over steps, every epoch one after the other,
  as a PNG (needs ``pip install matplotlib``; drawn off-screen, no display).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from loaders.monitor_summary import StallSummary

__all__ = ["METRIC_KEYS", "summary_metrics", "across_ranks", "tensorboard_hook", "summary_table", "plot_steps"]

METRIC_KEYS = (
    "data/wait_fraction",
    "data/wait_p50_ms",
    "data/wait_p95_ms",
    "data/batches_per_s",
    "data/samples_per_s",
    "sys/gpu_util",
    "sys/gpu_mem_gb",
    "sys/cpu_percent",
    "sys/ram_gb",
)
"""Keys a logging hook may receive (those without a value, e.g. GPU on a CPU machine, are left out)."""

LogHook = Callable[[dict[str, float], int], None]


def summary_metrics(sm: "StallSummary") -> dict[str, float]:
    """An epoch's summary as the hook's flat dict (``epoch/`` keys: whole-epoch values)."""
    values = {
        "data/wait_fraction": sm.wait_fraction,
        "data/wait_p50_ms": sm.wait_p50_ms,
        "data/wait_p95_ms": sm.wait_p95_ms,
        "data/batches_per_s": sm.batches_per_s,
        "data/samples_per_s": sm.samples_per_s,
        "sys/gpu_util": sm.gpu_util_mean,
        "sys/gpu_mem_gb": sm.gpu_mem_used_gb,
        "sys/cpu_percent": sm.cpu_percent,
        "sys/ram_gb": sm.ram_used_gb,
    }
    return {f"epoch/{k}": float(v) for k, v in values.items() if v is not None}


def tensorboard_hook(writer: Any) -> LogHook:
    """A hook writing each metric as a TensorBoard scalar; ``writer`` is a ``SummaryWriter`` or a log directory."""
    if isinstance(writer, (str, Path)):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's writer needs the tensorboard package
            raise ImportError("TensorBoard logging needs the tensorboard package: pip install tensorboard") from e
        writer = SummaryWriter(str(writer))

    def hook(metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)

    hook.writer = writer  # type: ignore[attr-defined]
    return hook


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def summary_table(history: Sequence["StallSummary"]) -> str:
    """One row per epoch: steps, wait share and percentiles, throughput, first batch, GPU and CPU."""
    head = ("epoch", "steps", "wait", "p50 ms", "p95 ms", "max ms", "batches/s", "samples/s", "first s", "gpu %", "cpu %")
    rows = [head]
    for i, sm in enumerate(history):
        rows.append(
            (
                str(i),
                str(sm.steps),
                f"{sm.wait_fraction:.1%}",
                f"{sm.wait_p50_ms:.1f}",
                f"{sm.wait_p95_ms:.1f}",
                f"{sm.wait_max_ms:.1f}",
                f"{sm.batches_per_s:.1f}",
                _cell(sm.samples_per_s, ",.0f"),
                _cell(sm.first_batch_s, ".3f"),
                _cell(sm.gpu_util_mean, ".0f"),
                _cell(sm.cpu_percent, ".0f"),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rate(arrivals: np.ndarray, window: int) -> np.ndarray:
    """Batches per second at each step, over the last ``window`` arrivals (NaN for the first)."""
    out = np.full(len(arrivals), np.nan)
    if len(arrivals) > 1:
        k = np.arange(1, len(arrivals))
        lo = np.maximum(k - window, 0)
        span = arrivals[k] - arrivals[lo]
        out[1:] = np.where(span > 0, (k - lo) / np.where(span > 0, span, 1.0), np.nan)
    return out


def plot_steps(traces: Sequence[tuple[np.ndarray, np.ndarray]], path: str | Path, title: str = "", window: int = 20) -> Path:
    """Draw wait per step (ms) and batches/s over steps to ``path`` (PNG); ``traces``: per epoch, (waits s, arrival times s)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)  # off-screen: works on a headless machine
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install matplotlib") from e
    if not traces or not any(len(w) for w, _ in traces):
        raise ValueError("nothing to plot: the monitor has not timed any step yet")
    fig, (ax_wait, ax_rate) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    offset = 0
    for epoch, (waits, arrivals) in enumerate(traces):
        steps = offset + np.arange(len(waits))
        ax_wait.plot(steps, np.asarray(waits) * 1e3, lw=0.8, label=f"epoch {epoch}")
        ax_rate.plot(steps, _rate(np.asarray(arrivals), window), lw=0.8)
        if offset:
            for ax in (ax_wait, ax_rate):
                ax.axvline(offset, color="grey", lw=0.5, ls="--")
        offset += len(waits)
    ax_wait.set_ylabel("wait for batch (ms)")
    ax_wait.set_yscale("symlog", linthresh=1.0)
    ax_rate.set_ylabel(f"batches/s (last {window})")
    ax_rate.set_xlabel("step")
    if len(traces) <= 10:
        ax_wait.legend(loc="upper right", fontsize="small")
    fig.suptitle(title or "data loading: wait per step and throughput")
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)  # also when the write fails (a figure left open keeps its memory)
    return path


def across_ranks(sm: "StallSummary", group: Any = None) -> dict[str, float]:
    """Every rank's wait fraction and batches/s, gathered: a collective, every rank of ``group`` calls it.

    Returns ``ranks``, ``wait_fraction_max`` (the number to read: the job is as
    data-bound as its worst rank), ``wait_fraction_mean``, ``slowest_rank`` (the
    rank of that max) and ``batches_per_s_min``. Without an initialised
    ``torch.distributed``: this process's numbers, ``ranks`` 1.
    """
    import torch
    import torch.distributed as dist

    mine = [float(sm.wait_fraction), float(sm.batches_per_s)]
    if not (dist.is_available() and dist.is_initialized()):
        rows = torch.tensor([mine], dtype=torch.float64)
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
        rows = torch.zeros(world, 2, dtype=torch.float64, device=device)
        rows[rank] = torch.tensor(mine, dtype=torch.float64)
        dist.all_reduce(rows, group=group)  # each rank filled only its own row: the sum is the gather
        rows = rows.cpu()
    waits = rows[:, 0]
    return {
        "ranks": float(len(rows)),
        "wait_fraction_max": float(waits.max()),
        "wait_fraction_mean": float(waits.mean()),
        "slowest_rank": float(int(waits.argmax())),
        "batches_per_s_min": float(rows[:, 1].min()),
    }
