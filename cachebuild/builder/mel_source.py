"""The mel sources (HDF5 file, WAV folder, synthetic clips) as record sources for the builder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from cachebuild.mel.config import MelConfig
from cachebuild.mel.sources import estimated_record_bytes, record_fields

__all__ = ["MelBuildSource", "MEL_BLOCK_FILES"]

# Files per source.records() call: large enough for the vectorised log-mel to
# reach full speed, small enough to keep worker memory low.
MEL_BLOCK_FILES = 64


@dataclass(frozen=True)
class MelBuildSource:
    """One record per audio file; records [a, b) come from ``source.records(a, b)``.

    The bytes depend only on the source (its files, or (seed, i) for synthetic
    clips) and the mel config, never on how the range is split.
    """

    cfg: MelConfig
    source: Any
    kind: str = "mel"
    block_records: ClassVar[int] = MEL_BLOCK_FILES

    def fields(self) -> list[tuple[str, str]]:
        return record_fields(self.cfg)

    def config_dict(self) -> dict[str, Any]:
        return {"mel": self.cfg.to_dict(), "source": self.source.describe()}

    def estimated_record_bytes(self) -> int:
        return estimated_record_bytes(self.cfg)

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for a in range(start, stop, MEL_BLOCK_FILES):
            yield self.source.records(a, min(a + MEL_BLOCK_FILES, stop))
