"""A small public test kit: a toy record source with variable shapes, for tests of
the format, the builder and the loaders that should not depend on a generator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import numpy as np

from cachebuild.builder.plan import BLOCK_RECORDS, block_rng

__all__ = ["ToySource"]


@dataclass(frozen=True)
class ToySource:
    """Records with a varying-size matrix, a fixed vector, a scalar id and JSON.

    Field ``ident`` holds the record's global id, so readers can check which
    record they got; ``mat`` has shape [n, n] with n in [n_min, n_max].
    """

    n_min: int = 2
    n_max: int = 6
    width: int = 8
    kind: str = "toy"
    block_records: ClassVar[int] = BLOCK_RECORDS

    def fields(self) -> list[tuple[str, str]]:
        return [("mat", "float32"), ("vec", "float64"), ("ident", "int64"), ("json", "json")]

    def config_dict(self) -> dict[str, Any]:
        return {"n_min": self.n_min, "n_max": self.n_max, "width": self.width}

    def estimated_record_bytes(self) -> int:
        n = (self.n_min + self.n_max) / 2
        return int(4 * n * n + 8 * self.width + 8 + 300)

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for b, a in enumerate(range(start, stop, BLOCK_RECORDS)):
            rng = block_rng(seed, shard, b)
            count = min(BLOCK_RECORDS, stop - a)
            ns = rng.integers(self.n_min, self.n_max + 1, size=count)
            vecs = rng.standard_normal((count, self.width))
            yield [
                {
                    "mat": rng.standard_normal((n, n)).astype(np.float32),
                    "vec": vecs[i],
                    "ident": np.array(a + i, dtype=np.int64),
                    "json": {"id": int(a + i), "n": int(n)},
                }
                for i, n in enumerate(ns)
            ]
