"""``make_loader``: a torch DataLoader over a :class:`ShardStream`, with epochs and exact resume.

Batches are built whole inside the workers (``batch_size=None``), each in one
buffer (:class:`loaders.batch.PackedBatch`) that is one of the worker's
reusable shared-memory slots (:mod:`loaders.slots`); the main process copies it
out once into pinned memory when pinning (CUDA present, in the DataLoader's pin
thread), else hands out ``key -> tensor`` views of the slot itself, freed when
the consumer drops them. The loader counts what it hands to the
trainer, not what the workers prefetched, so ``state_dict()`` after any batch
resumes exactly there.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator, Mapping

import torch
import numpy as np
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_convert

from cachebuild.errors import PassSupersededError, SharedMemoryError
from loaders.batch import Batch, PackedBatch
from loaders.epoch_start import EpochStartSampler
from loaders.fork_settle import settle_before_fork
from loaders.handover import Handover, clean_worker_error
from loaders.planned import close_pool_process, decode_where, handover_patience, planned_here
from loaders.shared_pools import SharedPools, shared_pools_for
from loaders.slots import ZERO_COPY_HELD, SlotRings, register, unregister
from loaders.state import make_state
from loaders.stream import ShardStream
from loaders.world import detect_ranks

__all__ = ["StreamLoader", "make_loader", "loader_state", "default_workers", "shutdown_workers", "SHM_PATH", "share_pools", "usable_cores"]

SHM_PATH = "/dev/shm"


def default_workers() -> int:
    """Workers when none are asked for: one per core but one, at most 8, at least 1."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


