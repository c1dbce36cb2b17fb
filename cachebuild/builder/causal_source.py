"""The causal-graph generator as a record source for the builder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from cachebuild.builder.plan import block_rng
from cachebuild.causal import CAUSAL_FIELDS, CausalConfig, generate_graphs
from cachebuild.causal.sampler import sub_block_size

__all__ = ["CausalSource", "CAUSAL_BLOCK"]

# Graphs per generator call: the vectorised generator amortises its per-call
# set-up over about a thousand graphs. Part of the determinism contract.
CAUSAL_BLOCK = 2048


@dataclass(frozen=True)
class CausalSource:
    """Makes causal-graph records; block b of shard i is seeded from (seed, i, b)."""

    cfg: CausalConfig
    kind: str = "causal"
    block_records: ClassVar[int] = CAUSAL_BLOCK

    def fields(self) -> list[tuple[str, str]]:
        fields = [(k, v) for k, v in CAUSAL_FIELDS.items() if k != "json"]
        return fields + [("json", "json")]

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def estimated_record_bytes(self) -> int:
        return int(self.cfg.estimated_record_bytes())

    def determinism(self) -> dict[str, Any]:
        """What the bytes depend on beyond the config and seed (goes into the build fingerprint)."""
        return {"block_records": CAUSAL_BLOCK, "sub_block_graphs": sub_block_size(self.cfg)}

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for b, a in enumerate(range(start, stop, CAUSAL_BLOCK)):
            yield generate_graphs(self.cfg, block_rng(seed, shard, b), min(CAUSAL_BLOCK, stop - a))
