"""NumPy ``.npy`` headers built once per (dtype, shape) instead of per array."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np

__all__ = ["npy_header", "npy_headers", "npy_header_lengths", "writer_header_sizes", "check_npy_header"]


@lru_cache(maxsize=4096)
def _header(dtype_str: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype_str, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@lru_cache(maxsize=256)
def _descr(dtype: np.dtype) -> str:
    descr = np.lib.format.dtype_to_descr(dtype)
    if not isinstance(descr, str):  # a structured dtype: no field of the format holds one
        raise ValueError(f"dtype {dtype} is structured; fields hold plain numeric dtypes")
    return descr


def npy_header(arr: np.ndarray) -> bytes:
    """The exact ``.npy`` v1.0 header numpy writes for a C-contiguous ``arr``."""
    return _header(_descr(arr.dtype), arr.shape)


def npy_headers(dtype: np.dtype, shapes: list[tuple[int, ...]]) -> list[bytes]:
    """:func:`npy_header` of C-contiguous arrays of one ``dtype`` and these ``shapes`` (one lookup per distinct shape)."""
    descr = _descr(dtype)
    by_shape = {s: _header(descr, s) for s in set(shapes)}
    return [by_shape[s] for s in shapes]


def check_npy_header(header: bytes | memoryview, dtype: str, shape: tuple[int, ...], where: str) -> None:
    """Check a member's ``.npy`` header against what the index and manifest say (dtype, shape, C order).

    Parsed with numpy's own reader (``ast.literal_eval``, bounded size), so an
    object (``|O``) or structured header is reported, never acted on.
    """
    from cachebuild.errors import ShardCorruptError

    try:
        if bytes(header) == _header(_descr(np.dtype(dtype)), tuple(int(d) for d in shape)):
            return  # exactly what the writer writes: no ast parse (see cachebuild/format/index.py)
    except (TypeError, ValueError):  # (a dtype the writer never uses: numpy's reader says what is wrong)
        pass
    buf = io.BytesIO(bytes(header))
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            got_shape, fortran, got_dtype = np.lib.format.read_array_header_1_0(buf, max_header_size=4096)
        else:
            got_shape, fortran, got_dtype = np.lib.format.read_array_header_2_0(buf, max_header_size=4096)
    except (ValueError, TypeError, SyntaxError, OSError) as exc:
        raise ShardCorruptError(f"{where}: unreadable .npy header ({exc})") from exc
    if buf.tell() != len(header) or got_dtype != np.dtype(dtype) or got_dtype.hasobject or fortran or tuple(got_shape) != tuple(shape):
        raise ShardCorruptError(
            f"{where}: .npy header says dtype {got_dtype.str}, shape {tuple(got_shape)}, fortran_order {fortran}; the manifest and index say {np.dtype(dtype).str}, {tuple(shape)}, C order"
        )


_MAGIC_V1, _MAGIC_V2, _MAGIC_V3 = (int(np.frombuffer(b"\x93NUMPY" + bytes([v, 0]), "<u8")[0]) for v in (1, 2, 3))
"""The first 8 bytes of a ``.npy`` file of version 1.0, 2.0 and 3.0, read as a little-endian uint64."""
_HEAD = np.dtype([("magic", "<u8"), ("length", "<u4")])


def npy_header_lengths(buffers: list[np.ndarray], buf_of: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Length of the ``.npy`` header (magic, version, length field and text) at the start of each decoded
    member (``buffers[buf_of[i]][offs[i] : offs[i] + lens[i]]``), as its own length field says; -1 where the
    member does not start with a ``.npy`` magic and version 1.0, 2.0 or 3.0. Copies the first 12 bytes of
    each member, one numpy gather per run of members in one buffer (the block decoder's check that array
    data starts where its header ends: ~0.05 us a member)."""
    n = len(offs)
    head = np.zeros((n, 12), np.uint8)
    whole = lens >= 12  # (a shorter member is no .npy; its bytes are not read)
    cuts = (np.flatnonzero(buf_of[1:] != buf_of[:-1]) + 1).tolist() if n else []
    for a, b in zip([0, *cuts], [*cuts, n] if n else []):
        buf = buffers[int(buf_of[a])]
        if len(buf) >= 12:
            windows = np.lib.stride_tricks.as_strided(buf, shape=(len(buf) - 11, 12), strides=(1, 1), writeable=False)
            head[a:b] = windows[np.where(whole[a:b], offs[a:b], 0)]
    fields = head.view(_HEAD)[:, 0]
    magic, length = fields["magic"], fields["length"].astype(np.int64)
    out: np.ndarray = np.where(magic == _MAGIC_V1, 10 + (length & 0xFFFF), np.where((magic == _MAGIC_V2) | (magic == _MAGIC_V3), 12 + length, -1))
    return np.where(whole, out, -1)


