"""The epoch plan: pure functions of integers that say which item lands in which batch.

Vocabulary:

* a *record* is one entry of the cache (one graph); the manifest gives the
  record count of every shard, and record ids are global (shard starts + local);
* an *item* is what a view yields per batch row: one record (``graphs``,
  ``records``) or one twin row of a record (``twins``); ``items_per_record``
  gives their count per record (known from the index shapes, no decoding);
* the *item stream* of an epoch is the items of the records in epoch order,
  record after record;
* *global batch* ``b`` holds stream positions ``[b*B, (b+1)*B)``; positions
  past the end wrap to the start of the stream and are flagged as padding.

The epoch order is a pure function of ``(record counts per shard, seed, epoch,
shuffle, window)``: shard order shuffled, then records shuffled within windows
of ``window`` consecutive shards. It never depends on ranks or workers, and
nothing is seeded from a pid or the clock.

Parallel split: at step ``t``, rank ``r`` of ``W`` takes global batch
``start + t*W + r``; inside a rank, worker ``w`` of ``nw`` builds the rank's
batches ``w, w+nw, ...`` and the DataLoader's in-order round robin hands them
over in order, so the batch sequence is the same for any worker count. Every
rank gets the same number of steps: missing batches at the end are whole
padding batches (``is_pad`` all true), or the remainder is dropped with
``drop_last``. ``start`` is the number of global batches already consumed, so
a resume continues the same global sequence under any ``W`` or ``nw``.

Mixing (views with many items per record, ``mix`` set): the item stream is not
record after record but pool after pool, each pool's chunks of items permuted
(:mod:`loaders.pools`), so a batch draws from a whole pool of records. Batches
are still consecutive ranges of that stream, so everything above holds
unchanged: a pure function of integers, every item once, O(1) resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np

from loaders.pools import PoolTable, distinct, locate_stream, max_pools_per_batch, plan_fingerprint, pool_bounds, pool_table

__all__ = [
    "DEFAULT_WINDOW",
    "epoch_order",
    "num_batches",
    "steps_per_rank",
    "rank_batches",
    "in_batch_permutation",
    "distinct",
    "BatchItems",
    "EpochPlan",
]

DEFAULT_WINDOW = 16
"""Shards per shuffle window of a remote cache (``window="auto"``): records mix across
this many shards (consecutive items share a shard with probability about 1/window)."""

# Distinct streams of random numbers, so changing one use never shifts another.
_TAG_ORDER = 0x6F72646572
_TAG_BATCH = 0x6261746368
_TAG_POOL = 0x706F6F6C
_TABLES_KEPT = 4


def _rng(*words: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) for w in words])))  # (= default_rng(SeedSequence(...)), without its checks)


def _check_seed(seed: int, epoch: int) -> None:
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")


def epoch_order(counts: np.ndarray, seed: int, epoch: int, shuffle: bool = True, window: int | None = DEFAULT_WINDOW) -> np.ndarray:
    """Global record ids in epoch order, int64 ``[sum(counts)]``.

    ``counts[s]`` is the record count of shard ``s`` (record ids of shard ``s``
    start at ``sum(counts[:s])``). Without ``shuffle`` the order is the
    identity. With it, the shard order is a permutation drawn from
    ``(seed, epoch)`` and records are permuted within each window of
    ``window`` consecutive shards of that order (``None``: one window, a full
    shuffle).
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("counts must be a 1-d array of non-negative record counts")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 shards or None, got {window}")
    total = int(counts.sum())
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    _check_seed(seed, epoch)
    rng = _rng(seed, epoch, _TAG_ORDER)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    shards = rng.permutation(len(counts))
    c = counts[shards]
    # Concatenated ranges [starts[s], starts[s] + counts[s]) in shard order, vectorised.
    run_start = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)
    ids = np.arange(total, dtype=np.int64) + np.repeat(starts[shards] - run_start, c)
    per = len(counts) if window is None else window
    bounds = np.concatenate([[0], np.cumsum(c)])[::per]
    bounds = np.append(bounds, total) if bounds[-1] != total else bounds
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ids[a:b] = rng.permutation(ids[a:b])
    return ids


