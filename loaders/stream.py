"""``ShardStream``: a streaming ``IterableDataset`` of fixed-shape batches from a cache directory.

It composes the parts: the manifest (what the cache holds), a view (how records become batches,
:mod:`loaders.views`), the epoch plan (which items go in which batch, :mod:`loaders.plan`), the block
reader (records by id from memory-mapped shards, :mod:`cachebuild.format.reader` and
:mod:`cachebuild.format.decode`) and the world (rank, worker, :mod:`loaders.world`, read when iteration
starts). Batches are built whole, where the stream runs (a DataLoader worker, or the main process), so
the DataLoader is used with ``batch_size=None``.

The cache may be a local folder (or ``file://`` URL), or remote (``http(s)://``, ``s3://``, any fsspec
URL): then every process fetches only the shards its own batches touch, in the order it touches them
and a few ahead, into a bounded local cache directory (:mod:`loaders.remote`), and closes each shard's
mapping once its batches are built.

Which epoch each pass runs follows one rule (:mod:`loaders.passes`): every new ``iter()`` starts the
next epoch unless ``set_epoch`` or ``load_state_dict`` said otherwise. Progress (epoch, global
position) lives in the main process's stream object; DataLoader workers receive the epoch, start
position and world at the start of every pass through a small shared-memory block, which also reaches
persistent workers. Workers of other DataLoaders (plain torch, torchdata's ``StatefulDataLoader``)
apply the rule themselves from the same block, and save and load their own position (torchdata).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from cachebuild.format.malloc import settle_heap, tune_malloc
from cachebuild.format.generations import Lease, generation_of
from cachebuild.format.reader import ShardSet, check_shard_files, local_path
from loaders.batch import Batch, Layout, PackedBatch
from loaders.generations import open_newest
from loaders.mixgrow import load_generations, refresh_generations, stream_generations, use_generations
from loaders.mixture import Mixture, OpenMixture, mixture_root, open_mixture, refuse_single_cache_options
from loaders.passes import Control, DirectPass, Progress, never_finished
from loaders.plan import EpochPlan, epoch_order
from loaders.remote import RemoteOptions, check_remote_options, fetch_manifest, is_remote
from loaders.shards import RemoteFiles
from loaders.shared_pools import SharedPools
from loaders.slots import SlotRings
from loaders.state import PlanConfig, cache_fingerprint, check_position, check_state, check_worker_state, make_state, make_worker_state, plan_args
from loaders.views import make_view
from loaders.shard_window import AUTO_WINDOW, batch_shards, check_rank, resolve_window, shard_schedule
from loaders.worker_signals import leave_ctrl_c_to_the_trainer
from loaders.world import World, detect_ranks, process_group_world, worker_part

__all__ = ["ShardStream"]

# Remote caches: the fetcher is handed the shard order of this many batches at a time.
_PLAN_CHUNK = 64


class ShardStream(IterableDataset[dict[str, Any]]):
    """Fixed-shape batches of a cache, planned per epoch, split across ranks and workers.

    Args:
        root: cache directory (holds ``manifest.json``), a ``file://`` URL, or a remote
            cache URL: ``http(s)://...`` or any fsspec URL (``s3://bucket/prefix``).
            Or several caches of one kind: a :class:`loaders.Mixture` (weights per
            epoch, or a schedule of them), or a list (or dict by name) of roots (each record once per
            epoch); see :mod:`loaders.mixture`.
        view: ``"records"`` (any cache), ``"graphs"``, ``"twins"`` (causal), or a
            name added with :func:`loaders.views.register_view`.
        batch_size: rows per batch (graphs, twin rows, records).
        shuffle: shuffle shard order, records within windows, and rows within batches.
        seed: seed of every shuffle (with the epoch); never a pid or the clock.
        window: shards per shuffle window (``None``: one window, a full shuffle); ``"auto"``
            (default): a full shuffle for a local cache, 16 shards for a remote one.
        drop_last: drop the epoch's remainder instead of padding it with flagged repeats.
        rank, world_size: override what ``torch.distributed`` says.
        remote: how to read a remote ``root`` (local cache folder and its size limit,
            prefetch, timeouts, retries, fsspec storage options); default
            :class:`loaders.remote.RemoteOptions()`. Ignored for local caches (but
            anything other than a ``RemoteOptions`` or None is a ``TypeError``, whatever the cache).
        verify: ``"crc"`` (default: raw payloads' crc32 checked on every read) or ``"size"``
            (see :data:`cachebuild.format.reader.VERIFY_MODES`).
        decode_threads: zstd threads when iterating in the main process
            (default: up to 4); DataLoader workers always use 1.
        **view_options: passed to the view (e.g. ``compact=True`` for twins; ``mix=`` records per
            mixing pool and ``chunk=`` for ``mel`` and ``twins``, :mod:`loaders.pools`; ``mix=`` for
            ``records``: pooled reads of small records in shared frames, :mod:`loaders.views.records`).

    Iterate it directly (batches are dicts of tensors) or through
    :func:`loaders.make_loader`. Each new pass (``iter()``) is the next epoch,
    unless ``set_epoch`` or ``load_state_dict`` said otherwise (see
    :mod:`loaders.passes`); ``state_dict`` and ``load_state_dict`` resume exactly.
    """

    def __init__(
        self,
        root: str | Path | Mixture | list[str | Path] | dict[str, str | Path],
        view: str = "records",
        batch_size: int = 256,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window: int | str | None = AUTO_WINDOW,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        verify: str = "crc",
        decode_threads: int | None = None,
        remote: RemoteOptions | None = None,
        **view_options: Any,
    ):
        super().__init__()
        batch_size, seed, shuffle, drop_last = plan_args(batch_size, seed, shuffle, drop_last)
        remote = check_remote_options(remote)
        self._open_root(mixture_root(root, view_options), remote)  # ShardStream([a, b], weights=...): a Mixture
        window = resolve_window(window, remote=any(map(is_remote, self.mixture.roots)) if self.mixture is not None else self.remote is not None)
        self.generation = generation_of(self.manifest)  # one cache's; a mixture's caches: self.generations
        self._view_options = dict(view_options)
        self._warned_generations: set[int] = set()
        self._manifest_seen: tuple[tuple[int, int, int], int] | None = None  # manifest.json's (inode, mtime, size) and generation
        if self.mixture is not None:
            refuse_single_cache_options(view_options)  # oversample=, bucket_by=
        self.view = make_view(view, self.manifest, batch_size, **view_options)
        self.config = PlanConfig(view, batch_size, shuffle, seed, window, drop_last, self.view.options())
        self.fingerprint = self.mixture.fingerprint if self.mixture is not None else cache_fingerprint(self.manifest)
        self.verify = verify
        probe = self._new_shard_set()  # views that need shapes read the indexes only
        try:
            self.items_per_record = self.view.bind(probe.field_shapes)
        finally:
            probe.close()
        self.layout: Layout = self.view.layout()
        self.layout.check_fits(batch_size, str(self.root))
        self._spec = self.layout.spec()
        self._counts = np.array([s.records for s in self.manifest.shards], dtype=np.int64)
        check_rank(rank, world_size)
        self._rank, self._world_size, self._parent_world = rank, world_size, None  # (the last: see __getstate__)
        self._decode_threads = decode_threads
        self._progress = Progress()
        self._control = Control(len(self.generations))
        self._control.instruct_generation(self.generations)
        self._worker_load: tuple[Any, ...] | None = None  # a state loaded inside a worker (torchdata): epoch, start, yielded, rank, world
        self._worker_pass: list[int] | None = None  # this worker's pass: epoch, start, worker, workers, rank, world, yielded
        self._emit_packed = False  # set on the copy a loader drives (see for_loader)
        self._reader: ShardSet | None = None
        self._reader_pid = -1
        self._plan_cache: tuple[tuple[tuple[int, ...], int], EpochPlan] | None = None
        self.slot_rings: SlotRings | None = None  # set by a loader with workers (see loaders.slots)
        self.shared_pools: SharedPools | None = None  # set by a loader with 2+ workers (see loaders.shared_pools)

    # ---- pickling (DataLoader workers): no open files, no cached plan

    def _open_root(self, root: Any, remote: RemoteOptions | None) -> None:
        """Set ``mixture``, ``root``, ``manifest``, ``remote`` and the generation lease from what the user passed."""
        self.remote: RemoteOptions | None = None
        self.root: Path | str
        self._lease: Lease | None = None  # on the generation read (a growing cache, loaders.generations)
        self.mixture: OpenMixture | None = open_mixture(root, remote)
        if self.mixture is not None:  # several caches read as one (loaders.mixture), each growing (loaders.mixgrow)
            self.root, self.manifest, self.remote = self.mixture.label, self.mixture.manifest, self.mixture.remote
        elif is_remote(root):
            self.root = str(root).rstrip("/")
            self.remote = remote if remote is not None else RemoteOptions()
            self.manifest = fetch_manifest(self.root, self.remote)  # shards: sizes and sha256 checked on arrival
        else:
            self.root = local_path(root)
            self.manifest, self._lease = open_newest(self.root)
            check_shard_files(self.manifest, self.root)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"], state["_reader_pid"], state["_plan_cache"] = None, -1, None
        state["_parent_world"] = process_group_world()  # spawned DataLoader workers learn their rank from it
        return {k: v for k, v in state.items() if k != "begin_pass"}  # (loaders.lightning's wrapper stays in its process)

    # ---- the plan
    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one), cached for the last epoch asked."""
        epoch = self._progress.epoch if epoch is None else epoch
        if self._plan_cache is None or self._plan_cache[0] != (self.generations, epoch):
            self._plan_cache = ((self.generations, epoch), self.make_plan(epoch))
        return self._plan_cache[1]

    def make_plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` at the generations read now, built anew (:meth:`plan` caches one)."""
        c = self.config
        if self.mixture is not None:
            return self.mixture.plan(epoch, self.items_per_record, c, self.view.mix, self.view.chunk)
        order = epoch_order(self._counts, c.seed, epoch, c.shuffle, c.window)
        order = self.view.arrange(order, self._shards, int(self._counts.sum()), c.seed, epoch, c.shuffle)  # oversampling, length buckets
        return EpochPlan.from_order(order, self.items_per_record, c.batch_size, c.seed, epoch, c.shuffle, c.drop_last, self.view.mix, self.view.chunk)

    @property
    def generations(self) -> tuple[int, ...]:
        """The generation each cache is read at (one cache: ``(generation,)``; see :mod:`loaders.mixgrow`)."""
        return stream_generations(self)

    def world(self) -> World:
        """Rank and world size as they are now (explicit arguments, else torch.distributed)."""
        return World(*detect_ranks(self._rank, self._world_size))

    def __len__(self) -> int:
        """Batches each rank yields in a whole epoch (same for every rank)."""
        return self.plan().steps(self.world().world_size)

    # ---- epoch and resumption
    @property
    def epoch(self) -> int:
        """Epoch of the current (or last) pass; in a plain DataLoader's workers, worker 0's."""
        p = self._progress
        return self._control.worker_epoch() if not p.counted and self._control.workers_ran() else p.epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` in the next pass, instead of the next epoch (the rule of :mod:`loaders.passes`).

        Without calls to ``set_epoch``, each new ``iter()`` starts the next epoch
        by itself; with them (a ``DistributedSampler``-style loop), the epoch
        asked for. A new epoch starts at its beginning; the epoch of a loaded
        state keeps its position. Reaches DataLoader workers, persistent or not.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):  # "1" used to fail deep in a comparison
            raise ValueError(f"epoch must be a whole number, got {epoch!r}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        p = self._progress
        p.set_epoch(int(epoch))
        if p.next_pass()[1] == 0:  # a fresh epoch reads the newest generation (loaders.generations)
            refresh_generations(self)
        self._control.instruct_generation(self.generations)
        self._control.instruct(*p.next_pass(), exact=True)

    def state_dict(self) -> dict[str, Any]:
        """Where the trainer is: epoch and global batches consumed (see :mod:`loaders.state`).

        Inside a DataLoader worker: this worker's own pass and the batches it
        yielded (what torchdata's ``StatefulDataLoader`` saves per worker).
        """
        if get_worker_info() is not None:
            return self._worker_state()
        p = self._progress
        if not p.counted and self._control.workers_ran():
            raise RuntimeError(
                "this ShardStream was iterated by the workers of a plain DataLoader, which does not tell the stream which "
                "batches it handed to the trainer; take the state from the loader instead: loaders.loader_state(dataloader) "
                "(persistent workers), or build the loader with loaders.make_loader(stream) and call its state_dict()"
            )
        return self._stamp(make_state(p.epoch, p.position, self.config, self.fingerprint, p.world_size, p.batches, self.generation))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next pass: the same remaining batches, nothing decoded to get there.

        Inside a DataLoader worker (torchdata), a state this worker saved: its next
        pass continues its own share of the batches.
        """
        load_generations(self, state)  # the saved generations' shard lists, even when newer ones exist
        shards = max(map(len, self.mixture.shard_counts)) if self.mixture is not None else len(self._counts)
        epoch, position = check_state(state, self.config, self.fingerprint, shards, self.manifest.records if self.mixture is None else None)  # (a mixture's epoch: its weights')
        check_position(state, position, self.plan(epoch).steps)
        if get_worker_info() is not None:
            w = state["worker"] if isinstance(state.get("worker"), Mapping) else {}
            self._worker_load = (epoch, position, check_worker_state(state, *worker_part()), w.get("rank"), state.get("world_size"))
            return
        if "worker" in state:
            raise ValueError("this loader state was saved inside a DataLoader worker (torchdata); load it through the same StatefulDataLoader")
        self._progress.load(epoch, position, int(state.get("batches", 0)))
        self._control.instruct_generation(self.generations)
        self._control.instruct(epoch, position, exact=False)

    def _worker_state(self) -> dict[str, Any]:
        w = self._worker_pass
        if w is None:  # no pass yet in this worker: the one it would run
            wid, nw = worker_part()
            rank, ws = detect_ranks(self._rank, self._world_size, env_fallback=True, parent=self._parent_world)
            w = [*self._control.worker_pass_preview(wid), wid, nw, rank, ws, 0]
        epoch, start, wid, nw, rank, ws, yielded = w
        return make_worker_state(self._stamp(make_state(epoch, start, self.config, self.fingerprint, ws, yielded, self.generation)), wid, nw, rank, yielded)

    def _stamp(self, state: dict[str, Any]) -> dict[str, Any]:
        return self.mixture.stamp(state) if self.mixture is not None else state

    def _finished(self, world_size: int) -> Callable[[int, int], bool]:
        return lambda epoch, start: start > 0 and self.plan(epoch).steps(world_size, start) == 0

    # ---- iteration
    def for_loader(self) -> "ShardStream":
        """A copy that a loader drives: it shares this stream's progress and yields packed batches."""
        driven = copy.copy(self)
        driven._emit_packed = True
        return driven

    def begin_pass(self) -> World:
        """Main process, before a loader's pass: resolve the world, fix the start (a pass not read yet: again), tell the workers."""
        world, p = self.world(), self._progress
        start = p.begin(world.world_size, self._finished(world.world_size))
        if start == 0 and not p.rerun:  # (a pass run again keeps its generations: the length a trainer was told holds)
            refresh_generations(self)
        p.unread = self.plan(p.epoch).steps(world.world_size, start) > 0  # (an empty one is no pass to run again: loaders.passes)
        self._control.hand_generation(self.generations)
        self._control.hand_pass(p.epoch, start, world.rank, world.world_size)
        return world

    def __iter__(self) -> Iterator[Any]:
        wid, nw = worker_part()
        in_worker = get_worker_info() is not None
        skip = 0
        if self._emit_packed:  # a loader called begin_pass() in the main process
            handed = self._control.handed_pass()
            if handed is None:
                raise RuntimeError("ShardStream.for_loader() copy iterated without begin_pass(); use loaders.make_loader")
            epoch, start, rank, ws = handed
            use_generations(self, self._control.handed_generation())
        elif in_worker:  # another DataLoader's worker: it applies the epoch rule itself
            rank, ws = detect_ranks(self._rank, self._world_size, env_fallback=True, parent=self._parent_world)
            load, self._worker_load = self._worker_load, None
            if load is not None and tuple(load[3:]) != (rank, ws):
                raise ValueError(f"loader state was saved by a worker of rank {load[3]} of {load[4]}, loaded in rank {rank} of {ws}: resume with the same world")
            if load is None:  # (a loaded state already switched to its generation)
                use_generations(self, self._control.instructed_generation())
            epoch, start = self._control.worker_pass(wid, self._finished(ws), load[:2] if load else None)
            skip = load[2] if load else 0
            self._worker_pass = [epoch, start, wid, nw, rank, ws, skip]
        else:  # iterated directly: this object counts what it hands out, from the first next() on
            return DirectPass(self._run_direct)  # begins at its first next() (loaders.passes)
        world = World(rank, ws, wid, nw)
        plan = self.plan(epoch)
        ids = plan.rank_batches(world.world_size, world.rank, start)[world.worker :: world.num_workers][skip:]
        if in_worker:
            tune_malloc()  # a DataLoader worker: a process the loader owns
            leave_ctrl_c_to_the_trainer()
        else:
            settle_heap()  # the trainer's process (a DataLoader at 0 workers)
        rings = self.slot_rings if in_worker and self._emit_packed else None
        return self._batches(plan, ids, shared=in_worker, rings=rings, worker=wid)

    def _run_direct(self, continues: bool) -> Iterator[Any]:
        world, p = self.world(), self._progress
        start = p.begin(world.world_size, never_finished if continues else self._finished(world.world_size))
        token = p.token  # load_state_dict, set_epoch or a newer pass retire it (loaders.passes)
        if start == 0:
            refresh_generations(self)
        plan = self.plan(p.epoch)
        settle_heap()  # the trainer's process
        for batch in self._batches(plan, plan.rank_batches(world.world_size, world.rank, start), shared=False):
            p.advance()
            yield batch
            p.check(token)  # superseded: raise before building (and counting) another batch

    def _new_shard_set(self) -> ShardSet:
        if self.mixture is not None:
            return self.mixture.shard_set(self.verify)
        locator = RemoteFiles(str(self.root), self.manifest, self.remote) if self.remote is not None else None
        return ShardSet(self.manifest, self.root, self.verify, locator=locator)

    def _shards(self) -> ShardSet:
        if self._reader is None or self._reader_pid != os.getpid():
            self._reader = self._new_shard_set()  # a fork's child opens (and fetches with) its own
            self._reader_pid = os.getpid()
        return self._reader

    def _batches(self, plan: EpochPlan, ids: np.ndarray, shared: bool, rings: SlotRings | None = None, worker: int = 0) -> Iterator[Any]:
        shards = self._shards()
        threads = 1 if shared else (self._decode_threads or min(4, os.cpu_count() or 1))
        store = getattr(self.view, "store", None)
        if store is not None:
            store.attach(self.shared_pools if shared else None, worker, ahead=None if shared else self.make_plan)  # (the trainer's process decodes ahead)
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
                self.view.assemble_batch(shards, plan, b, arrays)
            except BaseException:
                if slot is not None and rings is not None:  # nothing was sent: the slot is free again
                    rings.release(worker, slot[1].slot)
                raise
            if closes is not None:
                shards.release(closes[k])
            packed = PackedBatch(buf, self._spec, slot[1] if slot is not None else None)
            if self._worker_pass is not None and not self._emit_packed:
                self._worker_pass[-1] += 1  # before the yield: a worker's state_dict() is taken while suspended here
            yield packed if self._emit_packed else packed.unpack()

    def batch(self, b: int, epoch: int | None = None) -> Batch:
        """Global batch ``b`` of ``epoch`` built on the spot (for tests and inspection; no progress counted)."""
        buf, arrays = self.layout.allocate(False)
        self.view.decode_threads = self._decode_threads or 1
        self.view.assemble_batch(self._shards(), self.plan(epoch), b, arrays)
        return PackedBatch(buf, self._spec).unpack()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ShardStream({str(self.root)!r}, view={c.view!r}, batch_size={c.batch_size}, shuffle={c.shuffle}, "
            f"seed={c.seed}, window={c.window}, drop_last={c.drop_last}, records={self.manifest.records}, generations={self.generations})"
        )
