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


def load_index(path: str | Path, n_fields: int | None = None, records: int | None = None) -> np.ndarray:
    """Read a shard index, checking its header (dtype, rank, shape against ``records`` and
    ``n_fields`` and the file's size) before reading any data; errors name the file."""
    with open(path, "rb") as fh:  # FileNotFoundError passes through
        try:
            version = np.lib.format.read_magic(fh)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(fh, max_header_size=10000)
        except (ValueError, TypeError, SyntaxError) as exc:  # numpy raises several types for a malformed header
            raise ShardCorruptError(f"index {path}: unreadable ({exc})") from exc
        if dtype != INDEX_DTYPE or len(shape) != 2 or fortran:
            raise ShardCorruptError(f"index {path}: unexpected layout dtype={dtype} shape={list(shape)} fortran_order={fortran}")
        if n_fields is not None and shape[1] != n_fields:
            raise ShardCorruptError(f"index {path}: has {shape[1]} fields, manifest lists {n_fields}")
        if records is not None and shape[0] != records:
            raise ShardCorruptError(f"index {path}: {shape[0]} records, manifest says {records}")
        start = fh.tell()
        size = fh.seek(0, 2)
        want = int(shape[0]) * int(shape[1]) * INDEX_DTYPE.itemsize
        if size - start != want:
            raise ShardCorruptError(f"index {path}: {size - start} bytes of entries, its header promises {want} (truncated or corrupt)")
        fh.seek(start)
        return np.fromfile(fh, dtype=INDEX_DTYPE, count=int(shape[0]) * int(shape[1])).reshape(shape)
