"""An epoch order that keeps the records of each shared zstd frame together (pooled ``records`` reads).

A packed cache of small records may let consecutive entries of a member share
one zstd frame (``codec.share``, up to 64 KiB: ~58 token sequences of ~1 KB).
A shuffled batch of 256 records then touches 256 frames and decodes each
whole: 58 records' work for one record. The ``records`` view's pooled mode
(``mix=``) reads whole frames instead:

* a *block* is a run of consecutive records whose entries of the view's
  largest field lie in one frame (:func:`frame_blocks`, from the index
  alone; in a cache whose entries do not share frames, every record is its
  own block);
* the epoch's shuffled order (:func:`loaders.plan.epoch_order`) decides the
  order of the blocks (each where its first record falls), every block's
  records following one another in stored order (:func:`block_order`);
* the plan then cuts that order into pools of ``mix`` records and permutes
  each pool (:mod:`loaders.pools`), and the view decodes a pool once, each
  frame once (:mod:`loaders.views.store`).

So a batch draws its records at random from a pool of ``mix`` records that
holds ``mix / block`` blocks drawn at random from the whole cache (its shuffle
window): at the default pool of 64 MB of padded records and 64 KiB frames,
hundreds of blocks. Consecutive records of a block share a pool, which only
matters where neighbouring records are alike (a cache sorted by label): the
view's docstring and docs/DECISIONS.md give the per-batch label share measured
on such a cache.

A pure function of integers, like the plan: the same in every rank and worker.
"""

from __future__ import annotations

import numpy as np

from cachebuild.format.reader import ShardSet

__all__ = ["frame_blocks", "block_order"]


def frame_blocks(shards: ShardSet, field: str) -> np.ndarray:
    """Block id of every record of the cache, int64 ``[records]``, increasing: a new block wherever a
    record's entry of ``field`` starts another zstd frame than the record before (another tar offset)
    or another shard."""
    j = shards.field_pos[field]
    parts, base = [], 0
    for s in range(len(shards.manifest.shards)):
        offset = shards.index(s)[:, j]["offset"]
        if len(offset) == 0:
            continue
        new = np.ones(len(offset), np.int64)
        new[1:] = offset[1:] != offset[:-1]
        block = np.cumsum(new) - 1 + base
        parts.append(block)
        base = int(block[-1]) + 1
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def block_order(order: np.ndarray, block: np.ndarray) -> np.ndarray:
    """``order`` (a permutation of the global record ids) regrouped so that each block's records are
    consecutive, blocks in the order of their first record's place in ``order``, records in stored
    order inside a block (``block[r]``: record ``r``'s block id, non-decreasing in ``r``). Linear in
    the records, plus a sort of the blocks."""
    order = np.asarray(order, dtype=np.int64)
    n = len(block)
    if n == 0 or int(block[-1]) - int(block[0]) == n - 1:  # (every record its own block)
        return order
    if len(order) != n:
        raise ValueError(f"block_order: the order holds {len(order)} records, the cache {n}")
    place = np.empty(n, np.int64)
    place[order] = np.arange(n, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], block[1:] != block[:-1]]))
    lengths = np.diff(np.append(starts, n))
    rank = np.argsort(np.minimum.reduceat(place, starts), kind="stable")  # blocks by their first record's place
    length, start = lengths[rank], starts[rank]
    regrouped: np.ndarray = np.repeat(start - (np.cumsum(length) - length), length) + np.arange(n, dtype=np.int64)
    return regrouped