def num_batches(total_items: int, batch_size: int, drop_last: bool) -> int:
    """Global batches in an epoch of ``total_items`` items."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return total_items // batch_size if drop_last else -(-total_items // batch_size)


def steps_per_rank(batches: int, world_size: int, start: int = 0, drop_last: bool = False) -> int:
    """Batches every rank yields from global batch ``start`` on (the same for all ranks)."""
    left = max(0, batches - start)
    return left // world_size if drop_last else -(-left // world_size)


def rank_batches(batches: int, world_size: int, rank: int, start: int = 0, drop_last: bool = False) -> np.ndarray:
    """Global batch ids of rank ``rank``: ``start + t*world_size + rank`` for each step ``t``.

    Ids ``>= batches`` (only without ``drop_last``) are whole padding batches
    that keep the step count equal across ranks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    steps = steps_per_rank(batches, world_size, start, drop_last)
    return start + np.arange(steps, dtype=np.int64) * world_size + rank


def in_batch_permutation(seed: int, epoch: int, b: int, batch_size: int) -> np.ndarray:
    """The deterministic order of the rows inside global batch ``b`` (mixes items of its records)."""
    return _rng(seed, epoch, _TAG_BATCH, b).permutation(batch_size)


@dataclass(frozen=True)
class BatchItems:
    """What one global batch holds, row by row, and its distinct records.

    ``records[i]`` / ``items[i]``: record id and item index of row ``i``;
    ``is_pad[i]``: the row repeats an item to fill the epoch's last batches;
    ``unique``: the distinct record ids (ascending), ``records == unique[slot]``;
    ``first[g]``: the first row holding ``unique[g]``.

    In a mixed plan (``pool`` set) ``unique`` is ordered by epoch position, and
    ``pool[g]`` / ``pool_index[g]`` say which pool holds ``unique[g]`` and where
    in it; ``pool_size`` is the most records of a pool and ``pool_span`` the most
    pools one batch touches (what a view's decoded-record store must hold).
    """

    index: int
    records: np.ndarray
    items: np.ndarray
    is_pad: np.ndarray
    unique: np.ndarray
    slot: np.ndarray
    first: np.ndarray
    pool: np.ndarray | None = None
    pool_index: np.ndarray | None = None
    pool_size: int = 0
    pool_span: int = 0
    plan_key: tuple[Any, ...] = ()
    pool_records: Callable[[int], np.ndarray] | None = None  # pool q -> its record ids (a store decodes whole pools)
    plan_id: int = 0  # the plan's fingerprint (EpochPlan.fingerprint): the same in every process


