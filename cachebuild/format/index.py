"""The sidecar index of a shard: where each member's payload lies and what it decodes to.

One ``.idx.npy`` file per shard holds a structured array of shape
``[records, fields]`` (field order = the manifest's field order); a shard of
packed members (:mod:`cachebuild.format.packing`) stores the same ``.npy`` as
one zstd frame, ``.idx.npy.zst`` (``zstd -d`` gives the ``.idx.npy``). With the tar
memory-mapped, record ``r``'s field ``f`` is the slice
``tar[offset : offset + size]``; decoded, its last ``nbytes`` bytes are the array
data (the ``.npy`` header precedes them), of shape ``shape[:ndim]``. Entries that
share a zstd frame (format v4) have that frame's offset and size, and a record's
data ends before the later entries' (:mod:`cachebuild.format.shared_frames`).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError

__all__ = ["INDEX_DTYPE", "MAX_NDIM", "load_index", "index_bytes", "index_from_bytes", "compress_index"]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MAX_HEADER = 10000
_MAX_INDEX_BYTES = 1 << 34  # a compressed index may declare at most this (a shard's records x fields bound it first)

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


def compress_index(data: bytes) -> bytes:
    """A packed shard's index file: the ``.npy`` bytes as one zstd frame (size and checksum in it).
    Level 6: on a 2 KB-record shard's index 5.6 instead of 6.3 bytes per record (level 3) for
    6.2 instead of 5.1 ms per 325 KB (levels 9-15 compress it worse, 19 better but 70x slower)."""
    return zstandard.ZstdCompressor(level=6, write_checksum=True, write_content_size=True).compress(data)


def load_index(path: str | Path, n_fields: int | None = None, records: int | None = None) -> np.ndarray:
    """Read a shard index (plain or zstd-compressed), checking its header (dtype, rank, shape against
    ``records`` and ``n_fields`` and the file's size) before trusting any entry; errors name the file."""
    with open(path, "rb") as fh:  # FileNotFoundError passes through
        data = fh.read()
    return index_from_bytes(data, str(path), n_fields, records)


def _decompressed(data: bytes, where: str, n_fields: int | None, records: int | None) -> bytes:
    """A compressed index's ``.npy`` bytes, refusing a frame that declares (or decodes to) more than the
    index can hold, and anything after the one frame the writer writes."""
    most = _MAX_HEADER + records * n_fields * INDEX_DTYPE.itemsize if records is not None and n_fields is not None else _MAX_INDEX_BYTES
    try:
        declared = zstandard.frame_content_size(data)
        if declared == -1:  # unknown: a frame written by a stream (`... | zstd`); read at most `most` + 1
            declared = len(zstandard.ZstdDecompressor().stream_reader(data).read(most + 1))
            if declared > most:
                raise ShardCorruptError(f"index {where}: zstd frame decodes to more than {most} bytes, the most its manifest entry allows (corrupt)")
        elif not 0 <= declared <= most:
            raise ShardCorruptError(f"index {where}: zstd frame declares {declared} bytes, at most {most} expected (corrupt)")
        dobj = zstandard.ZstdDecompressor().decompressobj()  # bounded now: zstd stops a frame at its declared size
        out: bytes = dobj.decompress(data)
    except zstandard.ZstdError as exc:
        raise ShardCorruptError(f"index {where}: unreadable zstd frame ({exc})") from exc
    if not dobj.eof:
        raise ShardCorruptError(f"index {where}: zstd frame is truncated (corrupt)")
    if dobj.unused_data:
        raise ShardCorruptError(f"index {where}: {len(dobj.unused_data)} bytes after its zstd frame (corrupt, or not written by cachebuild)")
    return out


def index_from_bytes(data: bytes, where: str, n_fields: int | None = None, records: int | None = None) -> np.ndarray:
    """An index from a file's bytes (a zstd frame is decompressed first, bounded); see :func:`load_index`."""
    if data[:4] == _ZSTD_MAGIC:
        data = _decompressed(data, where, n_fields, records)
    buf = io.BytesIO(data)
    known = _known_header(data)
    if known is not None:  # (the writer's own header: no ast parse)
        shape, fortran, dtype = known[0], False, INDEX_DTYPE
        buf.seek(known[1])
    else:
        try:
            version = np.lib.format.read_magic(buf)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(buf, max_header_size=_MAX_HEADER)
        except (ValueError, TypeError, SyntaxError) as exc:  # numpy raises several types for a malformed header
            raise ShardCorruptError(f"index {where}: unreadable ({exc})") from exc
    if dtype != INDEX_DTYPE or len(shape) != 2 or fortran:
        raise ShardCorruptError(f"index {where}: unexpected layout dtype={dtype} shape={list(shape)} fortran_order={fortran}")
    if n_fields is not None and shape[1] != n_fields:
        raise ShardCorruptError(f"index {where}: has {shape[1]} fields, manifest lists {n_fields}")
    if records is not None and shape[0] != records:
        raise ShardCorruptError(f"index {where}: {shape[0]} records, manifest says {records}")
    start = buf.tell()
    want = int(shape[0]) * int(shape[1]) * INDEX_DTYPE.itemsize
    if len(data) - start != want:
        raise ShardCorruptError(f"index {where}: {len(data) - start} bytes of entries, its header promises {want} (truncated or corrupt)")
    return np.frombuffer(data, INDEX_DTYPE, int(shape[0]) * int(shape[1]), start).reshape(shape)


_KNOWN_HEADER = re.compile(rb"\x93NUMPY\x01\x00(..)\{'descr': " + re.escape(repr(INDEX_DTYPE.descr).encode()) + rb", 'fortran_order': False, 'shape': \((\d{1,12}), (\d{1,4})\), \} *\n", re.DOTALL)


def _known_header(data: bytes) -> tuple[tuple[int, ...], int] | None:
    """``(shape, data offset)`` of a ``.npy`` header exactly as :func:`index_bytes` writes it (numpy's own
    1.0 layout for :data:`INDEX_DTYPE`), read without ``ast``; ``None`` for any other (numpy's reader then
    judges it). ``ast.literal_eval``, which numpy's reader uses, fails in a forked DataLoader worker on
    CPython 3.11 when the parent's AST state was left mid-count ("AST constructor recursion depth mismatch",
    python/cpython#106905); the index is the reader's one parse on opening a shard."""
    m = _KNOWN_HEADER.match(data, 0, 10 + _MAX_HEADER)
    if m is None or int.from_bytes(m.group(1), "little") != m.end() - 10:
        return None
    return (int(m.group(2)), int(m.group(3))), m.end()
