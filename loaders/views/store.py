"""Decoded records kept while a process's batches draw from their pool.

In a mixed plan (:mod:`loaders.pools`) every batch draws rows from hundreds
of records of the current pool, and a process builds many batches of the same
pool. Decoding the records each batch touches would decode every record once
per batch it appears in (a ``mel`` file: up to 80 times per epoch); instead a
:class:`RecordStore` keeps them decoded, padded to the cache's max shapes, in
``pool_span`` *regions* of ``pool_size`` records (one pool each), and decodes
a record only when a batch first needs it. A region is reused once no batch of
this process needs its pool any more: batches come in increasing order, so a
record is decoded once per epoch per process (twice at most, where the
epoch's last batches wrap to its first pool as padding). The first batch that
touches a pool decodes all of it in one block read: the fixed costs of a read
(planning the frames, one call into zstd, one copy per run of same-shape
records) are then paid once per pool instead of once per batch. Memory:
``pool_span * pool_size`` padded records per process, allocated lazily.

Without pools (no shuffle, or a one-item view) the store decodes the batch's
records into fresh arrays, as a per-batch block.

In DataLoader workers the store first tries the pools the loader shares between
its workers (:mod:`loaders.shared_pools`: each pool decoded once in all, not once
per worker); it keeps its private regions for batches that cannot use them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from loaders.plan import BatchItems
from loaders.shared_pools import SharedPools
from loaders.views.pool_ahead import PROTECTED, AheadPools, FirstPool
from loaders.views.pool_process import PoolProcess, Regions, shared_room
from cachebuild.format.reader import ShardSet

__all__ = ["Dense", "DecodeInto", "RecordStore"]


@dataclass(frozen=True)
class Dense:
    """One decoded field of a record: its padded shape (without the record axis) and dtype."""

    shape: tuple[int, ...]
    dtype: str
    zero: bool = True  # re-zeroed when a region is reused (records smaller than the padded shape)


DecodeInto = Callable[[ShardSet, np.ndarray, dict[str, np.ndarray], np.ndarray], None]
"""``decode(shards, ids, arrays, dest)``: decode records ``ids`` into ``arrays[k][dest[i]]`` (zeroed before)."""


class RecordStore:
    """Decoded, padded records of the pools the current batch touches (see the module docstring)."""

    def __init__(self, fields: dict[str, Dense], decode: DecodeInto, first_pool: FirstPool | None = None):
        self.fields = dict(fields)
        self.decode = decode
        self.decodes = 0  # records decoded so far by this process (for tests and benchmarks)
        self.shared: SharedPools | None = None  # pools shared with the other workers (set in a worker)
        self.worker = 0
        # decodes ahead in a thread (loaders.views.pool_ahead), for a store given first_pool, where attach() allows
        self.ahead: AheadPools | None = AheadPools(first_pool) if first_pool is not None else None
        self.process: PoolProcess | None = None  # decodes into shared regions (loaders.views.pool_process), where set
        self._shm: Regions | None = None
        self._shm_tried = False  # (the regions were allocated while a process was to decode: shared if there was room)
        self.use_process = False  # (a pass planned in the trainer's process with workers asked for: loaders.planned)
        self.clear()

    def attach(self, shared: SharedPools | None, worker: int, ahead: Callable[[int], Any] | None = None) -> None:
        """Use ``shared`` (the loader's pools shared between its workers) as this worker ``worker``;
        ``ahead`` (the plan of an epoch, in the trainer's process): decode the next pool in a thread."""
        self.shared, self.worker = shared, worker
        if self.ahead is not None:
            self.ahead.plans = ahead if shared is None else None

    def clear(self) -> None:
        """Forget every decoded record (and free their memory)."""
        if self.ahead is not None:
            self.ahead.drop()
        self.arrays: dict[str, np.ndarray] | None = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        self.size = self.span = self.regions = 0
        self.held = np.zeros(0, np.int64)  # pool id per region, -1 when free
        self.epoch_key: tuple[Any, ...] | None = None
        self.done = np.zeros(0, bool)

    def drop_private(self) -> None:
        """Forget records decoded into private regions (a stream read at 0 workers), before a decode process
        is forked: they move to shared memory at the next batch anyway (:meth:`rows`), and a forked process
        would keep its copy of them (its pages, once this process frees its own) for as long as it lives."""
        if self.arrays is not None and self._shm is None:
            self.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)  # a pickled stream (DataLoader workers) carries no decoded records
        state.update(
            arrays=None,
            process=None,
            _shm=None,
            _shm_tried=False,
            use_process=False,
            size=0,
            span=0,
            regions=0,
            held=np.zeros(0, np.int64),
            epoch_key=None,
            done=np.zeros(0, bool),
            shared=None,
            worker=0,
        )
        state["ahead"] = AheadPools(self.ahead.first_pool) if self.ahead is not None else None  # (no thread, no plan maker)
        return state

    def _alloc(self, rows: int) -> dict[str, np.ndarray]:
        return {k: np.zeros((rows,) + f.shape, f.dtype) for k, f in self.fields.items()}

    def rows(self, shards: ShardSet, items: BatchItems) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``(arrays, where)``: decoded arrays holding every record of the batch, ``where[g]`` the row of ``items.unique[g]``.

        Pools of another plan (``items.plan_key``: seed, epoch) are other records: regions are dropped.
        """
        if items.pool is None:
            arrays = self._alloc(len(items.unique))
            where = np.arange(len(items.unique), dtype=np.int64)
            self._decode(shards, items.unique, arrays, where)
            return arrays, where
        if self.shared is not None and items.pool_records is not None and self.shared.fits(items, self.fields):
            zero = [k for k, f in self.fields.items() if f.zero]
            got = self.shared.take(items, self.worker, lambda ids, rows, arrays: self._decode(shards, ids, arrays, rows), zero)
            if got is not None:
                return got
        ahead = self.ahead if self.ahead is not None and self.ahead.plans is not None else None
        regions = items.pool_span + (1 if ahead is not None else 0)  # (one more: the next epoch's first pool, decoded ahead)
        moved = self._own_process() is not None and self._shm is None and not self._shm_tried  # (private regions, now a process)
        if self.arrays is None or moved or (items.pool_size, items.pool_span, regions) != (self.size, self.span, self.regions):
            if self.ahead is not None:
                self.ahead.drop()
            self.size, self.span, self.regions = items.pool_size, items.pool_span, regions
            self.arrays = self._alloc_regions(self.size * regions)
            self.held = np.full(regions, -1, np.int64)
            self.done = np.zeros(self.size * regions, bool)
        if items.plan_key != self.epoch_key:
            self.held[:] = -1
            if self.ahead is not None:
                self.ahead.new_plan(self, items)
            self.epoch_key = items.plan_key
        if ahead is not None:
            ahead.before(self, items.pool)
        region = self._regions(items.pool)
        where = region * self.size + items.pool_index
        missing = np.flatnonzero(~self.done[where])
        if missing.size:
            ids, dest = items.unique[missing], where[missing]
            if items.pool_records is not None:  # the rest of these pools too: one decode call per pool, not per batch
                ids, dest = self._whole_pools(items, region, missing)
            for part in self._by_region(dest):
                self._decode(shards, ids[part], self.arrays, dest[part])
            self.done[dest] = True
        if ahead is not None:
            ahead.after(self, shards, items)
        return self.arrays, where

    def finish_batch(self) -> None:
        """The batch :meth:`rows` served is built: shared regions it read may be reused."""
        if self.shared is not None:
            self.shared.done()

    def _whole_pools(self, items: BatchItems, region: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every record not decoded yet of the pools holding the batch's ``missing`` records: ``(ids, rows)``.

        A process's batches draw from a pool until it is used up, and each touches a few hundred of its
        records, so the pool is decoded in one block read (a few fixed costs per pool, not per batch);
        the decode count stays once per record per pool held.
        """
        ids, rows = [], []
        assert items.pool is not None and items.pool_records is not None, "a store reads mixed batches"
        for q in np.unique(items.pool[missing]).tolist():
            r = int(region[np.flatnonzero(items.pool == q)[0]])
            members = items.pool_records(q)
            dest = r * self.size + np.arange(len(members), dtype=np.int64)
            todo = ~self.done[dest]
            ids.append(members[todo])
            rows.append(dest[todo])
        return np.concatenate(ids), np.concatenate(rows)

    def _by_region(self, dest: np.ndarray) -> list[slice | np.ndarray]:
        """``dest``'s entries grouped by region, one group per decode call: a decode may lay its records
        out across all the rows it is given (the ``records`` view's flat fields, :mod:`loaders.views.records_pool`),
        and regions are reused one by one, so no call may span two."""
        region = dest // self.size
        if len(dest) == 0 or int(region.min()) == int(region.max()):
            return [slice(None)]
        by = np.argsort(region, kind="stable")
        cuts = np.flatnonzero(np.diff(region[by])) + 1
        return list(np.split(by, cuts))

    def _regions(self, pools: np.ndarray) -> np.ndarray:
        """The region of each entry of ``pools``; pools not held yet take regions no pool of this batch holds."""
        one = len(pools) > 0 and int(pools.min()) == int(pools.max())
        need = pools[:1] if one else np.unique(pools)  # (most batches lie in one pool: no sort)
        wanted = set(need.tolist())
        free = [r for r, q in enumerate(self.held.tolist()) if q not in wanted and q != PROTECTED]
        region_of = {}
        for q in need.tolist():
            hit = np.flatnonzero(self.held == q)
            if hit.size:
                region_of[q] = int(hit[0])
                continue
            r = free.pop(0)
            lo, hi = r * self.size, (r + 1) * self.size
            if (self.held[r] != -1 or self.done[lo:hi].any()) and self.arrays is not None:
                for name, arr in self.arrays.items():
                    if self.fields[name].zero:
                        arr[lo:hi] = 0
            self.done[lo:hi] = False
            self.held[r] = q
            region_of[q] = r
        if one:
            return np.full(len(pools), region_of[int(pools[0])], np.int64)
        out = np.empty(len(pools), np.int64)
        for q, r in region_of.items():
            out[pools == q] = r
        return out

    def _own_process(self) -> PoolProcess | None:
        """The decode process, where this process started it (a forked DataLoader worker inherits the object, not the pipe's use)."""
        p = self.process
        return p if self.use_process and p is not None and p.owner == os.getpid() and not p.dead else None

    def _alloc_regions(self, rows: int) -> dict[str, np.ndarray]:
        """The regions' arrays: in shared memory where a process decodes into them."""
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        fields = {k: (f.shape, f.dtype) for k, f in self.fields.items()}
        self._shm_tried = self._own_process() is not None
        if self._own_process() is None or not shared_room(sum(rows * int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in fields.values())):
            return self._alloc(rows)  # (no memfd, or no room: decoded in this process, into private memory)
        try:
            self._shm = Regions(fields, rows)
        except OSError:
            return self._alloc(rows)
        return self._shm.arrays

    def decode_rows(self, shards: ShardSet, ids: np.ndarray, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        """``decode`` of records ``ids`` into ``arrays[k][dest]``: in the store's process where ``arrays`` are its regions."""
        process = self._own_process()
        if process is not None and self._shm is not None and arrays is self._shm.arrays:
            process(shards, ids, self._shm, dest)
        else:
            self.decode(shards, ids, arrays, dest)

    def _decode(self, shards: ShardSet, ids: np.ndarray, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        self.decode_rows(shards, ids, arrays, dest)
        self.decodes += len(ids)
