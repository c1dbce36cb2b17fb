"""Drain batches under a :class:`~loaders.monitor.StallMonitor`, with a consumer standing in for the step.

Consumers: ``step_ms`` sleeps that long per batch (a GPU step that leaves the
CPU free); ``"model"`` trains a small MLP on the batch on the GPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from cachebuild.errors import ConfigError, OutputError
from loaders.monitor import StallMonitor, StallSummary

__all__ = ["drain", "make_consumer", "resolve_device", "ModelConsumer"]


class ModelConsumer:
    """A small MLP trained on the batch's main float tensor (GPU only)."""

    def __init__(self, device: Any):
        import torch

        self.torch, self.device = torch, device
        self.model: Any = None
        self.opt: Any = None

    def _main(self, batch: dict[str, Any]) -> Any:
        for key in ("mel", "target_row", "base"):
            if key in batch:
                return batch[key]
        tensors = [v for v in batch.values() if isinstance(v, self.torch.Tensor)]
        for v in tensors:
            if v.is_floating_point():
                return v
        return tensors[0]

    def __call__(self, batch: dict[str, Any]) -> None:
        torch = self.torch
        x = self._main(batch).to(self.device, non_blocking=True)
        x = x.reshape(x.shape[0], -1).float()
        if self.model is None:
            nn = torch.nn
            self.model = nn.Sequential(nn.Linear(x.shape[1], 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1)).to(self.device)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize(self.device)


def make_consumer(kind: str, step_ms: float, device: Any) -> Callable[[Any], None] | None:
    """The consumer of ``kind`` (``none``, ``sleep``, ``model``); ``None`` when nothing consumes."""
    if kind == "model":
        return ModelConsumer(device)
    if step_ms > 0:
        seconds = step_ms / 1e3
        return lambda batch: time.sleep(seconds)
    return None


def resolve_device(device: str | None) -> Any:
    """``auto``/``None`` -> CUDA when present, else CPU; a named CUDA device without CUDA is a ConfigError."""
    import torch

    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"--device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    return dev


def _epochs(make_batches: Callable[[int], Iterable[Any]]) -> Iterator[Any]:
    """Batches of epoch 0, 1, ... until an epoch yields none."""
    epoch = 0
    while True:
        got = False
        for b in make_batches(epoch):
            got = True
            yield b
        if not got:
            return
        epoch += 1


def drain(
    make_batches: Callable[[int], Iterable[Any]],
    count: Callable[[Any], int],
    consume: Callable[[Any], None] | None,
    seconds: float | None,
    max_batches: int | None,
    plot: Path | None = None,
) -> tuple[StallSummary, int]:
    """Run ``consume`` over batches (epoch after epoch) under a StallMonitor until a limit; ``(summary, batches)``.

    ``make_batches(epoch)`` gives an epoch's batches, ``count(batch)`` its
    samples. ``seconds`` counts from the end of the first (warm-up) batch, which the
    monitor leaves out too, so a slow first step (CUDA and cuBLAS set-up) does not end
    the run before anything was measured. ``plot``: also draw the monitor's wait and throughput over steps to this PNG."""
    monitor = StallMonitor(batch_size=count, warmup=1, sample_every_s=None, warn=None)
    done = 0
    t0 = time.perf_counter()
    it = monitor.wrap(_epochs(make_batches))
    try:
        for batch in it:
            if consume is not None:
                consume(batch)
            done += 1
            if done == 1:  # the clock starts after the warm-up batch (a model's first step can take seconds)
                t0 = time.perf_counter()
            if max_batches is not None and done >= max_batches:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
    finally:
        it.close()
    summary = monitor.summary()
    monitor.close()
    if plot is not None:
        try:
            monitor.plot(plot, title=f"cachebuild bench: {done} batches")
        except OSError as exc:  # a disk that filled up or went read-only during the run
            raise OutputError(f"--plot {plot}: cannot write the PNG: {exc.strerror or exc}") from None
    return summary, done
