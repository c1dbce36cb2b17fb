"""The record order of a mixture's epoch: pure functions of integers.

A mixture reads its caches as one *union* of records: cache ``c``'s record
``i`` is union record ``offsets[c] + i`` (caches in the mixture's order).
The epoch order is built in two steps, both seeded by ``(seed, epoch)`` and
nothing else, so it never depends on ranks or workers:

1. **Which records, in which order inside the cache** (:func:`cache_draws`):
   cache ``c`` is read as a cycle over a fixed shuffle of its records; an
   epoch takes the next ``count`` records of that cycle (``count`` from
   :mod:`loaders.schedule`), starting where the epochs before it stopped, so
   every record comes before any comes again, and inside an epoch each comes
   ``count // size`` or one more times. Those draws are then put in the
   cache's own epoch order (:func:`loaders.plan.epoch_order`, for the epoch
   number ``epoch * caches + c``: shards shuffled, records shuffled within
   windows of shards), so a mixture of one cache reads exactly what a plain
   stream of it reads, and every epoch is shuffled afresh.
2. **In which order** (:func:`interleave`): the caches' draws are merged so
   that every stretch of the order holds each cache in proportion to its
   count (cache ``c``'s ``j``-th draw sits at key ``(j + u_c) / count_c``,
   ``u_c`` uniform, seeded): each batch carries the epoch's proportions, to
   within one record per cache, and each cache's draws keep their window
   locality. Without ``shuffle``: cache after cache, each in record order.

The result is the ``order`` of an :class:`loaders.plan.EpochPlan`, so the
pools of :mod:`loaders.pools` mix many-item views across the whole union, and
batches, ranks, workers and resume work as for one cache.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from loaders.plan import DEFAULT_WINDOW, epoch_order

__all__ = ["pass_epoch", "cache_draws", "merge_permutation", "interleave", "mixture_order"]

_TAG_MIX = 0x6D6978
_TAG_PICK = 0x7069636B


def pass_epoch(epoch: int, cache: int, caches: int) -> int:
    """The epoch number whose :func:`epoch_order` orders cache ``cache`` of ``caches`` in mixture epoch ``epoch``."""
    return epoch * caches + cache


def cache_draws(shard_counts: np.ndarray, seed: int, cache: int, caches: int, epoch: int, start: int, count: int, shuffle: bool = True, window: int | None = DEFAULT_WINDOW) -> np.ndarray:
    """Local record ids cache ``cache`` gives mixture epoch ``epoch``, in order, int64 ``[count]``.

    *Which*: positions ``[start, start + count)`` of the cyclic sequence
    ``pi[0], ..., pi[size - 1], pi[0], ...`` (``pi`` a permutation of the cache
    seeded by ``(seed, cache)``; the identity without ``shuffle``), so each record
    comes ``count // size`` or one more times, never twice while another is
    missing, and consecutive epochs continue the cycle. *In which order*: copy
    after copy, each copy's records in the cache's own epoch order for
    :func:`pass_epoch` (window locality kept).
    """
    shard_counts = np.asarray(shard_counts, dtype=np.int64)
    size = int(shard_counts.sum())
    if count <= 0:
        return np.zeros(0, np.int64)
    if size == 0:
        raise ValueError(f"cache {cache} has no records to draw {count} from")
    q, r = divmod(count, size)
    rank_order = epoch_order(shard_counts, seed, pass_epoch(epoch, cache, caches), shuffle, window)
    parts = [np.tile(rank_order, q)] if q else []  # copies 0..q-1: every record, in the cache's epoch order
    if r:  # copy q: the r records at positions start + q*size ... of the cycle, in the same order (a filter, no sort)
        pi = np.random.default_rng(np.random.SeedSequence([int(seed), _TAG_PICK, int(cache)])).permutation(size) if shuffle else np.arange(size)
        picked = np.zeros(size, bool)
        picked[pi[(start + q * size + np.arange(r, dtype=np.int64)) % size]] = True
        parts.append(rank_order[picked[rank_order]])
    return np.concatenate(parts).astype(np.int64, copy=False)


def merge_permutation(counts: np.ndarray, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Where each position of the epoch order comes from, in the caches' draws concatenated (cache 0's,
    then cache 1's, ...), int64 ``[sum(counts)]`` (step 2 of the module docstring)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if not shuffle or int((counts > 0).sum()) < 2:
        return np.arange(total, dtype=np.int64)
    u = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), _TAG_MIX])).random(len(counts))
    keys = np.concatenate([(np.arange(n, dtype=np.float64) + u[c]) / n for c, n in enumerate(counts.tolist()) if n > 0])
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def interleave(counts: np.ndarray, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The cache of every position of the epoch order, int64 ``[sum(counts)]``."""
    counts = np.asarray(counts, dtype=np.int64)
    caches: np.ndarray = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[merge_permutation(counts, seed, epoch, shuffle)]
    return caches


def mixture_order(shard_counts: Sequence[np.ndarray], counts: np.ndarray, before: np.ndarray, seed: int, epoch: int, shuffle: bool = True, window: int | None = DEFAULT_WINDOW) -> np.ndarray:
    """Union record ids in epoch order, int64 ``[sum(counts)]``.

    ``shard_counts[c]``: records per shard of cache ``c``; ``counts[c]``: its
    records this epoch; ``before[c]``: records drawn from its stream by earlier
    epochs (:func:`loaders.schedule.draws_before`).
    """
    caches = len(shard_counts)
    sizes = np.array([int(np.sum(s)) for s in shard_counts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    draws = [offsets[c] + cache_draws(shard_counts[c], seed, c, caches, epoch, int(before[c]), int(counts[c]), shuffle, window) for c in range(caches)]
    order: np.ndarray = np.concatenate(draws)[merge_permutation(counts, seed, epoch, shuffle)]
    return order
