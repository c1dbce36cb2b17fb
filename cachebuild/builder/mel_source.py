"""The mel sources (HDF5 file, WAV folder, synthetic clips) as record sources for the builder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Mapping

from cachebuild.errors import ConfigError, SourceError
from cachebuild.mel.config import MelConfig
from cachebuild.mel.sources import estimated_record_bytes, record_fields

if TYPE_CHECKING:
    from cachebuild.recipes import Recipe

__all__ = ["MelBuildSource", "MEL_BLOCK_FILES", "mel_source_from"]

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

    def input_files(self) -> list[str]:
        """The files the records are read from (none for synthetic clips)."""
        files = getattr(self.source, "input_files", None)
        return list(files()) if files is not None else []

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for a in range(start, stop, MEL_BLOCK_FILES):
            yield self.source.records(a, min(a + MEL_BLOCK_FILES, stop))


def mel_source_from(
    recipe: Recipe,
    from_h5: str | Path | None = None,
    from_wav: str | Path | None = None,
    synthetic: int | None = None,
    h5_datasets: Mapping[str, str] | None = None,
) -> Any:
    """The mel build source of a parsed recipe and exactly one input (HDF5 file, WAV folder or N synthetic clips)."""
    from cachebuild.checks import MAX_RECORDS, whole
    from cachebuild.mel.config import parse_mel_config
    from cachebuild.mel.sources import H5Source, SyntheticSource, WavFolderSource

    given = [name for name, v in (("--from-h5", from_h5), ("--from-wav", from_wav), ("--synthetic", synthetic)) if v is not None]
    if len(given) != 1:
        raise ConfigError(
            f"give exactly one source: --from-h5 FILE, --from-wav DIR or --synthetic N with `cachebuild mel`, or a [source] table "
            f'(h5 = "FILE", wav = "DIR" or synthetic = N) in a recipe for `cachebuild build` (got {", ".join(given) or "none"})'
        )
    cfg = parse_mel_config(recipe.table)
    source: H5Source | WavFolderSource | SyntheticSource
    if from_h5 is not None:
        source = H5Source(from_h5, cfg, dict(h5_datasets) if h5_datasets else None)
    elif from_wav is not None:
        source = WavFolderSource(from_wav, cfg)
    else:
        assert synthetic is not None  # exactly one source is given
        whole("--synthetic", synthetic, 1, MAX_RECORDS)
        source = SyntheticSource(synthetic, cfg, recipe.seed)
    if len(source) == 0:
        raise SourceError(f"the source has no usable audio files: {source.describe().get('path')}")
    # source.cfg describes the records: for stored HDF5 mels, the file's parameters
    return MelBuildSource(source.cfg, source)
