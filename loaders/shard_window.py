"""Which shards each batch of an epoch touches, so a stream opens a shard just before it is needed
and closes it right after its last batch; the shuffle window a stream plans with; and the check
of a stream's rank and world size.

Split from :mod:`loaders.stream`: pure functions of the plan, no I/O.
"""

from __future__ import annotations

import numpy as np

from loaders.plan import DEFAULT_WINDOW, EpochPlan

__all__ = ["AUTO_WINDOW", "batch_shards", "shard_schedule", "check_rank", "resolve_window"]


AUTO_WINDOW = "auto"
"""A stream's default ``window``: see :func:`resolve_window`."""


def resolve_window(window: int | str | None, remote: bool) -> int | None:
    """The shuffle window a stream plans with (shards per window, None: one window, a full shuffle).

    ``"auto"`` (the default) is a full shuffle for a cache on this machine: the users' samplers
    draw one permutation of every record, and a cache whose records are sorted (the users' HDF5
    files and WAV folders hold one label, then the next) would otherwise give each window, and
    so each batch, the label share of the few shards it drew (DECISIONS, thirteenth session).
    For a remote cache it is :data:`DEFAULT_WINDOW` shards, so each process fetches and keeps a
    few shards at a time; pass ``window=None`` there for a full shuffle (every shard fetched
    throughout the epoch)."""
    if isinstance(window, str) and window == AUTO_WINDOW:
        return DEFAULT_WINDOW if remote else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1):
        raise ValueError(f"window must be >= 1 shards, None (a full shuffle) or 'auto', got {window!r}")
    return None if window is None else int(window)


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


def check_rank(rank: int | None, world_size: int | None) -> None:
    """A clear ValueError for a world size below 1 or a rank outside its world."""
    if world_size is not None and (isinstance(world_size, bool) or int(world_size) < 1):
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or int(rank) < 0 or (world_size is not None and int(rank) >= int(world_size))):
        raise ValueError(f"rank {rank!r} is not in a world of {world_size if world_size is not None else 'torch.distributed'} ranks (0 <= rank < world_size)")
