"""Padded rows copied as opaque items (cachebuild.format.rows): the same bytes as numpy's element copy."""

from __future__ import annotations

import numpy as np
import pytest

from cachebuild.format.rows import as_rows


@pytest.mark.parametrize("dtype", ["float32", "uint8", "int16", "float64"])
@pytest.mark.parametrize("shape", [(3, 7), (4, 2, 5), (6, 2)])
def test_row_copy_is_the_element_copy(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((5,) + shape) * 100).astype(dtype)
    data.reshape(-1)[::7] = -0.0 if data.dtype.kind == "f" else 0  # signed zeros travel as bytes
    dest = np.array([4, 0, 7, 2, 5])
    want = np.full((9,) + tuple(n + 3 for n in shape), 99, dtype)
    got = want.copy()
    want[(dest,) + tuple(slice(0, n) for n in shape)] = data
    target, rows = as_rows(got[(slice(None),) + tuple(slice(0, n) for n in shape)], data)
    target[dest] = rows
    assert got.tobytes() == want.tobytes()


def test_refused_where_bytes_would_differ_or_rows_are_not_contiguous() -> None:
    data = np.ones((2, 3, 4), np.float32)
    assert as_rows(np.zeros((5, 3, 4), np.float64), data) is None  # a cast: numpy converts, rows would not
    assert as_rows(np.zeros((5, 3, 8), np.float32)[..., ::2], data) is None  # strided last axis
    assert as_rows(np.zeros((5, 3, 4), np.float32), data[..., ::-1]) is None
    assert as_rows(np.zeros((5, 3, 1), np.float32), np.ones((2, 3, 1), np.float32)) is None  # one element: nothing to gain
    assert as_rows(np.zeros(5, np.float32), np.ones(2, np.float32)) is None  # 0-d records