def npy_size_fault(header: np.ndarray, size: np.ndarray, data: np.ndarray, what: str) -> tuple[int, str] | None:
    """The first member whose ``.npy`` header (``header``: :func:`npy_header_lengths`) plus its ``data``
    bytes is not its ``size``, and why in words (``what``: "decoded" or "stored"); ``None`` when all agree."""
    bad = np.flatnonzero((header < 0) | (header + data != size))
    if not bad.size:
        return None
    i = int(bad[0])
    h, n, d = int(header[i]), int(size[i]), int(data[i])
    why = f"{what} member does not start with a .npy header (magic, version 1-3)" if h < 0 else f"{what} .npy member is {n} bytes, its header says {h} bytes of header and the index {d} bytes of data"
    return i, why + " (data would be shifted: corrupt, or not written by cachebuild)"


def writer_header_sizes(dtype: str, shapes: np.ndarray, pack: int) -> np.ndarray:
    """Per record of one field of a shard (``shapes``: int ``[records, ndim]``): the length of the ``.npy``
    header the writer puts at the start of the record's member (with ``pack > 1``, the same for every record
    of a member; only its first frame holds it). A member's header gives its group's shape: ``(G, *shape)`` when the group's records
    share one shape, else ``(total elements,)`` (as :mod:`cachebuild.format.member_block` writes it).
    One header is made per distinct header shape (numpy's own writer, as :func:`npy_header`)."""
    records, ndim = shapes.shape
    out = np.zeros(records, np.int64)
    if not records:
        return out
    shapes = shapes.astype(np.int64)
    if pack <= 1:
        rows, keys = np.arange(records), np.concatenate([np.zeros((records, 1), np.int64), shapes], axis=1)
    else:
        rows = np.arange(0, records, pack)
        group = np.arange(records) // pack
        same = np.logical_and.reduceat((shapes == shapes[rows][group]).all(axis=1), rows)
        total = np.add.reduceat(shapes.prod(axis=1), rows)
        count = np.diff(np.append(rows, records))
        stacked = np.concatenate([np.ones((len(rows), 1), np.int64), count[:, None], shapes[rows]], axis=1)
        flat = np.concatenate([np.full((len(rows), 1), 2, np.int64), total[:, None], np.zeros((len(rows), ndim), np.int64)], axis=1)
        keys = np.where(same[:, None], stacked, flat)
    uniq, inverse = _unique_rows(keys)
    descr = _descr(np.dtype(dtype))
    sizes = np.array([len(_header(descr, _header_shape(u))) for u in uniq.tolist()], np.int64)
    out[:] = sizes[inverse.reshape(-1)] if pack <= 1 else np.repeat(sizes[inverse.reshape(-1)], np.diff(np.append(rows, records)))
    return out


def _unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_inverse=True)`` for non-negative int64 rows, through one int64 key
    per row where the rows' ranges allow it (a 1-d unique: ~10x faster than numpy's row sort)."""
    span = keys.max(axis=0) + 1
    if float(np.prod(span.astype(np.float64))) >= 2.0**62:
        return np.unique(keys, axis=0, return_inverse=True)
    mult = np.append(np.cumprod(span[::-1])[::-1][1:], 1)
    _, first, inverse = np.unique(keys @ mult, return_index=True, return_inverse=True)
    return keys[first], inverse


def _header_shape(key: list[int]) -> tuple[int, ...]:
    """A :func:`writer_header_sizes` key back to the header's shape: ``[0, *shape]`` the record's own,
    ``[1, G, *shape]`` a group of one shape stacked, ``[2, total, ...]`` a flat group."""
    kind = key[0]
    return tuple(key[1:]) if kind == 0 else tuple(key[1:]) if kind == 1 else (key[1],)
