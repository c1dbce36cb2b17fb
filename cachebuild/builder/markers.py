"""Per-shard completion markers and the in-progress build record.

A shard counts as built (for resume) only when its ``.done.json`` marker exists,
names the same build fingerprint, and the tar and index on disk still hash to
the checksums it records.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.format.atomic import atomic_write_bytes, is_tmp_name
from cachebuild.format.generations import GENERATIONS_DIR
from cachebuild.format.limits import MAX_MANIFEST_BYTES
from cachebuild.format.manifest import MANIFEST_NAME, ShardEntry, confined_file

__all__ = ["BUILD_RECORD", "STAGING_DIR", "is_ours", "holds_cache", "manifest_damaged", "done_name", "write_done", "read_valid_done", "file_sha256", "write_json", "read_json"]

BUILD_RECORD = "build.json"
STAGING_DIR = ".overwrite"
"""The folder inside a cache where ``--overwrite`` builds its replacement (:mod:`cachebuild.builder.overwrite`)."""


def is_ours(name: str) -> bool:
    """A name a cachebuild cache folder may hold (anything else makes a folder without a cache foreign)."""
    return name in (MANIFEST_NAME, BUILD_RECORD, LOCK_NAME, GENERATIONS_DIR, STAGING_DIR) or name.startswith("shard-") or is_tmp_name(Path(name))


def holds_cache(folder: Path) -> bool:
    """True for a folder a cachebuild build wrote into (a cache, an unfinished build, one holding the build lock):
    an input scanner skips it, so an ``--out`` inside the input folder is never read back as input."""
    return any((folder / name).exists() for name in (MANIFEST_NAME, BUILD_RECORD, LOCK_NAME, STAGING_DIR))


def manifest_damaged(output: Any, manifest: dict[str, Any]) -> bool:
    """A complete cache whose files no longer match its manifest (missing, truncated, grown): a cheap size check
    on rerun; flipped bits of the same size are found by ``cachebuild verify``."""
    for entry in manifest.get("shards") or []:
        try:
            if output.size(entry["name"]) != entry["bytes"] or output.size(entry["index"]) != entry["index_bytes"]:
                return True
        except (KeyError, TypeError):
            return True
    return False


def done_name(shard: str) -> str:
    return shard.removesuffix(".tar") + ".done.json"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in large chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, doc: dict[str, Any], sync: bool = True) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(), sync=sync)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON document, or None when missing or unreadable (treated as not done): a link out of the
    folder, a FIFO (which would block), or a file over :data:`MAX_MANIFEST_BYTES` is unreadable too."""
    try:
        with open(confined_file(path.parent, path.name), "rb") as fh:
            doc = json.loads(fh.read(MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def write_done(output: Any, shard: ShardEntry, fingerprint: str, sync: bool = True) -> None:
    """Mark ``shard`` complete (the last file written for it)."""
    output.write_json(done_name(shard.name), {"fingerprint": fingerprint, "shard": shard.to_dict()}, sync=sync)


def read_valid_done(output: Any, name: str, fingerprint: str, deep: bool = True) -> ShardEntry | None:
    """The shard's record if it is complete and verifies, else None (so it is rebuilt).

    ``deep`` re-hashes the tar and index (always for local outputs); remote
    outputs are checked by size, since their checksums are verified on arrival
    by every reader.
    """
    doc = output.read_json(done_name(name))
    if not doc or doc.get("fingerprint") != fingerprint:
        return None
    try:
        shard = ShardEntry(**doc["shard"])
    except (KeyError, TypeError):
        return None
    if shard.name != name or output.size(name) != shard.bytes or output.size(shard.index) is None:
        return None
    if deep and (output.sha256(name) != shard.sha256 or output.sha256(shard.index) != shard.index_sha256):
        return None
    return shard
