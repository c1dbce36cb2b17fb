"""Per-member payload codecs: zstd (one frame per member, content checksum on) or none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zstandard

from cachebuild.errors import ConfigError
from cachebuild.format.names import ZSTD_SUFFIX

__all__ = ["Codec", "parse_codec", "CODEC_NAMES"]

CODEC_NAMES = ("zstd", "none")


@dataclass(frozen=True)
class Codec:
    """How each tar member's payload is stored.

    ``zstd`` compresses every member on its own (so any record is one slice and
    one decompression away); ``none`` stores plain ``.npy`` bytes, which a tmpfs
    cache prefers when CPU is scarcer than RAM.
    """

    name: str = "zstd"
    level: int = 1

    @property
    def suffix(self) -> str:
        """File-name suffix added to each member (``.zst`` or nothing)."""
        return ZSTD_SUFFIX if self.name == "zstd" else ""

    def compressor(self) -> "zstandard.ZstdCompressor | None":
        """A fresh compressor (not thread-safe; make one per writer)."""
        if self.name == "none":
            return None
        return zstandard.ZstdCompressor(level=self.level, write_checksum=True, write_content_size=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the manifest."""
        return {"name": self.name, "level": self.level if self.name == "zstd" else None}


def parse_codec(name: str | dict[str, Any] | Codec, level: int | None = None, keys: tuple[str, str] = ("codec", "codec.level")) -> Codec:
    """Validate a codec name (and zstd level) from the CLI, a config or a manifest.

    ``keys`` are the names an error gives the two values: a recipe's are ``build.codec`` and
    ``build.level`` (what ``--set`` and the flags write), a manifest's ``codec`` and ``codec.level``."""
    if isinstance(name, Codec):
        return name
    if isinstance(name, dict):
        return parse_codec(name.get("name", "zstd"), name.get("level"), keys)
    if name not in CODEC_NAMES:
        raise ConfigError.bad_value(keys[0], name, f"must be one of {', '.join(CODEC_NAMES)}")
    if name == "none":
        return Codec("none", 0)
    lvl = 1 if level is None else level
    if not isinstance(lvl, int) or isinstance(lvl, bool) or not -7 <= lvl <= 22:
        raise ConfigError.bad_value(keys[1], lvl, "must be an integer from -7 to 22")
    return Codec("zstd", lvl)