def _segments(lo: int, size: int, total: int, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records (positions in the epoch order) covering stream positions ``[lo, lo+size)`` (cyclic),
    their row counts, and the item index of every row: a few searchsorted calls, no per-row search."""
    units, counts, items = [], [], []
    p, end = lo, lo + size
    while p < end:
        a = p % total
        seg = min(end - p, total - a)
        u0 = int(np.searchsorted(bounds, a, side="right")) - 1
        u1 = int(np.searchsorted(bounds, a + seg - 1, side="right")) - 1
        u = np.arange(u0, u1 + 1, dtype=np.int64)
        c = np.minimum(bounds[u + 1], a + seg) - np.maximum(bounds[u], a)
        keep = c > 0
        u, c = u[keep], c[keep]
        units.append(u)
        counts.append(c)
        items.append(np.arange(a, a + seg, dtype=np.int64) - np.repeat(bounds[u], c))
        p += seg
    return np.concatenate(units), np.concatenate(counts), np.concatenate(items)


def _first_rows(slot: np.ndarray, groups: int, rows: int) -> np.ndarray:
    first = np.full(groups, rows, np.int64)
    np.minimum.at(first, slot, np.arange(rows, dtype=np.int64))
    return first


@dataclass(frozen=True)
class EpochPlan:
    """The plan of one epoch: record order, item bounds, batch size, mixing pools; cheap to query per batch.

    ``pools`` (mixed plans only) are the epoch positions cutting the record
    order into pools and ``pool_items`` the stream positions where each pool
    starts; ``None`` when items are laid out record after record.
    """

    order: np.ndarray
    bounds: np.ndarray | None
    total: int
    batch_size: int
    drop_last: bool
    shuffle: bool
    seed: int
    epoch: int
    chunk: int = 1
    pools: np.ndarray | None = None
    pool_items: np.ndarray | None = None
    _tables: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    _fingerprint: list[int] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        counts: np.ndarray,
        items_per_record: np.ndarray | None,
        batch_size: int,
        seed: int,
        epoch: int,
        shuffle: bool = True,
        window: int | None = DEFAULT_WINDOW,
        drop_last: bool = False,
        mix: int | None = None,
        chunk: int = 1,
    ) -> "EpochPlan":
        """Plan an epoch; ``items_per_record`` is indexed by record id (``None``: one item each).

        ``mix`` (records per pool) mixes the items of that many records across
        batches when shuffling a many-item view (see :mod:`loaders.pools`);
        ``chunk`` items of a record stay together. ``None``: record after record.
        """
        order = epoch_order(counts, seed, epoch, shuffle, window)
        return cls.from_order(order, items_per_record, batch_size, seed, epoch, shuffle, drop_last, mix, chunk)

    @classmethod
    def from_order(
        cls, order: np.ndarray, items_per_record: np.ndarray | None, batch_size: int, seed: int, epoch: int, shuffle: bool = True, drop_last: bool = False, mix: int | None = None, chunk: int = 1
    ) -> "EpochPlan":
        """Plan an epoch whose record order is given (record ids, repeats allowed: a mixture's,
        :mod:`loaders.mixplan`); everything else as :meth:`build`."""
        order = np.asarray(order, dtype=np.int64)
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1 items, got {chunk}")
        pools = pool_items = None
        if items_per_record is None:
            bounds, total = None, len(order)
        else:
            per = np.asarray(items_per_record, dtype=np.int64)[order]
            bounds = np.concatenate([[0], np.cumsum(per)])
            total = int(bounds[-1])
            if mix is not None and shuffle:
                pools = pool_bounds(len(order), mix)
                pool_items = bounds[pools]
        num_batches(total, batch_size, drop_last)  # validates batch_size
        return cls(order, bounds, total, batch_size, drop_last, shuffle, seed, epoch, chunk, pools, pool_items)

    @property
    def batches(self) -> int:
        """Global batches in the epoch."""
        return num_batches(self.total, self.batch_size, self.drop_last)

    @cached_property
    def pool_size(self) -> int:
        """The most records of one pool (0: not mixed)."""
        return int(np.diff(self.pools).max()) if self.pools is not None else 0

    @cached_property
    def pool_span(self) -> int:
        """The most pools one batch touches (0: not mixed)."""
        return max_pools_per_batch(np.diff(self.pool_items), self.batch_size) if self.pool_items is not None else 0

    def steps(self, world_size: int, start: int = 0) -> int:
        """Batches each rank yields from global batch ``start`` on."""
        return steps_per_rank(self.batches, world_size, start, self.drop_last)

    def rank_batches(self, world_size: int, rank: int, start: int = 0) -> np.ndarray:
        """Global batch ids of one rank from ``start`` on (see :func:`rank_batches`)."""
        return rank_batches(self.batches, world_size, rank, start, self.drop_last)

    def table(self, q: int) -> PoolTable:
        """The permuted chunks of pool ``q`` (computed once, the last few kept)."""
        t = self._tables.get(q)
        if t is None:
            assert self.pools is not None and self.bounds is not None, "only a mixed plan has pools"
            a, z = int(self.pools[q]), int(self.pools[q + 1])
            per = np.diff(self.bounds[a : z + 1])
            t = pool_table(per, a, self.chunk, _rng(self.seed, self.epoch, _TAG_POOL, q))
            if len(self._tables) >= _TABLES_KEPT:
                self._tables.pop(next(iter(self._tables)))
            self._tables[q] = t
        return t

    def record_spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per global batch: the first and last epoch position of the records it may touch (cyclic: first > last wraps)."""
        ids = np.asarray(ids, dtype=np.int64)
        B, total = self.batch_size, self.total
        a, z = (ids * B) % total, (ids * B + B - 1) % total
        if self.pools is not None and self.pool_items is not None:
            qa = np.searchsorted(self.pool_items, a, side="right") - 1
            qz = np.searchsorted(self.pool_items, z, side="right") - 1
            return self.pools[qa], self.pools[qz + 1] - 1
        if self.bounds is not None:  # item position -> record position
            a = np.searchsorted(self.bounds, a, side="right") - 1
            z = np.searchsorted(self.bounds, z, side="right") - 1
        return a, z

    def batch(self, b: int) -> BatchItems:
        """Rows of global batch ``b``: positions wrapped and flagged, located, mixed."""
        B, total = self.batch_size, self.total
        if total < 1:
            raise ValueError("an epoch with no items has no batches")
        if self.pools is not None:
            return self._mixed_batch(b)
        lo = b * B
        is_pad = lo + np.arange(B, dtype=np.int64) >= total
        if self.bounds is None:
            records = self.order[(lo + np.arange(B, dtype=np.int64)) % total]
            items = np.zeros(B, np.int64)
            unique, slot = np.unique(records, return_inverse=True)
        else:
            units, counts, items = _segments(lo, B, total, self.bounds)
            unique, uslot = np.unique(self.order[units], return_inverse=True)
            slot = np.repeat(uslot.reshape(-1), counts)
            records = unique[slot]
        slot = slot.reshape(-1)
        if self.shuffle:
            perm = in_batch_permutation(self.seed, self.epoch, b, B)
            records, items, is_pad, slot = records[perm], items[perm], is_pad[perm], slot[perm]
        return BatchItems(b, records, items, is_pad, unique, slot, _first_rows(slot, len(unique), B))

    def _mixed_rows(self, b: int, pool_of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of batch ``b`` of a mixed plan: ``(record position, item, is_pad)``, in batch order (``pool_of``: each row's pool)."""
        B, total = self.batch_size, self.total
        assert self.pools is not None and self.pool_items is not None, "a mixed plan has pools"
        padded = (b + 1) * B > total  # only the epoch's last batches repeat items
        is_pad = b * B + np.arange(B, dtype=np.int64) >= total if padded else np.zeros(B, dtype=bool)
        rec, items = locate_stream(self.pool_items, self.table, total, b * B, B, pool_of)
        if self.chunk > 1:  # a chunk's rows spread over the batch (single items are in random order already)
            perm = in_batch_permutation(self.seed, self.epoch, b, B)
            rec, items = rec.take(perm), items.take(perm)
            if padded:
                is_pad = is_pad.take(perm)
            if pool_of is not None:
                pool_of[...] = pool_of.take(perm)
        return rec, items, is_pad

    def pool_rows(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of batch ``b`` of a mixed plan as ``(pool, place in the pool, item, is_pad)``: the rows of
        :meth:`batch`, without their distinct records (what ``twins`` ``compact="pool"`` sends)."""
        assert self.pools is not None, "a mixed plan has pools"
        pool = np.empty(self.batch_size, np.int64)
        rec, items, is_pad = self._mixed_rows(b, pool)
        return pool, rec - self.pools[pool], items, is_pad

    def _mixed_batch(self, b: int) -> BatchItems:
        """A batch of a mixed plan: its stream positions located through their pools' permuted chunks."""
        B = self.batch_size
        assert self.pools is not None, "a mixed plan has pools"
        rec, items, is_pad = self._mixed_rows(b)
        upos, slot = distinct(rec)
        unique = self.order[upos]
        pool = np.searchsorted(self.pools, upos, side="right") - 1
        return BatchItems(
            b,
            unique[slot],
            items,
            is_pad,
            unique,
            slot,
            _first_rows(slot, len(unique), B),
            pool,
            upos - self.pools[pool],
            self.pool_size,
            self.pool_span,
            (self.seed, self.epoch, len(self.order), len(self.pools), self.chunk),
            self.pool_records,
            self.fingerprint(),
        )

    def fingerprint(self) -> int:
        """:func:`loaders.pools.plan_fingerprint` of this plan, computed once."""
        if not self._fingerprint:
            self._fingerprint.append(plan_fingerprint(self.order, self.pools, self.seed, self.epoch, self.chunk))
        return self._fingerprint[0]

    def pool_records(self, q: int) -> np.ndarray:
        """Record ids of pool ``q`` (its slice of the epoch order)."""
        assert self.pools is not None, "pool_records needs a mixed plan"
        return self.order[int(self.pools[q]) : int(self.pools[q + 1])]
