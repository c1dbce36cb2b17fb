"""Mixing pools: how a plan spreads the items of many records over many batches.

Views whose records yield many items (``mel``: segments of a file; ``twins``:
(graph, intervention, row) rows) would, with items laid out record after
record, fill a batch from a handful of records (a ``mel`` batch of 1,024
segments: 13 files). An i.i.d. sampler draws from hundreds. A *pool* fixes
that at a bounded cost:

* the epoch's record order is cut into pools of at most ``mix`` consecutive
  records (near-equal sizes, so no pool is tiny);
* each record's items are cut into *chunks* of ``chunk`` consecutive items;
  the chunks of a pool are permuted (seeded by ``(seed, epoch, pool)``), and
  the item stream of the epoch is pool 0's permuted chunks, then pool 1's, ...

So a batch draws its rows from a whole pool: with ``n`` items per record and
``P`` records per pool, about ``P * (1 - (1 - B / (P * n)) ** (n / chunk))``
distinct records (``mel`` defaults, ``P = 1024``, ``n = 80``, ``B = 1024``:
about 650 files; ``twins``, ``n ~ 960``, ``chunk = 8``, ``B = 4096``: about
400 graphs). A process keeps the records of the pools its batches touch
decoded (:mod:`loaders.views.store`), so it decodes each record once per epoch
(twice at most where padding wraps to the epoch's start), holding at most
``max_pools_per_batch`` pools of decoded records; DataLoader workers share
theirs (:mod:`loaders.shared_pools`), so each record is decoded once in all.

Everything here is a pure function of integers and arrays.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = [
    "DEFAULT_MIX",
    "POOL_BYTES",
    "auto_mix",
    "pool_bounds",
    "chunk_lengths",
    "PoolTable",
    "pool_table",
    "max_pools_per_batch",
    "max_records_per_batch",
    "plan_fingerprint",
    "distinct",
    "locate_stream",
]

DEFAULT_MIX = 1024
"""Records per mixing pool of the ``twins`` view, and the least of the ``mel`` view's; see the module docstring."""

POOL_BYTES = 64 << 20
"""Decoded bytes a ``mel`` pool may hold at ``mix="auto"`` (:func:`auto_mix`)."""


