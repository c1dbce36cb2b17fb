"""``ShardStream``: a streaming ``IterableDataset`` of fixed-shape batches from a cache directory.

It composes the parts: the manifest (what the cache holds), a view (how
records become batches, :mod:`loaders.views`), the epoch plan (which items go
in which batch, :mod:`loaders.plan`), the block reader (records by id from
memory-mapped shards, :mod:`loaders.blockread`) and the world (rank, worker,
:mod:`loaders.world`, read when iteration starts). Batches are built whole,
where the stream runs (a DataLoader worker, or the main process), so the
DataLoader is used with ``batch_size=None``.

The cache may be a local folder (or ``file://`` URL), or remote
(``http(s)://``, ``s3://``, any fsspec URL): then every process fetches only
the shards its own batches touch, in the order it touches them and a few
ahead, into a bounded local cache directory (:mod:`loaders.remote`), and
closes each shard's mapping once its batches are built.

Progress (epoch, global position) lives in the main process's stream object;
DataLoader workers receive the epoch, start position and world at the start
of every pass through a small shared-memory block, which also reaches
persistent workers.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from cachebuild.format.malloc import tune_malloc
from cachebuild.format.manifest import read_manifest
from loaders.batch import Batch, Layout, PackedBatch
from loaders.plan import DEFAULT_WINDOW, EpochPlan
from loaders.remote import RemoteOptions, fetch_manifest, is_remote
from loaders.shards import RemoteFiles, ShardSet, check_shard_files, local_path
from loaders.slots import SlotRings
from loaders.state import PlanConfig, cache_fingerprint, check_state, make_state
from loaders.views import make_view
from loaders.world import World, detect_ranks, worker_part

__all__ = ["ShardStream"]

# Slots of the shared control block handed to DataLoader workers.
_VALID, _EPOCH, _START, _RANK, _WORLD = range(5)

# Remote caches: the fetcher is handed the shard order of this many batches at a time.
_PLAN_CHUNK = 64


def batch_shards(plan: EpochPlan, ids: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """The shards (ascending) holding the records of each global batch in ``ids``, from the plan alone.

    A batch holds records of a contiguous (cyclic) range of epoch positions
    (:meth:`EpochPlan.record_spans`; in a mixed plan, its pools' records).
    """
    n, total, B = len(plan.order), plan.total, plan.batch_size
    if not len(ids) or total < 1:
        return []
    shard_of = np.searchsorted(starts, plan.order, side="right") - 1  # shard of each epoch-order position
    if B >= total:
        every = np.unique(shard_of)
        return [every] * len(ids)
    a, z = plan.record_spans(ids)
    out = []
    for lo, hi in zip(a.tolist(), z.tolist()):
        part = shard_of[lo : hi + 1] if lo <= hi else np.concatenate([shard_of[lo:n], shard_of[: hi + 1]])
        out.append(np.unique(part))
    return out


def shard_schedule(per_batch: list[np.ndarray]) -> tuple[list[list[int]], list[list[int]]]:
    """Per batch: the shards opened before building it, and those closed after (not needed by the next batch)."""
    sets = [s.tolist() for s in per_batch]
    opens, closes = [], []
    live: set[int] = set()
    for k, shards in enumerate(sets):
        opens.append([s for s in shards if s not in live])
        live.update(shards)
        nxt = set(sets[k + 1]) if k + 1 < len(sets) else set()
        done = sorted(live - nxt)
        live -= set(done)
        closes.append(done)
    return opens, closes


class _Progress:
    """Main-process bookkeeping: the epoch and the global batches of it the trainer consumed."""

    def __init__(self) -> None:
        self.epoch = 0
        self.position = 0
        self.resume = False
        self.world_size = 1
        self.batches = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position, self.resume, self.batches = epoch, 0, False, 0

    def begin(self, world_size: int) -> int:
        """Start a pass: from the loaded position once after ``load_state_dict``, else from 0."""
        start = self.position if self.resume else 0
        if not self.resume:
            self.batches = 0
        self.position, self.resume, self.world_size = start, False, world_size
        return start

    def advance(self, n: int = 1) -> None:
        self.position += n * self.world_size
        self.batches += n


class ShardStream(IterableDataset):
    """Fixed-shape batches of a cache, planned per epoch, split across ranks and workers.

    Args:
        root: cache directory (holds ``manifest.json``), a ``file://`` URL, or a remote
            cache URL: ``http(s)://...`` or any fsspec URL (``s3://bucket/prefix``).
        view: ``"records"`` (any cache), ``"graphs"``, ``"twins"`` (causal), or a
            name added with :func:`loaders.views.register_view`.
        batch_size: rows per batch (graphs, twin rows, records).
        shuffle: shuffle shard order, records within windows, and rows within batches.
        seed: seed of every shuffle (with the epoch); never a pid or the clock.
        window: shards per shuffle window (``None``: one window, a full shuffle).
        drop_last: drop the epoch's remainder instead of padding it with flagged repeats.
        rank, world_size: override what ``torch.distributed`` says.
        remote: how to read a remote ``root`` (local cache folder and its size limit,
            prefetch, timeouts, retries, fsspec storage options); default
            :class:`loaders.remote.RemoteOptions()`. Ignored for local caches.
        verify: ``"size"`` or ``"crc"`` (see :data:`loaders.blockread.VERIFY_MODES`).
        decode_threads: zstd threads when iterating in the main process
            (default: up to 4); DataLoader workers always use 1.
        **view_options: passed to the view (e.g. ``compact=True`` for twins; ``mix=`` records
            per mixing pool and ``chunk=`` for ``mel`` and ``twins``, see :mod:`loaders.pools`).

    Iterate it directly (batches are dicts of tensors) or through
    :func:`loaders.make_loader`. ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` act like a DistributedSampler's plus an exact resume.
    """

    def __init__(
        self,
        root: str | Path,
        view: str = "records",
        batch_size: int = 256,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window: int | None = DEFAULT_WINDOW,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        verify: str = "size",
        decode_threads: int | None = None,
        remote: RemoteOptions | None = None,
        **view_options: Any,
    ):
        super().__init__()
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 shards or None, got {window}")
        self.remote: RemoteOptions | None = None
        self.root: Path | str
        if is_remote(root):
            self.root = str(root).rstrip("/")
            self.remote = remote if remote is not None else RemoteOptions()
            self.manifest = fetch_manifest(self.root, self.remote)  # shards: sizes and sha256 checked on arrival
        else:
            self.root = local_path(root)
            self.manifest = read_manifest(self.root)
            check_shard_files(self.manifest, self.root)
        self.view = make_view(view, self.manifest, batch_size, **view_options)
        self.config = PlanConfig(view, batch_size, shuffle, seed, window, drop_last, self.view.options())
        self.fingerprint = cache_fingerprint(self.manifest)
        self.verify = verify
        probe = self._new_shard_set()  # views that need shapes read the indexes only
        try:
            self.items_per_record = self.view.bind(probe.field_shapes)
        finally:
            probe.close()
        self.layout: Layout = self.view.layout()
        self._spec = self.layout.spec()
        self._counts = np.array([s.records for s in self.manifest.shards], dtype=np.int64)
        self._rank, self._world_size = rank, world_size
        self._decode_threads = decode_threads
        self._progress = _Progress()
        self._control = torch.zeros(5, dtype=torch.int64).share_memory_()
        self._emit_packed = False  # set on the copy a loader drives (see for_loader)
        self._reader: ShardSet | None = None
        self._reader_pid = -1
        self._plan_cache: tuple[int, EpochPlan] | None = None
        self.slot_rings: SlotRings | None = None  # set by a loader with workers (see loaders.slots)

    # ---- pickling (DataLoader workers): no open files, no cached plan
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_reader"], state["_reader_pid"], state["_plan_cache"] = None, -1, None
        return state

    # ---- the plan
    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one), cached for the last epoch asked."""
        epoch = self._progress.epoch if epoch is None else epoch
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            c = self.config
            plan = EpochPlan.build(self._counts, self.items_per_record, c.batch_size, c.seed, epoch, c.shuffle, c.window, c.drop_last,
                                   self.view.mix, self.view.chunk)
            self._plan_cache = (epoch, plan)
        return self._plan_cache[1]

    def world(self) -> World:
        """Rank and world size as they are now (explicit arguments, else torch.distributed)."""
        rank, ws = detect_ranks(self._rank, self._world_size)
        return World(rank, ws)

    def __len__(self) -> int:
        """Batches each rank yields in a whole epoch (same for every rank)."""
        return self.plan().steps(self.world().world_size)

    # ---- epoch and resumption
    @property
    def epoch(self) -> int:
        return self._progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (a new epoch starts at its beginning; the same epoch keeps a loaded position)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._progress.set_epoch(int(epoch))

    def state_dict(self) -> dict[str, Any]:
        """Where the trainer is: epoch and global batches consumed (see :mod:`loaders.state`)."""
        p = self._progress
        return make_state(p.epoch, p.position, self.config, self.fingerprint, p.world_size, p.batches)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next pass: the same remaining batches, nothing decoded to get there."""
        epoch, position = check_state(state, self.config, self.fingerprint)
        p = self._progress
        p.epoch, p.position, p.resume, p.batches = epoch, position, True, int(state.get("batches", 0))

    # ---- iteration
    def for_loader(self) -> "ShardStream":
        """A copy that a loader drives: it shares this stream's progress and yields packed batches."""
        driven = copy.copy(self)
        driven._emit_packed = True
        return driven

    def begin_pass(self) -> World:
        """Main process, before a loader's pass: resolve the world, fix the start, tell the workers."""
        world = self.world()
        start = self._progress.begin(world.world_size)
        self._control[:] = torch.tensor([1, self._progress.epoch, start, world.rank, world.world_size])
        return world

    def __iter__(self) -> Iterator[Any]:
        wid, nw = worker_part()
        in_worker = get_worker_info() is not None
        count = False
        if self._emit_packed:  # a loader called begin_pass() in the main process
            valid, epoch, start, rank, ws = self._control.tolist()
            if not valid:
                raise RuntimeError("ShardStream.for_loader() copy iterated without begin_pass(); use loaders.make_loader")
        elif in_worker:  # a plain DataLoader: no pass handed over; detect here
            rank, ws = detect_ranks(self._rank, self._world_size, env_fallback=True)
            epoch, start = self._progress.epoch, 0
        else:  # iterated directly: this object counts what it hands out
            world = self.world()
            rank, ws = world.rank, world.world_size
            epoch, start, count = self._progress.epoch, self._progress.begin(ws), True
        world = World(rank, ws, wid, nw)
        plan = self.plan(epoch)
        ids = plan.rank_batches(world.world_size, world.rank, start)[world.worker :: world.num_workers]
        if in_worker:
            tune_malloc()  # a DataLoader worker: a process the loader owns
        rings = self.slot_rings if in_worker and self._emit_packed else None
        return self._batches(plan, ids, shared=in_worker, count=count, rings=rings, worker=wid)

    def _new_shard_set(self) -> ShardSet:
        locator = RemoteFiles(str(self.root), self.manifest, self.remote) if self.remote is not None else None
        return ShardSet(self.manifest, self.root, self.verify, locator=locator)

    def _shards(self) -> ShardSet:
        if self._reader is None or self._reader_pid != os.getpid():
            self._reader = self._new_shard_set()  # a fork's child opens (and fetches with) its own
            self._reader_pid = os.getpid()
        return self._reader

    def _batches(self, plan: EpochPlan, ids: np.ndarray, shared: bool, count: bool, rings: SlotRings | None = None, worker: int = 0) -> Iterator[Any]:
        shards = self._shards()
        threads = 1 if shared else (self._decode_threads or min(4, os.cpu_count() or 1))
        opens = closes = None
        if self.remote is not None:  # fetch this process's shards in order of use; close each after its last batch
            shards.release()  # anything a pass left open (an aborted pass, batch())
            opens, closes = shard_schedule(batch_shards(plan, ids, shards.starts))
        for k, b in enumerate(ids.tolist()):
            if opens is not None and k % _PLAN_CHUNK == 0:
                shards.locator.plan([s for part in opens[k : k + 2 * _PLAN_CHUNK] for s in part])
            self.view.decode_threads = threads
            slot = rings.acquire(worker) if rings is not None else None
            try:
                buf, arrays = self.layout.allocate(shared, slot)
                self.view.assemble(shards, plan.batch(b), arrays)
            except BaseException:
                if slot is not None:  # nothing was sent: the slot is free again
                    rings.release(worker, slot[1].slot)
                raise
            if closes is not None:
                shards.release(closes[k])
            packed = PackedBatch(buf, self._spec, slot[1] if slot is not None else None)
            if count:
                self._progress.advance()
            yield packed if self._emit_packed else packed.unpack()

    def batch(self, b: int, epoch: int | None = None) -> Batch:
        """Global batch ``b`` of ``epoch`` built on the spot (for tests and inspection; no progress counted)."""
        buf, arrays = self.layout.allocate(False)
        self.view.decode_threads = self._decode_threads or 1
        self.view.assemble(self._shards(), self.plan(epoch).batch(b), arrays)
        return PackedBatch(buf, self._spec).unpack()

    def __repr__(self) -> str:
        c = self.config
        return (f"ShardStream({str(self.root)!r}, view={c.view!r}, batch_size={c.batch_size}, shuffle={c.shuffle}, "
                f"seed={c.seed}, window={c.window}, drop_last={c.drop_last}, records={self.manifest.records})")
