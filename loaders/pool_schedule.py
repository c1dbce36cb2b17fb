"""Which pools a ``compact="pool"`` batch needs, and which pool a :class:`loaders.TwinsContext` decodes next.

Pure functions of an epoch's plan (no state): the pools a global batch's
stream positions fall in (cyclic: the epoch's last batch wraps back to its
first pools), the order in which pools are needed after a batch, and the
region a new pool goes into. The order after a batch touching ``need`` is: the
epoch's pools after ``need[-1]``, then the pools its last batch wraps back to
(decoded again if they were let go: holding them through the epoch would take
one more region), then the next epoch's first pool. A region is reused for a
pool only if what it holds is not needed before that pool (the furthest-needed
pool goes first, as in Belady's rule), so decoding ahead never evicts a pool
the next batches read.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from loaders.plan import EpochPlan

__all__ = ["batch_pools", "wrap_pools", "next_use", "pick_region", "Key"]

Key = tuple[int, int]  # (plan fingerprint, pool)


def batch_pools(plan: EpochPlan, b: int) -> np.ndarray:
    """The pools global batch ``b`` of a mixed ``plan`` touches, in stream order (cyclic: the epoch's
    last batches wrap to its first pool)."""
    if plan.pools is None or plan.pool_items is None:
        raise ValueError("a plan without mixing pools (shuffle=False or mix=None) has no pools to hold")
    Q, B, total = len(plan.pools) - 1, plan.batch_size, plan.total
    if B >= total:
        return np.arange(Q, dtype=np.int64)
    a, z = (b * B) % total, (b * B + B - 1) % total
    qa, qz = (int(np.searchsorted(plan.pool_items, p, side="right")) - 1 for p in (a, z))
    if z >= a:
        return np.arange(qa, qz + 1, dtype=np.int64)
    if qz >= qa:  # wrapped onto the pools it started in: every pool
        return np.arange(Q, dtype=np.int64)
    return np.concatenate([np.arange(qa, Q), np.arange(0, qz + 1)]).astype(np.int64)


def wrap_pools(plan: EpochPlan) -> list[int]:
    """The pools the epoch's last batch wraps back to (its stream positions past the end are the epoch's first)."""
    last = batch_pools(plan, plan.batches - 1)
    drop = np.flatnonzero(np.diff(last) < 0)
    return last[drop[0] + 1 :].tolist() if len(drop) else []


def next_use(key: Key | None, fingerprint: int, need: np.ndarray, pools: int, wrap: Sequence[int], next_fingerprint: int) -> int:
    """When pool ``key`` is needed after a batch of plan ``fingerprint`` (``pools`` pools, the last batch
    wrapping to ``wrap``) touching ``need``: 1, 2, ... in order (this epoch's next pools, its wrap-around
    pools, the next epoch's ``next_fingerprint``), or -1: not needed again (nothing, or a pool of a plan no
    longer read), so its region is free."""
    if key is None:
        return -1
    fp, q = key
    if fp == fingerprint and need[-1] >= need[0]:  # (after a wrapped batch the epoch is over)
        if q > need[-1]:
            return q - int(need[-1])
        if q < need[0] and q in wrap:
            return pools + 1 + list(wrap).index(q)
    return 2 * pools + 2 + q if fp == next_fingerprint and fp != fingerprint else -1


def pick_region(held: Sequence[Key | None], keep: set[Key], use: list[int]) -> int:
    """The region to decode a pool into: not one holding a pool of ``keep`` (the batch's); a free one first
    (``use`` -1: empty, or its pool not needed again), else the one whose pool is needed last."""
    return min((i for i, k in enumerate(held) if k not in keep), key=lambda i: (0, 0) if use[i] < 0 else (1, -use[i]))
