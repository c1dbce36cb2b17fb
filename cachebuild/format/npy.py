"""NumPy ``.npy`` headers built once per (dtype, shape) instead of per array."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np

__all__ = ["npy_header"]


@lru_cache(maxsize=4096)
def _header(dtype_str: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype_str, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@lru_cache(maxsize=256)
def _descr(dtype: np.dtype) -> str:
    return np.lib.format.dtype_to_descr(dtype)


def npy_header(arr: np.ndarray) -> bytes:
    """The exact ``.npy`` v1.0 header numpy writes for a C-contiguous ``arr``."""
    return _header(_descr(arr.dtype), arr.shape)
