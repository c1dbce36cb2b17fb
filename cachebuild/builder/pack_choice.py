"""How many records a build packs per tar member (``codec.pack``).

Given (``--pack``, ``build.pack``, ``pack=``): that value, lowered so a member stays
within :data:`~cachebuild.format.packing.MEMBER_BYTES` (said in one warning line).
Not given and left at the recipes' :data:`~cachebuild.format.packing.DEFAULT_PACK`: the
pack of the cache already at the output, if any (a rerun resumes or confirms a cache in its
own layout, as an append grows it in its own; not with ``overwrite``, which replaces that
cache, so the command writes what it writes into an empty folder; not from the record of a
build that finished no shard, which the rerun starts over), otherwise
:func:`~cachebuild.format.packing.default_pack` of the source's record size. (A
``BuildOptions`` made in code with another ``Codec.pack`` keeps that value.)

``codec.share`` (shared frames, :mod:`cachebuild.format.shared_frames`) follows the same
rule: the cache's own where there is one (0 for caches written before shared frames, so they
are confirmed and resumed as they are), else :data:`~cachebuild.format.packing.SHARE_BYTES`
for a packed zstd build, 0 otherwise.
"""

from __future__ import annotations

import warnings
from typing import Any

from cachebuild.builder.markers import BUILD_RECORD
from cachebuild.builder.output import Output
from cachebuild.format.manifest import MANIFEST_NAME
from cachebuild.format.codec import Codec
from cachebuild.format.packing import DEFAULT_PACK, MAX_PACK, MAX_SHARE, MEMBER_BYTES, SHARE_BYTES, default_pack, effective_pack

__all__ = ["choose_pack", "choose_share"]


def choose_pack(asked: int, given: bool, record_bytes: int, out: Output | None) -> int:
    """The ``pack`` a fresh build (or its rerun) writes with; see the module's docstring. ``out``
    None: no cache there counts (``--overwrite`` replaces it, recipe and layout alike)."""
    if given or asked != DEFAULT_PACK:
        pack = effective_pack(asked, record_bytes)
        if given and pack < asked:
            msg = f"build.pack = {asked}: packing {pack} records per tar member instead, so a member stays within {MEMBER_BYTES >> 20} MB (records of about {record_bytes:,} bytes)"
            warnings.warn(msg, UserWarning, stacklevel=3)
        return pack
    existing = _existing_pack(out) if out is not None else None
    return existing if existing is not None else effective_pack(default_pack(record_bytes), record_bytes)


def choose_share(codec: Codec, out: Output | None) -> int:
    """The ``codec.share`` a fresh build (or its rerun) writes with, ``codec.pack`` chosen; see the module's docstring.
    A ``build.share`` asked for where the pack chosen is 1 (records of 8 KiB and more, or a rerun of a
    pack-1 cache) has nothing to share: said in one warning line, as a ``pack`` lowered is."""
    if codec.name != "zstd" or codec.pack <= 1:
        if codec.share:
            msg = f"build.share = {codec.share}: no effect, this cache stores 1 record per tar member (pack 1), and only the entries of a packed member share frames (--pack N packs them)"
            warnings.warn(msg, UserWarning, stacklevel=3)
        return 0
    if codec.share is not None:  # (asked for: build.share, share=, a Codec made in code)
        return codec.share
    doc = _existing_codec(out) if out is not None else None
    if doc is None:
        return SHARE_BYTES
    share = _whole(doc.get("share", 0), 0, MAX_SHARE)
    return 0 if share is None else share


def _existing_pack(out: Output) -> int | None:
    """The ``codec.pack`` of the cache (manifest) or unfinished build (build record) at ``out``;
    None when there is none or it does not say (a bad value is left to the rerun's own checks)."""
    doc = _existing_codec(out)
    if doc is None:
        return None
    return _whole(doc.get("pack", 1), 1, MAX_PACK)  # a format-v1 manifest leaves its pack (1) out


def _whole(value: Any, lo: int, hi: int) -> int | None:
    """``value`` if it is a whole number (not a bool) from ``lo`` to ``hi``, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi else None


def _existing_codec(out: Output) -> dict[str, Any] | None:
    """The ``codec`` document of the cache (manifest) or unfinished build (build record) at ``out``, or None."""
    try:
        names = set(out.names())
    except OSError:
        return None
    resumable = any(n.endswith(".done.json") for n in names)  # (as the rerun's own check: nothing to keep otherwise)
    for name, path in ((MANIFEST_NAME, ("codec",)), (BUILD_RECORD, ("doc", "codec"))):
        if name not in names or (name == BUILD_RECORD and not resumable):
            continue
        doc = out.read_json(name)
        for key in path:
            doc = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(doc, dict) and "name" in doc:
            return doc
    return None
