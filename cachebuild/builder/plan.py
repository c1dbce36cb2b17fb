"""The build plan: shard i holds records [start, stop) and is seeded from (seed, i)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ShardSpec", "plan_shards", "shard_name", "block_rng", "BLOCK_RECORDS"]

# Records generated per generator call inside a shard; part of the format's
# determinism contract (changing it changes the bytes), so it is a constant.
BLOCK_RECORDS = 256


@dataclass(frozen=True)
class ShardSpec:
    """One unit of build work."""

    index: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return shard_name(self.index)

    @property
    def records(self) -> int:
        return self.stop - self.start


def shard_name(index: int) -> str:
    """File name of shard ``index``."""
    return f"shard-{index:05d}.tar"


def plan_shards(total: int, per_shard: int) -> list[ShardSpec]:
    """Cut ``total`` records into consecutive shards of ``per_shard`` (the last may be shorter)."""
    if total < 1 or per_shard < 1:
        raise ValueError(f"plan needs total >= 1 and per_shard >= 1, got {total}, {per_shard}")
    return [ShardSpec(i, a, min(a + per_shard, total)) for i, a in enumerate(range(0, total, per_shard))]


def block_rng(seed: int, shard: int, block: int) -> np.random.Generator:
    """The generator for one block of one shard: a pure function of (seed, shard, block)."""
    return np.random.default_rng(np.random.SeedSequence([seed, shard, block]))