def auto_mix(record_bytes: int, budget: int = POOL_BYTES) -> int:
    """Records per pool for ``mix="auto"``: as many decoded records as ``budget`` bytes hold, at least
    :data:`DEFAULT_MIX`. At the users' mel layout (10 KB a file) that is 6,553 files: a cache of their
    size (~6,000 files) is one pool, so a batch draws its segments from every file, as their i.i.d.
    sampler does (a batch of 8,192 segments: ~5,800 files, where pools of 1,024 files gave 1,024)."""
    return max(DEFAULT_MIX, int(budget) // max(1, int(record_bytes)))


def pool_bounds(records: int, mix: int) -> np.ndarray:
    """Epoch-order positions ``[0, ..., records]`` cutting ``records`` into ``ceil(records / mix)`` near-equal pools."""
    if mix < 1:
        raise ValueError(f"mix must be >= 1 records per pool, got {mix}")
    pools = max(1, -(-records // mix))
    return (np.arange(pools + 1, dtype=np.int64) * records) // pools


def chunk_lengths(items: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """``(chunks per record, min chunk length over all chunks)`` of records of ``items`` items each."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 items, got {chunk}")
    items = np.asarray(items, dtype=np.int64)
    per = -(-items // chunk)
    rem = items % chunk
    lengths = np.concatenate([[chunk] if (items >= chunk).any() else [], rem[rem > 0]])
    return per, np.int64(lengths.min()) if lengths.size else np.int64(0)


@dataclass(frozen=True)
class PoolTable:
    """The permuted chunks of one pool: ``rec[c]`` (epoch-order position of the record),
    ``start[c]`` (first item of the chunk in its record), ``cum`` (``[0, cumsum(lengths)]``)."""

    rec: np.ndarray
    start: np.ndarray
    cum: np.ndarray
    shift: np.ndarray = field(init=False, repr=False)  # ``start - cum[:-1]``: a position's item is the position plus its chunk's shift

    def __post_init__(self) -> None:
        object.__setattr__(self, "shift", self.start - self.cum[:-1])

    def locate(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(record position, item index)`` of pool-local item positions."""
        if len(self.cum) - 1 == self.cum[-1]:  # chunks of one item: position = chunk
            return self.rec[local], self.start[local]
        c = np.searchsorted(self.cum, local, side="right") - 1
        return self.rec[c], self.start[c] + (local - self.cum[c])

    def locate_range(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` of the consecutive positions ``lo, ..., hi - 1``: the chunks covering them
        are consecutive, so two searches and a repeat replace a search per position."""
        if len(self.cum) - 1 == self.cum[-1]:
            return self.rec[lo:hi], self.start[lo:hi]
        c0 = int(self.cum.searchsorted(lo, side="right")) - 1
        c1 = int(self.cum.searchsorted(hi - 1, side="right")) - 1
        edges = self.cum[c0 : c1 + 2].copy()  # the chunks' bounds, cut to [lo, hi)
        edges[0], edges[-1] = lo, hi
        c = np.arange(c0, c1 + 1, dtype=np.int64).repeat(np.diff(edges))
        return self.rec.take(c), np.arange(lo, hi, dtype=np.int64) + self.shift.take(c)


def pool_table(items: np.ndarray, first: int, chunk: int, rng: np.random.Generator) -> PoolTable:
    """Chunks of the pool whose records (epoch positions ``first, first+1, ...``) hold ``items`` items, permuted by ``rng``."""
    items = np.asarray(items, dtype=np.int64)
    per, _ = chunk_lengths(items, chunk)
    n = int(per.sum())
    rec = np.repeat(np.arange(len(items), dtype=np.int64), per)
    offsets = np.concatenate([[0], np.cumsum(per)[:-1]]).astype(np.int64)
    start = (np.arange(n, dtype=np.int64) - offsets[rec]) * chunk
    length = np.minimum(chunk, items[rec] - start)
    perm = rng.permutation(n)
    rec, start, length = rec[perm], start[perm], length[perm]
    cum = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
    return PoolTable(rec + first, start, cum)


def locate_stream(pool_items: np.ndarray, table: Callable[[int], PoolTable], total: int, start: int, size: int, pool_of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(record position, item index)`` of the stream positions ``start, ..., start + size - 1`` (cyclic over
    ``total``), located through the permuted chunks (``table(q)``) of the pools they fall in: runs of
    consecutive positions inside one pool, two searches and a repeat per run. ``pool_of`` (``size``
    integers), if given, gets each position's pool (the run's: no search per position)."""
    rec, items = np.empty(size, np.int64), np.empty(size, np.int64)
    row, p = 0, start
    while row < size:  # runs of consecutive positions inside one pool (the stream wraps at its end)
        a = p % total
        q = int(np.searchsorted(pool_items, a, side="right")) - 1
        n = min(size - row, total - a, int(pool_items[q + 1]) - a)
        lo = a - int(pool_items[q])
        rec[row : row + n], items[row : row + n] = table(q).locate_range(lo, lo + n)
        if pool_of is not None:
            pool_of[row : row + n] = q
        row, p = row + n, p + n
    return rec, items


def max_pools_per_batch(pool_items: np.ndarray, batch_size: int) -> int:
    """The most pools ``batch_size`` consecutive positions of the cyclic item stream can touch."""
    pool_items = np.asarray(pool_items, dtype=np.int64)
    pos = pool_items[pool_items > 0]
    if pos.size == 0:
        return 1
    return int(min(pos.size, -(-(batch_size - 1) // int(pos.min())) + 1))


def max_records_per_batch(items: np.ndarray, batch_size: int, chunk: int = 1) -> int:
    """The most distinct records a batch can hold when it is cut from runs of at most ``chunk`` items
    of one record (any plan: consecutive records, or a pool's permuted chunks)."""
    per, shortest = chunk_lengths(items, chunk)
    records = int((np.asarray(items) > 0).sum())
    if records == 0:
        return 1
    return int(min(records, batch_size, -(-(batch_size - 1) // int(shortest)) + 1))


def plan_fingerprint(order: np.ndarray, pools: np.ndarray | None, seed: int, epoch: int, chunk: int) -> int:
    """A positive int63 of an epoch's record order, pools and chunking: equal in every process that
    plans the same epoch (of the same generations), so DataLoader workers can share decoded pools
    by it (:mod:`loaders.shared_pools`)."""
    h = hashlib.blake2b(digest_size=8)
    for part in (order, pools, np.array([seed, epoch, chunk], np.int64)):
        if part is not None:
            h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
    return (int.from_bytes(h.digest(), "little") >> 1) | 1


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``; by marking instead of sorting when the values
    span a short range (a mixed batch's records lie in one or two pools)."""
    if not len(values):
        return values, values
    lo = int(values.min())
    span = int(values.max()) - lo + 1
    if span > 4 * len(values):
        upos, slot = np.unique(values, return_inverse=True)
        return upos, slot.reshape(-1)
    mark = np.zeros(span, bool)
    mark[values - lo] = True
    index = np.cumsum(mark) - 1
    return np.flatnonzero(mark) + lo, index[values - lo]
