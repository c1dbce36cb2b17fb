"""Per-entry payload codecs: zstd (one frame per record and field, content checksum on) or none,
and how many records share a tar member (``pack``, see :mod:`cachebuild.format.packing`)."""

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
    pack: int = 1
    """Records per tar member the writer packs (1: one member per record and field)."""
    share: int | None = 0
    """zstd, ``pack > 1``: the most decoded bytes consecutive entries of a member may share one frame
    with (0: every entry its own frame; :mod:`cachebuild.format.shared_frames`). None (a build's
    options only): not asked, the builder chooses (:func:`cachebuild.builder.pack_choice.choose_share`)."""

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
        doc: dict[str, Any] = {"name": self.name, "level": self.level if self.name == "zstd" else None}
        if self.pack != 1:  # (absent in caches of one record per member, so their manifests are unchanged)
            doc["pack"] = self.pack
        if self.share:  # (absent when entries do not share frames: format v1-v3 manifests are unchanged)
            doc["share"] = self.share
        return doc


def parse_codec(name: str | dict[str, Any] | Codec, level: int | None = None, keys: tuple[str, ...] = ("codec", "codec.level", "codec.pack"), pack: Any = 1, share: Any = None) -> Codec:
    """Validate a codec name (and zstd level, and records per member) from the CLI, a config or a manifest.

    ``keys`` are the names an error gives the three values: a recipe's are ``build.codec``,
    ``build.level`` and ``build.pack`` (what ``--set`` and the flags write), a manifest's
    ``codec``, ``codec.level`` and ``codec.pack``. ``share`` (``build.share``, a manifest's ``codec.share``) needs
    zstd and ``pack > 1`` (None: not given, for the builder to choose)."""
    from cachebuild.format.packing import MAX_PACK, MAX_SHARE

    if isinstance(name, Codec):
        return name
    if isinstance(name, dict):
        return parse_codec(name.get("name", "zstd"), name.get("level"), keys, name.get("pack", 1), name.get("share", 0))
    if name not in CODEC_NAMES:
        raise ConfigError.bad_value(keys[0], name, f"must be one of {', '.join(CODEC_NAMES)}")
    pack_key = keys[2] if len(keys) > 2 else "pack"
    if not isinstance(pack, int) or isinstance(pack, bool) or not 1 <= pack <= MAX_PACK:
        raise ConfigError.bad_value(pack_key, pack, f"must be a whole number of records per tar member from 1 to {MAX_PACK}")
    share_key = keys[2].rsplit(".", 1)[0] + ".share" if len(keys) > 2 and "." in keys[2] else "share"
    if share is not None and (not isinstance(share, int) or isinstance(share, bool) or not 0 <= share <= MAX_SHARE or (share and (name != "zstd" or pack == 1))):
        raise ConfigError.bad_value(share_key, share, f"must be a whole number of bytes from 0 to {MAX_SHARE}, and 0 unless the codec is zstd with pack > 1")
    if name == "none":
        return Codec("none", 0, pack)
    lvl = 1 if level is None else level
    if not isinstance(lvl, int) or isinstance(lvl, bool) or not -7 <= lvl <= 22:
        raise ConfigError.bad_value(keys[1], lvl, "must be an integer from -7 to 22")
    return Codec("zstd", lvl, pack, share)
