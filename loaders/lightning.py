"""Lightning: a ``LightningDataModule`` whose checkpoints resume the stream exactly, under DDP too.

Lightning never calls ``set_epoch`` on a loader (only on a sampler), and it
restores a loader's ``state_dict`` only when it restarts in the middle of an
epoch. The stream's epoch rule (:mod:`loaders.passes`: each new pass is the
next epoch) takes care of the first; this module takes care of the second:
:class:`StreamDataModule` stores the loader's state in every checkpoint (as
the datamodule's own state, which Lightning always restores) and applies it
to the loader before Lightning starts iterating it, mid-epoch or at an epoch
boundary alike::

    from loaders import ShardStream
    from loaders.lightning import StreamDataModule

    dm = StreamDataModule(lambda: ShardStream(root, view="twins", batch_size=4096, seed=0), num_workers=4)
    trainer = lightning.Trainer(max_epochs=10, strategy="ddp", devices=8)
    trainer.fit(model, datamodule=dm)                  # and later: trainer.fit(model, datamodule=dm, ckpt_path=...)

The stream is built in ``train_dataloader()``, i.e. in every rank after the
process group exists, so each rank reads its own share. ``lightning`` (or
``pytorch_lightning``) is an optional dependency: ``pip install lightning``.
"""

from __future__ import annotations

from typing import Any, Callable

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as e:
        raise ImportError("loaders.lightning needs Lightning: pip install lightning") from e

from loaders.epoch_start import set_epoch_length
from loaders.loader import StreamLoader, make_loader
from loaders.stream import ShardStream

__all__ = ["StreamDataModule"]


class StreamDataModule(pl.LightningDataModule):
    """The training loader of a :class:`ShardStream`, with its position in checkpoints.

    Args:
        train: builds the training stream (called once, in each rank), or the stream itself
            (its rank and world size are read when it is iterated, inside each rank).
        **loader_kwargs: passed to :func:`loaders.make_loader` (``num_workers``,
            ``prefetch_factor``, ``pin_memory``, ...).

    A validation loader is the user's to add (subclass and define
    ``val_dataloader``: a ``make_loader`` whose ``set_epoch(0)`` is called
    before each validation pass, so every pass sees the same batches).

    Checkpoint contents (``state_dict``): the training loader's state (see
    :mod:`loaders.state`) and whether Lightning had finished that epoch, so a
    checkpoint taken at an epoch's end (even one cut short by
    ``limit_train_batches``, and a step checkpoint on that epoch's last batch)
    resumes with the next epoch from its start, as Lightning's own counters do.
    """

    def __init__(self, train: Callable[[], ShardStream] | ShardStream, **loader_kwargs: Any):
        super().__init__()
        if not isinstance(train, ShardStream) and not callable(train):
            raise TypeError(f"StreamDataModule(train=...) takes a ShardStream or a function that makes one, got {type(train).__name__}")
        self._train, self.loader_kwargs = train, loader_kwargs
        self.train_loader: StreamLoader | None = None
        self._pending: dict[str, Any] | None = None
        self._done_state: dict[str, Any] | None = None  # a loaded state whose epoch Lightning had finished

    def train_dataloader(self) -> StreamLoader:
        if self.train_loader is None:
            stream = self._train if isinstance(self._train, ShardStream) else self._train()  # a stream already made: its rank and world are read when iterated
            self.train_loader = make_loader(stream, **self.loader_kwargs)
            self._guard(self.train_loader)
            self._follow_epoch_length(self.train_loader)
        if self._pending is not None:
            self._apply(self.train_loader, self._pending)
            self._pending = None
        return self.train_loader

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position, and whether Lightning finished its epoch."""
        if self.train_loader is None:
            return dict(self._pending or {})
        unread = self.train_loader.stream._progress.unread  # a pass begun ahead, at an epoch's start: the state is already its
        return {"loader": self.train_loader.state_dict(), "epoch_done": _epoch_done(getattr(self, "trainer", None)) and not unread}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep ``state`` for the training loader (applied when Lightning asks for it, before iterating)."""
        self._pending = dict(state) if state else None
        self._done_state = None
        if self._pending is not None and self.train_loader is not None:
            self._apply(self.train_loader, self._pending)
            self._pending = None

    def _apply(self, loader: StreamLoader, state: dict[str, Any]) -> None:
        saved = state["loader"]
        loader.load_state_dict(saved)
        if state.get("epoch_done"):
            loader.set_epoch(int(saved["epoch"]) + 1)
            self._done_state = dict(saved)

    def _guard(self, loader: StreamLoader) -> None:
        """Lightning, restarting on an epoch's last batch, loads the loader's saved state itself after
        :meth:`_apply` (its own copy, taken with ours) and would undo the move to the next epoch:
        a load of that very state is followed by the same ``set_epoch``."""
        load = loader.load_state_dict

        def load_state_dict(state: Any) -> None:
            load(state)
            done = self._done_state
            if done is not None and dict(state) == done:
                loader.set_epoch(int(done["epoch"]) + 1)

        loader.load_state_dict = load_state_dict  # type: ignore[method-assign]

    def _follow_epoch_length(self, loader: StreamLoader) -> None:
        """Tell Lightning each epoch's own number of batches when its pass begins.

        Lightning reads ``len(loader)`` once, when it sets the loader up, and ends every epoch
        after that many batches. An epoch of a ``Mixture`` schedule, or of a cache that grew a
        generation, can hold more: Lightning cut it there, and the rest of the epoch was never
        trained on (the next pass starts the next epoch). Each pass now sets the fit loop's count
        (``trainer.num_training_batches``, after ``limit_train_batches``) to the epoch it runs.
        The loader's own sampler begins that pass as Lightning's epoch starts, before the
        ``on_train_epoch_start`` hooks (:mod:`loaders.epoch_start`, for any datamodule); this hook
        is its second line: it holds where that one finds no fit loop calling.
        """
        stream = loader.stream
        begin = stream.begin_pass

        def begin_pass() -> Any:
            world = begin()
            trainer = getattr(self, "trainer", None)
            if trainer is not None and getattr(trainer, "training", False):
                set_epoch_length(trainer, loader)
            return world

        stream.begin_pass = begin_pass  # type: ignore[method-assign]


def _epoch_done(trainer: Any) -> bool:
    """Will Lightning, resuming from a checkpoint taken now, start the next epoch?

    Yes once it has processed the epoch, and also on the epoch's last batch
    (``batch_progress.is_last_batch``: e.g. a step checkpoint on the last of
    ``limit_train_batches``), which Lightning's restart counts as the epoch's
    end; the loader, stopped short of its own end there, must then move on too
    rather than serve the cut epoch's remaining batches as the next epoch.
    """
    if trainer is None:
        return False
    loop = trainer.fit_loop
    progress = loop.epoch_progress.current
    if progress.started > 0 and progress.processed == progress.started:
        return True
    return bool(progress.started > 0 and loop.epoch_loop.batch_progress.is_last_batch)
