"""Names and constants of the shard format, shared by the writer and every reader.

One place says how a record's key is spelled, what its tar members are called,
what a shard's sidecar index and the cache's manifest are called, and which
dtype marks a JSON field. The writer (:mod:`cachebuild.format.shard_writer`)
and the readers (:mod:`cachebuild.format.reader`, :mod:`~cachebuild.format.decode`,
:mod:`~cachebuild.format.index_check`, the loader) import them from here, so
the two sides cannot drift apart.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "PACKED_VERSION",
    "SHARED_VERSION",
    "INDEX_SUFFIX",
    "PACKED_INDEX_SUFFIX",
    "JSON_DTYPE",
    "JSONL_SUFFIX",
    "KEY_DIGITS",
    "MANIFEST_NAME",
    "NPY_SUFFIX",
    "TAR_SUFFIX",
    "ZSTD_SUFFIX",
    "index_name",
    "member_name",
    "member_name_bytes",
    "record_key",
]

FORMAT_NAME = "cachebuild-shards"
"""The manifest's ``format`` value."""
FORMAT_VERSION = 1
"""The manifest's ``version`` of a cache of one generation and one record per member (versions
2 and 3 add generations and packed members; :func:`cachebuild.format.manifest.manifest_version`)."""
PACKED_VERSION = 3
"""The manifest's ``version`` once a shard packs several records per member (older readers refuse it)."""
SHARED_VERSION = 4
"""The manifest's ``version`` once entries of a packed member may share a zstd frame (``codec.share``)."""
MANIFEST_NAME = "manifest.json"
"""The manifest's file name at the cache root."""
JSON_DTYPE = "json"
"""The dtype a field schema gives a JSON (metadata) member."""
KEY_DIGITS = 10
"""Digits of a record key: the global record id, zero-padded."""
TAR_SUFFIX = ".tar"
INDEX_SUFFIX = ".idx.npy"
PACKED_INDEX_SUFFIX = ".idx.npy.zst"
"""A packed shard's index: the same ``.npy``, one zstd frame (52 bytes per record and field shrink to a few)."""
NPY_SUFFIX = ".npy"
ZSTD_SUFFIX = ".zst"
JSONL_SUFFIX = ".jsonl"


class _Suffixed(Protocol):
    """What :func:`member_name` needs of a :class:`~cachebuild.format.codec.Codec`: its member suffix."""

    @property
    def suffix(self) -> str: ...


def record_key(record_id: int) -> str:
    """The WebDataset key of a record: its global id, zero-padded to :data:`KEY_DIGITS` digits."""
    return f"{record_id:0{KEY_DIGITS}d}"


_KEY_POWERS = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)


def member_name_bytes(keys: np.ndarray, suffixes: Sequence[str], width: int = 100) -> tuple[np.ndarray, np.ndarray] | None:
    """The tar name field of every member of records ``keys`` (record ids), each with every suffix in turn:
    ``[len(keys) * len(suffixes), width]`` uint8 ``record_key(k) + suffix``, NUL-padded, and each name's
    byte sum (the header checksum's share), in a few numpy operations instead of a string per member.
    None where that does not apply: a key of more than :data:`KEY_DIGITS` digits, a name longer than
    ``width``, a suffix that is not ASCII (the names are then made one by one, and checked)."""
    try:
        enc = [s.encode("ascii") for s in suffixes]
    except UnicodeEncodeError:
        return None
    keys = np.asarray(keys, np.int64)
    if not len(keys) or not enc or keys.min() < 0 or keys.max() >= 10**KEY_DIGITS or KEY_DIGITS + max(map(len, enc)) > width:
        return None
    digits = (keys[:, None] // _KEY_POWERS) % 10 + ord("0")
    out = np.zeros((len(keys), len(enc), width), np.uint8)
    out[:, :, :KEY_DIGITS] = digits[:, None, :]
    for j, s in enumerate(enc):
        out[:, j, KEY_DIGITS : KEY_DIGITS + len(s)] = np.frombuffer(s, np.uint8)
    sums = digits.sum(axis=1)[:, None] + np.array([sum(s) for s in enc], np.int64)
    return out.reshape(-1, width), sums.reshape(-1)


def member_name(key: str, field: str, dtype: str, codec: _Suffixed, packed: bool = False) -> str:
    """``{key}.{field}.npy[.zst]``; for a JSON field ``{key}.{field}[.zst]``, or ``{key}.{field}.jsonl[.zst]``
    in a shard of packed members (JSON Lines of several records, see :mod:`cachebuild.format.packing`)."""
    if dtype == JSON_DTYPE:
        return f"{key}.{field}{JSONL_SUFFIX if packed else ''}{codec.suffix}"
    return f"{key}.{field}{NPY_SUFFIX}{codec.suffix}"


def index_name(shard_name: str, packed: bool = False) -> str:
    """Sidecar index file name of a shard (``shard-00000.tar`` -> ``shard-00000.idx.npy``, or
    ``shard-00000.idx.npy.zst`` for a shard of packed members)."""
    return shard_name.removesuffix(TAR_SUFFIX) + (PACKED_INDEX_SUFFIX if packed else INDEX_SUFFIX)
