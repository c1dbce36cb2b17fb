"""An epoch order that keeps the records of each packed member together (pooled ``records`` reads).

A packed cache (``codec.pack`` records per tar member, issue 15) of small
records may also let consecutive entries share one zstd frame (``codec.share``,
up to 64 KiB). A shuffled batch of 256 records then touches 256 frames and
decodes each whole: 58 records' work for one record at 64 KiB frames. The
``records`` view's pooled mode (``mix=``) reads whole members instead:

* the epoch's shuffled order (:func:`loaders.plan.epoch_order`) decides the
  order of the *members* (each member where its first record falls);
* every member's records follow one another, in stored order;
* the plan then cuts that order into pools of ``mix`` records and permutes
  each pool (:mod:`loaders.pools`), and the view decodes a pool once, whole
  frames only (:mod:`loaders.views.store`).

So a batch draws its records at random from a pool of ``mix`` records, which
holds ``mix / pack`` whole members drawn at random from the cache (from its
shuffle window), not from the whole cache: the trade between mixing and decode
work that WebDataset's shard shuffle buffer and LitData's chunk shuffling also
make, here with a known pool (the view's docstring gives the numbers).

A pure function of integers, like the plan: the same in every rank and worker.
"""

from __future__ import annotations

import numpy as np

__all__ = ["member_order", "member_of"]


def member_of(ids: np.ndarray, counts: np.ndarray, packs: np.ndarray) -> np.ndarray:
    """The packed member holding each global record id in ``ids``, numbered across the shards
    (``counts[s]`` records in shard ``s``, ``packs[s]`` records per member there, its last member shorter)."""
    counts = np.asarray(counts, dtype=np.int64)
    packs = np.maximum(1, np.asarray(packs, dtype=np.int64))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    first_member = np.concatenate([[0], np.cumsum(-(-counts // packs))]).astype(np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    shard = np.searchsorted(starts, ids, side="right") - 1
    member: np.ndarray = first_member[shard] + (ids - starts[shard]) // packs[shard]
    return member


def member_order(order: np.ndarray, counts: np.ndarray, packs: np.ndarray) -> np.ndarray:
    """``order`` (a permutation of the global record ids) regrouped so that each member's records are
    consecutive, members in the order of their first record's place in ``order``, and records in
    stored order inside a member. Every pack 1: ``order`` unchanged."""
    order = np.asarray(order, dtype=np.int64)
    if len(order) == 0 or int(np.max(packs, initial=1)) <= 1:
        return order
    member = member_of(order, counts, packs)
    _, first_place, which = np.unique(member, return_index=True, return_inverse=True)
    regrouped: np.ndarray = order[np.lexsort((order, first_place[which.reshape(-1)]))]
    return regrouped
