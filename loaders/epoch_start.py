"""A loader's next pass decided when a trainer's epoch starts, so the trainer counts that epoch's batches.

An epoch's length can differ from the last one's (a :class:`~loaders.Mixture`
schedule's stage, a cache grown by ``--append``), and it is known only once
the pass that runs it is decided (:mod:`loaders.passes`; the generation is
decided then, by rank 0 under DDP). Lightning reads ``len(loader)`` once, when
it sets the loader up, and counts every epoch by it: a longer epoch was cut
there (its rest never trained on), and the ``on_train_epoch_start`` hooks
(callbacks, the progress bar's total, an LR schedule by steps) read the last
epoch's count.

Lightning calls ``set_epoch`` on a training DataLoader's sampler as each epoch
starts (``FitLoop.on_advance_start``, in every rank), before the
``on_train_epoch_start`` hooks and before it iterates the loader. A
:class:`~loaders.StreamLoader`'s sampler is an :class:`EpochStartSampler`
(what torch gives an ``IterableDataset``'s DataLoader, a sampler of ``None``s,
plus that ``set_epoch``): called by Lightning's fit loop for its own training
loader, it decides the loader's next pass there
(:meth:`~loaders.StreamLoader.prepare_pass`) and sets the fit loop's counts to
that pass's epoch (:func:`set_epoch_length`). The next ``iter()`` runs the
pass decided. This needs no ``LightningDataModule`` of ours: a user's own
``train_dataloader()`` returning ``make_loader(...)`` gets it too. Called by
anyone else (an evaluation loop, a user), ``set_epoch`` does nothing: the
loader's epoch follows its own rule, and :meth:`~loaders.StreamLoader.set_epoch`
is the way to name one.

Nothing here imports Lightning: the fit loop is recognised by its class name
in the caller's frame, and the trainer is read by its attributes.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator

from torch.utils.data import Sampler

if TYPE_CHECKING:
    from loaders.loader import StreamLoader

__all__ = ["EpochStartSampler", "set_epoch_length"]

_FIT_LOOPS = ("_FitLoop", "FitLoop")
"""Class names of Lightning's fit loop (2.x, 1.x)."""


class EpochStartSampler(Sampler[None]):
    """A :class:`~loaders.StreamLoader`'s sampler: ``None`` forever (as torch's own for an
    ``IterableDataset``), and a ``set_epoch`` that Lightning's fit loop calls at each epoch's start."""

    def __init__(self, loader: "StreamLoader") -> None:
        self._loader: Callable[[], StreamLoader | None] = weakref.ref(loader)  # (no cycle: the loader holds its sampler)

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None

    def set_epoch(self, epoch: int) -> None:
        """Lightning's epoch ``epoch`` starts: decide the loader's pass now and give the fit loop its count."""
        loader, fit = self._loader(), _calling_fit_loop()
        if loader is None or fit is None:
            return
        combined = getattr(fit, "_combined_loader", None)
        if combined is None or not any(dl is loader for dl in combined.flattened):
            return
        loader.prepare_pass()
        _warn_if_new_stream(loader, int(epoch))
        set_epoch_length(fit.trainer, loader)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a copy in another process has no loader to follow

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._loader = lambda: None


def _calling_fit_loop() -> Any:
    """Lightning's fit loop when ``set_epoch`` was called from its ``on_advance_start`` (through
    ``_set_sampler_epoch``), else None."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "on_advance_start" and type(owner).__name__ in _FIT_LOOPS and hasattr(owner, "trainer"):
            return owner
        frame = frame.f_back
    return None


def _warn_if_new_stream(loader: "StreamLoader", epoch: int) -> None:
    """A stream's first pass is epoch 0 whatever the trainer's epoch: a ``train_dataloader()`` making a new
    stream for every epoch (``reload_dataloaders_every_n_epochs``), or a resume from a checkpoint that
    does not hold the stream's state, would train epoch 0 again and again."""
    p = loader.stream._progress
    if epoch > 0 and p.epoch == 0 and p.passes == 1 and not p.told:
        warnings.warn(
            f"this loader's stream is new and runs its epoch 0 as the trainer's epoch {epoch} (each new ShardStream starts at epoch 0): "
            "return the same loader from train_dataloader(), call loader.set_epoch(self.trainer.current_epoch) before returning a new one, "
            "or use loaders.lightning.StreamDataModule",
            UserWarning,
            stacklevel=3,
        )


def set_epoch_length(trainer: Any, loader: "StreamLoader") -> None:
    """Set the fit loop's batch counts to ``loader``'s epoch: its limit in the combined loader
    (which Lightning's data fetcher reads when the pass begins), ``num_training_batches``
    (after ``limit_train_batches``) and the ``val_check_batch`` derived from it."""
    loop = trainer.fit_loop
    combined = getattr(loop, "_combined_loader", None)
    batches = limited(len(loader), trainer.limit_train_batches)
    if combined is None or combined.limits is None:
        loop.max_batches = batches
    else:
        for i, dl in enumerate(combined.flattened):
            if dl is loader:
                combined.limits[i] = batches  # in place: the iterator of a pass under way holds the same list
        loop.max_batches = max(combined.limits)  # (each limit is already at most its loader's length)
    _set_val_check_batch(trainer, loop.max_batches)


def _set_val_check_batch(trainer: Any, batches: int | float) -> None:
    """Lightning's ``val_check_batch`` for an epoch of ``batches``, where Lightning derives it from the
    epoch's length (a float ``val_check_interval``): it computes it once, from epoch 0's, so a longer
    epoch validated mid-way and not at its end, and a shorter one never validated. Left alone: an int
    interval, a time-based one, or an epoch of no length (``inf``)."""
    interval, current = trainer.val_check_interval, trainer.val_check_batch
    if isinstance(interval, int) or getattr(trainer, "_val_check_time_interval", None) is not None:
        return
    if current is None or current == float("inf") or batches == float("inf") or batches == 0:
        return
    trainer.val_check_batch = max(1, int(batches * interval))  # (as Lightning's fit loop computes it)


def limited(batches: int, limit: int | float | None) -> int | float:
    """``batches`` after Lightning's ``limit_train_batches`` (an int caps, a float is a fraction)."""
    if limit is None or batches == 0:
        return batches
    if isinstance(limit, int):
        return min(batches, limit)
    return int(batches * limit)
