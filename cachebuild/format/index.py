"""The sidecar index of a shard: where each member's payload lies and what it decodes to.

One ``.idx.npy`` file per shard holds a structured array of shape
``[records, fields]`` (field order = the manifest's field order). With the tar
memory-mapped, record ``r``'s field ``f`` is the slice
``tar[offset : offset + size]``; decoded, its last ``nbytes`` bytes are the array
data (the ``.npy`` header precedes them), of shape ``shape[:ndim]``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from cachebuild.errors import ShardCorruptError

__all__ = ["INDEX_DTYPE", "MAX_NDIM", "load_index", "index_bytes"]

MAX_NDIM = 5

INDEX_DTYPE = np.dtype(
    [
        ("offset", "<i8"),  # payload start inside the tar
        ("size", "<i8"),  # stored payload length (compressed or raw)
        ("nbytes", "<i8"),  # decoded array-data length (npy header excluded); JSON: text length
        ("crc32", "<u4"),  # zlib.crc32 of the stored payload
        ("ndim", "<i4"),
        ("shape", "<i4", (MAX_NDIM,)),  # unused trailing dims are 1
    ]
)


def index_bytes(index: np.ndarray) -> bytes:
    """Serialise an index array to ``.npy`` bytes (deterministic)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(index, dtype=INDEX_DTYPE), allow_pickle=False)
    return buf.getvalue()


def load_index(path: str | Path, n_fields: int | None = None) -> np.ndarray:
    """Read a shard index, checking its dtype and rank; errors name the file."""
    try:
        index = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # numpy raises several types for a malformed file
        raise ShardCorruptError(f"index {path}: unreadable ({exc})") from exc
    if index.dtype != INDEX_DTYPE or index.ndim != 2:
        raise ShardCorruptError(f"index {path}: unexpected layout dtype={index.dtype} ndim={index.ndim}")
    if n_fields is not None and index.shape[1] != n_fields:
        raise ShardCorruptError(f"index {path}: has {index.shape[1]} fields, manifest lists {n_fields}")
    return index
