"""NumPy ``.npy`` headers built once per (dtype, shape) instead of per array."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np

__all__ = ["npy_header", "npy_headers", "npy_header_lengths", "check_npy_header"]


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


_MAGIC = np.frombuffer(b"\x93NUMPY", np.uint8)


def npy_header_lengths(buffers: list[np.ndarray], buf_of: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Length of the ``.npy`` header (magic, version, length field and text) at the start of each decoded
    member (``buffers[buf_of[i]][offs[i] : offs[i] + lens[i]]``), as its own length field says; -1 where the
    member does not start with a ``.npy`` magic and version 1.0, 2.0 or 3.0. Reads 12 bytes a member,
    one numpy gather per buffer (the block decoder's check that array data starts where its header ends)."""
    n = len(offs)
    head = np.zeros((n, 12), np.int64)
    for b in np.unique(buf_of).tolist() if n else []:
        k = np.flatnonzero(buf_of == b)
        buf = buffers[b]
        head[k] = buf[np.minimum(offs[k, None] + np.arange(12), len(buf) - 1)]
    major = head[:, 6]
    short = head[:, 8] | head[:, 9] << 8
    length = np.where(major == 1, 10 + short, 12 + (short | head[:, 10] << 16 | head[:, 11] << 24))
    ok = (head[:, :6] == _MAGIC).all(axis=1) & (major >= 1) & (major <= 3) & (head[:, 7] == 0) & (lens >= 12)
    out: np.ndarray = np.where(ok, length, -1)
    return out
