"""Which pools a ``compact="pool"`` batch needs, and which pool a :class:`loaders.TwinsContext` decodes next.

Pure functions of an epoch's plan (no state): the pools a global batch's
stream positions fall in (cyclic: the epoch's last batch wraps back to its
first pools, and a DDP rank's padding batches past the epoch's end repeat
them), the order in which a consumer needs pools after a batch, and the region
a new pool goes into.

A consumer reads every ``stride``-th global batch (1: all of them; rank ``r``
of ``W`` DDP ranks: ``r, r+W, ...`` below ``steps * W``, the last ones whole
padding). After its batch ``b`` it needs, in order: the pools its next batches
of this epoch touch first (the epoch's next pools, the pools the epoch's last
batch wraps back to if it reads that batch, the pools its padding batch
repeats; pools only other ranks' batches touch are skipped), then the first
pool of its first batch of the next epoch (batch ``b % stride``). A region is
reused for a pool only if what it holds is not needed before that pool (the
furthest-needed pool goes first, as in Belady's rule), so decoding ahead never
evicts a pool the next batches read.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from loaders.plan import EpochPlan

__all__ = ["batch_pools", "upcoming_pools", "next_use", "pick_region", "Key", "REGIONS_AHEAD"]

REGIONS_AHEAD = 2
"""Regions a consumer holds beyond the ``pool_span`` pools a batch may touch: room for two pools decoded
ahead. With one, the decode of pool ``k + 2`` could start only once the batches had left pool ``k``: the
decode thread sat idle 13-17% of a free-running epoch while the loop still waited at pool boundaries
(docs/DECISIONS.md, "Two pools decoded ahead")."""

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


def upcoming_pools(plan: EpochPlan, b: int, stride: int, limit: int) -> list[int]:
    """The pools of ``plan`` that a consumer reading every ``stride``-th batch touches after its batch ``b``
    (``b + stride, b + 2*stride, ...`` below ``plan.steps(stride) * stride``), in the order first touched,
    those of batch ``b`` left out; at most ``limit``. Batches inside pools already seen are jumped over
    (a few steps per pool, not one per batch)."""
    assert plan.pool_items is not None, "a mixed plan has pools"
    B, end, n = plan.batch_size, plan.steps(stride) * stride, b + stride
    seen = set(batch_pools(plan, b).tolist())
    out: list[int] = []
    while n < end and len(out) < limit:
        got = batch_pools(plan, n).tolist()
        out += [q for q in got if q not in seen]
        seen.update(got)
        step = 1
        if got[-1] >= got[0] and n * B < plan.total:  # (not wrapped, not padding): on to the batch reaching the next pool
            first = -(-(int(plan.pool_items[got[-1] + 1]) - B + 1) // B)
            step = max(1, -(-(first - n) // stride))
        n += step * stride
    return out[:limit]


def next_use(key: Key | None, order: Sequence[Key]) -> int:
    """When pool ``key`` is needed in ``order`` (the pools needed next, soonest first): 1, 2, ..., or -1: not
    needed soon (nothing, a pool already read, or one of a plan no longer read), so its region is free."""
    return order.index(key) + 1 if key is not None and key in order else -1


def pick_region(held: Sequence[Key | None], keep: set[Key], use: list[int]) -> int:
    """The region to decode a pool into: not one holding a pool of ``keep`` (the batch's); a free one first
    (``use`` -1: empty, or its pool not needed again), else the one whose pool is needed last."""
    return min((i for i, k in enumerate(held) if k not in keep), key=lambda i: (0, 0) if use[i] < 0 else (1, -use[i]))