class StreamLoader(DataLoader[Any]):
    """A DataLoader of a :class:`ShardStream` that also has ``set_epoch``, ``state_dict``, ``load_state_dict``.

    Iterating it yields ``dict`` batches (:class:`loaders.batch.Batch`) in the
    plan's order whatever the number of workers. It is a plain iterable, so
    wrappers (a stall monitor, :func:`loaders.to_device`) compose around it.
    """

    def __init__(self, stream: ShardStream, handover: int = 2, shared_pools: bool | None = None, **kwargs: Any):
        self.stream = stream
        self.handover = int(handover)
        self.share_pools = shared_pools
        self._ahead: Handover | None = None
        super().__init__(stream.for_loader(), batch_size=None, **kwargs)
        object.__setattr__(self, "sampler", EpochStartSampler(self))  # (torch refuses a sampler for an IterableDataset; loaders.epoch_start)
        self._lookahead = 0
        self._new_slots()

    def _new_slots(self) -> None:
        """Reusable shared-memory batch slots for the workers about to start (see :mod:`loaders.slots`).

        Called before workers are created: once for persistent workers, before
        every pass otherwise, and after workers were stopped by an error (a
        batch they left in a queue would keep its slot busy).
        """
        driven: ShardStream = self.dataset  # type: ignore[assignment]
        if driven.slot_rings is not None:
            unregister(driven.slot_rings)
            driven.slot_rings = None
        driven.shared_pools = None
        if self.num_workers > 0 and not self._planned_here():
            try:
                driven.slot_rings = SlotRings(self.num_workers, slot_count(self.prefetch_factor or 2), driven.layout.nbytes)
            except (RuntimeError, OSError) as exc:  # torch: "unable to allocate shared memory(shm) ..."; ENOSPC
                why = shm_shortfall(driven, self.num_workers, self.prefetch_factor or 2) or f"reserving the workers' batch slots in {SHM_PATH} failed"
                raise SharedMemoryError(f"{why} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r})") from exc
            register(driven.slot_rings, self)
            driven.shared_pools = self._shared_pools(driven)

    def _shared_pools(self, driven: ShardStream) -> SharedPools | None:
        """Decoded pools the workers share (:mod:`loaders.shared_pools`), for views that keep pools decoded."""
        if self.num_workers < 2 or getattr(driven.view, "store", None) is None or not share_pools(self.share_pools, self.num_workers):
            return None
        try:
            plan = driven.plan()
        except Exception:  # (a closed schedule, ...) the pass itself says what is wrong
            return None
        return shared_pools_for(driven.view, plan, self.num_workers, self.multiprocessing_context)

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        if self.num_workers > 0 and not self.persistent_workers:
            self._new_slots()
        if self._ahead is not None:  # a pass left unfinished: its thread must let go of the workers first
            self._ahead.close()
            self._ahead = None
        self.stream.begin_pass()  # the stream the trainer holds: its generation (and state) follow the pass
        token = self.stream._progress.token  # this pass counts while it holds it (loaders.passes)
        self._lookahead = 0
        decode_where(self)  # (pooled records: in a process of the store's own when planned here)
        if self._direct() or self._planned_here():
            return self._deliver(iter(self.dataset), token)
        settle_before_fork(self)  # (DDP, Python <= 3.11: a fork right after begin_pass's collective can hang)
        return self._deliver(super().__iter__(), token)

    def _direct(self) -> bool:
        """Whether a pass may read the stream itself rather than through torch's single-process iterator:
        without workers, pinning or a collate_fn of the caller's, that iterator only hands each batch on
        (through a fetcher, ``default_convert`` and a profiler span: ~40 us a batch, a sixth of a small
        batch's time), so the batches are the same either way."""
        return self.num_workers == 0 and not self.pin_memory and self.collate_fn is default_convert

    def _planned_here(self) -> bool:
        """Whether a pass with workers is planned on the hand-over thread of this process instead of in
        worker processes (``twins`` with ``compact="pool"``, pooled ``records``: :mod:`loaders.planned`)."""
        return planned_here(self)

    def _deliver(self, it: Iterator[PackedBatch], token: int) -> Iterator[Batch]:
        progress = self.stream._progress
        here = self._planned_here()
        depth = self.num_workers * (self.prefetch_factor or 2) if here else self.handover  # planned here: what workers would prefetch
        prepare = _pinned_unpack if here and self.pin_memory and torch.cuda.is_available() else PackedBatch.unpack
        ahead = None
        try:  # (made inside: a Ctrl-C right after the thread starts still closes it, in ``finally``)
            ahead = self._ahead = Handover(it, prepare, depth, shared=here, patience_s=handover_patience(self)) if self.handover > 0 and self.num_workers > 0 else None
            # unpack: copied out of the worker's slot (already done when pinned); on the
            # handover thread when there is one. Progress counts what the trainer receives,
            # while this pass holds its token: superseded (load_state_dict, set_epoch, a newer
            # pass), it raises before taking another batch from the workers.
            progress.check(token)
            for batch in ahead if ahead is not None else map(PackedBatch.unpack, it):
                progress.advance()
                yield batch
                progress.check(token)
        except PassSupersededError:
            if self.num_workers > 0 and not self.persistent_workers:
                self._stop_workers(it)  # now, not at a later garbage collection of this pass (torch waits 5 s per worker there)
            raise  # persistent workers stay: they serve the next pass
        except Exception as exc:
            if ahead is not None:
                ahead.close()
            self._stop_workers(it)
            clean = clean_worker_error(exc)  # a worker's cachebuild error: its one-line message, not torch's traceback text
            if clean is not exc:
                raise clean from exc
            raise
        finally:
            if ahead is not None:
                ahead.close()

    def _stop_workers(self, it: Iterator[PackedBatch]) -> None:
        """After a worker's error: stop the workers now (not at some later garbage collection, where
        torch's shutdown can wait 5 s per worker), and let the next pass start fresh ones."""
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if getattr(self, "_iterator", None) is it:
            self._iterator = None
        self._new_slots()

    def note_lookahead(self, n: int) -> None:
        """A consumer (``to_device``) took ``n`` batches ahead of the trainer (negative: handed them over);
        ``state_dict`` leaves batches taken ahead out of the position."""
        self._lookahead += n

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (see :meth:`ShardStream.set_epoch`)."""
        self.stream.set_epoch(epoch)

    def prepare_pass(self) -> None:
        """Decide the next pass now, so ``len(loader)`` is its epoch's; the next ``iter()`` runs it (:mod:`loaders.epoch_start`)."""
        if not self.stream._progress.unread:
            self.stream.begin_pass()

    def state_dict(self) -> dict[str, Any]:
        """The trainer's position: batches it received, minus any a wrapper took ahead."""
        state = self.stream.state_dict()
        if self._lookahead:
            p = self.stream._progress
            state["position"] -= self._lookahead * p.world_size
            state["batches"] -= self._lookahead
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` at the next pass (any worker count, any world size)."""
        self.stream.load_state_dict(state)
        self._lookahead = 0

    def __len__(self) -> int:
        return len(self.stream)


def _pinned_unpack(batch: PackedBatch) -> Batch:
    """A batch planned in this process, pinned (one copy of its buffer) and viewed key by key."""
    return batch.pin_memory().unpack()


def loader_state(loader: DataLoader[Any]) -> dict[str, Any]:
    """The exact resume state of any DataLoader over a :class:`ShardStream`, after the batches it handed out.

    A :class:`StreamLoader` (``make_loader``) knows it: its ``state_dict()``. A
    plain ``torch`` DataLoader does not tell the stream what it handed to the
    trainer, so its state is read here from the loader: the pass its workers run
    (the stream's shared block) and the batches its iterator yielded (torch's
    ``_num_yielded``). That needs ``persistent_workers=True`` (the loader keeps
    its iterator) or ``num_workers=0`` (the stream counts itself).
    """
    if isinstance(loader, StreamLoader):
        return loader.state_dict()
    stream = getattr(loader, "dataset", None)
    if not isinstance(stream, ShardStream):
        raise TypeError(f"loader_state needs a DataLoader over a ShardStream, got a dataset of type {type(stream).__name__}")
    if loader.num_workers == 0:
        return stream.state_dict()
    it = getattr(loader, "_iterator", None)
    if not loader.persistent_workers or it is None or not hasattr(it, "_num_yielded"):
        raise RuntimeError("a DataLoader with non-persistent workers forgets its iterator: use persistent_workers=True, or loaders.make_loader(stream), whose state_dict() is exact")
    rank, ws = detect_ranks(stream._rank, stream._world_size, env_fallback=True)
    yielded = int(it._num_yielded)
    if yielded == 0:  # before a pass's first batch its workers may still be recording the pass
        stream._control.settle(loader.num_workers)
    epoch, start = stream._control.worker_epoch(), stream._control.worker_start()
    return stream._stamp(
        make_state(epoch, start + yielded * ws, stream.config, stream.fingerprint, ws, yielded, stream._control.instructed_generation()[0])
    )  # a mixture adds its caches (and their generations)


def shutdown_workers(loader: Any) -> None:
    """Stop a DataLoader's (persistent) workers now, not at some later garbage collection
    (where torch's shutdown can wait seconds per worker, or run in a forked child)."""
    ahead = getattr(loader, "_ahead", None)
    if ahead is not None:  # first the hand-over thread lets go of the workers (bounded wait)
        ahead.close()
        loader._ahead = None
    close_pool_process(loader)
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    if hasattr(loader, "_iterator"):
        loader._iterator = None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share_pools(choice: bool | None, workers: int) -> bool:
    """Whether ``workers`` DataLoader workers share decoded pools (``choice``: ``None`` is auto).

    Auto shares when the workers and the main processes of this node's ranks do not
    all have a core of their own (``(workers + 1) x LOCAL_WORLD_SIZE > usable_cores()``;
    torchrun sets ``LOCAL_WORLD_SIZE``, 1 without it): there each record decoded once
    instead of once per worker is CPU freed for the others (mel 1.34x at 2 workers
    on 2 cores). With a core to spare for every worker, duplicated decodes run in
    parallel at no cost, while sharing makes workers wait on one another's decode:
    on a 16-core H100 machine, 8 workers fed the causal trainer 15-20 % slower shared
    (docs/DECISIONS.md, "Shared pools")."""
    if choice is not None:
        return bool(choice)
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return (workers + 1) * local_ranks > usable_cores()


def shm_free_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes of the shared-memory filesystem, ``None`` where it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def slot_count(prefetch_factor: int) -> int:
    """Shared-memory batch slots per worker: the batches in flight, two spare, and the zero-copy batches a consumer may hold (:mod:`loaders.slots`)."""
    return prefetch_factor + 2 + ZERO_COPY_HELD


class SharedMemoryWarning(ResourceWarning):
    """``/dev/shm`` has less free space than the workers' batch slots need (shown by default:
    Python's filters hide plain ``ResourceWarning``, so this module puts a filter for this class first)."""


warnings.filterwarnings("default", category=SharedMemoryWarning)


def shm_shortfall(stream: ShardStream, num_workers: int, prefetch_factor: int) -> str | None:
    """Why ``/dev/shm`` cannot hold the workers' batch slots (the numbers and the remedies), or None where it can
    (or its free space cannot be read)."""
    slots = slot_count(prefetch_factor)
    need = num_workers * slots * stream.layout.nbytes
    free = shm_free_bytes()
    if free is None or need <= free:
        return None
    return (
        f"{SHM_PATH} has {free / 2**20:.0f} MiB free, but {num_workers} workers x (prefetch {prefetch_factor} + {slots - prefetch_factor}) x "
        f"{stream.layout.nbytes / 2**20:.1f} MiB per batch need {need / 2**20:.0f} MiB of shared memory for their batch slots. "
        f"Lower num_workers, prefetch_factor or batch_size (or compact=True for twins), or enlarge {SHM_PATH} "
        f"(docker: --shm-size)."
    )


def _check_shm(stream: ShardStream, num_workers: int, prefetch_factor: int) -> None:
    """Warn (:class:`SharedMemoryWarning`, shown by default) when ``/dev/shm`` looks too small for the slots.

    The slots are reserved in full when the loader is made (torch allocates shared memory
    eagerly, so a worker never dies of a bus error mid-epoch); where the reservation then
    fails, :meth:`StreamLoader._new_slots` raises :class:`~cachebuild.errors.SharedMemoryError`
    with the same numbers. A warning, not a refusal, because free space is a snapshot: other
    processes free and take ``/dev/shm`` between this check and the reservation."""
    why = shm_shortfall(stream, num_workers, prefetch_factor)
    if why is not None:
        warnings.warn(why + " Workers may fail to start.", SharedMemoryWarning, stacklevel=3)


_STREAM_ARGS = ("shuffle", "drop_last", "batch_size")
"""DataLoader arguments that are the stream's: passed to make_loader they would be ignored or refused in torch's words."""


def _refuse_stream_args(kwargs: Mapping[str, Any]) -> None:
    for name in _STREAM_ARGS:
        if name in kwargs:
            raise TypeError(f"make_loader: {name} is the stream's, not the loader's: pass ShardStream(..., {name}={kwargs[name]!r})")
    for name in ("sampler", "batch_sampler"):
        if name in kwargs:
            raise TypeError(f"make_loader: {name} cannot apply: the stream's epoch plan orders and batches the records (ShardStream's seed, shuffle, window)")


def make_loader(
    dataset: ShardStream,
    num_workers: int | None = None,
    prefetch_factor: int | None = 4,
    pin_memory: bool | None = None,
    persistent_workers: bool = True,
    multiprocessing_context: Any = None,
    timeout: float = 0,
    handover: int = 2,
    shared_pools: bool | None = None,
    **dataloader_kwargs: Any,
) -> StreamLoader:
    """A :class:`StreamLoader` for ``dataset`` with defaults for streaming.

    Args:
        dataset: the stream (its epoch and progress stay shared with the loader).
        num_workers: worker processes (default :func:`default_workers`: cores - 1, 1..8);
            0 builds batches in the main process.
        prefetch_factor: batches each worker builds ahead (default 4: deep, since a
            batch is large and built whole; ``None``: torch's 2; ignored without workers).
        pin_memory: pin batches for fast, asynchronous copies
            (default: ``torch.cuda.is_available()``).
        persistent_workers: keep workers (open shards, cached plan) between epochs.
        handover: batches a main-process thread receives from the workers ahead of
            the trainer (default 2; 0: receive in the trainer's ``next()``), so the
            ~1 ms hand-over per batch overlaps the training step (see :mod:`loaders.handover`).
        shared_pools: whether workers decode each ``twins``/``mel`` pool once into shared
            memory for all of them (:mod:`loaders.shared_pools`); default ``None``: when the
            workers and the main process outnumber the usable cores (:func:`share_pools`).
            Batches are the same either way.
        multiprocessing_context, timeout, **dataloader_kwargs: passed to DataLoader.
            The default start method is the process's own: in a rank started
            with ``torch.multiprocessing.spawn`` that is ``spawn``, which
            re-imports torch in every worker (seconds); pass ``"fork"`` there.

    Warns (:class:`SharedMemoryWarning`, a ``ResourceWarning`` shown by default) when
    ``/dev/shm`` has less free space than the workers' batch slots take, all reserved now:
    ``num_workers x (prefetch_factor + 6) x batch bytes`` (:func:`slot_count`), and raises
    :class:`~cachebuild.errors.SharedMemoryError` with the same numbers where the reservation
    then fails (not torch's allocator message); raises
    ``TypeError`` for ``shuffle``, ``drop_last``, ``batch_size`` (the stream's: pass them
    to :class:`ShardStream`), ``sampler`` and ``batch_sampler``.
    """
    if not isinstance(dataset, ShardStream):
        raise TypeError(f"make_loader needs a ShardStream, got {type(dataset).__name__}")
    _refuse_stream_args(dataloader_kwargs)
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0):
        raise ValueError(f"num_workers must be a whole number >= 0, got {num_workers!r}")  # int() made 2.5 two workers, True one
    workers = default_workers() if num_workers is None else int(num_workers)
    pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
    kwargs: dict[str, Any] = dict(num_workers=workers, pin_memory=pin, timeout=timeout, **dataloader_kwargs)
    if workers > 0:
        prefetch = 2 if prefetch_factor is None else int(prefetch_factor)  # None: torch's default
        if prefetch < 1:
            raise ValueError(f"prefetch_factor must be >= 1 with num_workers > 0, got {prefetch_factor}")
        kwargs.update(prefetch_factor=prefetch, persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context)
        _check_shm(dataset, workers, prefetch)
    return StreamLoader(dataset, handover=handover, shared_pools=shared_pools, **kwargs)
