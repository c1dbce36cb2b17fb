"""Names and constants of the shard format, shared by the writer and every reader.

One place says how a record's key is spelled, what its tar members are called,
what a shard's sidecar index and the cache's manifest are called, and which
dtype marks a JSON field. The writer (:mod:`cachebuild.format.shard_writer`)
and the readers (:mod:`cachebuild.format.reader`, :mod:`~cachebuild.format.decode`,
:mod:`~cachebuild.format.index_check`, the loader) import them from here, so
the two sides cannot drift apart.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_SUFFIX",
    "JSON_DTYPE",
    "KEY_DIGITS",
    "MANIFEST_NAME",
    "NPY_SUFFIX",
    "TAR_SUFFIX",
    "ZSTD_SUFFIX",
    "index_name",
    "member_name",
    "record_key",
]

FORMAT_NAME = "cachebuild-shards"
"""The manifest's ``format`` value."""
FORMAT_VERSION = 1
"""The manifest's ``version``: what this cachebuild writes and reads."""
MANIFEST_NAME = "manifest.json"
"""The manifest's file name at the cache root."""
JSON_DTYPE = "json"
"""The dtype a field schema gives a JSON (metadata) member."""
KEY_DIGITS = 10
"""Digits of a record key: the global record id, zero-padded."""
TAR_SUFFIX = ".tar"
INDEX_SUFFIX = ".idx.npy"
NPY_SUFFIX = ".npy"
ZSTD_SUFFIX = ".zst"


class _Suffixed(Protocol):
    """What :func:`member_name` needs of a :class:`~cachebuild.format.codec.Codec`: its member suffix."""

    @property
    def suffix(self) -> str: ...


def record_key(record_id: int) -> str:
    """The WebDataset key of a record: its global id, zero-padded to :data:`KEY_DIGITS` digits."""
    return f"{record_id:0{KEY_DIGITS}d}"


def member_name(key: str, field: str, dtype: str, codec: _Suffixed) -> str:
    """``{key}.{field}.npy[.zst]``, or ``{key}.{field}[.zst]`` for a JSON field."""
    if dtype == JSON_DTYPE:
        return f"{key}.{field}{codec.suffix}"
    return f"{key}.{field}{NPY_SUFFIX}{codec.suffix}"


def index_name(shard_name: str) -> str:
    """Sidecar index file name of a shard (``shard-00000.tar`` -> ``shard-00000.idx.npy``)."""
    return shard_name.removesuffix(TAR_SUFFIX) + INDEX_SUFFIX
