"""Windows of a flat array copied whole (``window_rows``), the lengths' mask from them (``length_mask``),
and a pooled batch's flat rows (``_read_flat``), against element-by-element references."""

from __future__ import annotations

import numpy as np
import pytest

from cachebuild.format.segments import length_mask, window_rows
from loaders.views.records_pool import _read_flat

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float16", "float32", "float64", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_rows_are_the_slices(dtype: str) -> None:
    rng = np.random.default_rng(3)
    flat = (rng.standard_normal(1000) * 100).astype(dtype)
    for wide in (1, 2, 7, 64, 1000):
        starts = rng.integers(0, len(flat) - wide + 1, 37)
        got = window_rows(flat, starts, wide)
        assert got.dtype == flat.dtype and got.shape == (37, wide)
        for i, s in enumerate(starts.tolist()):
            assert got[i].tobytes() == flat[s : s + wide].tobytes()


def test_window_rows_of_a_view_read_only_that_view() -> None:
    base = np.arange(100, dtype=np.int32)
    flat = base[10:60]  # (an offset view: the buffer is the view's, not the base's)
    got = window_rows(flat, np.array([0, 40]), 10)
    assert got.tolist() == [list(range(10, 20)), list(range(50, 60))]


@pytest.mark.parametrize("width", [1, 2, 9, 500])
def test_length_mask_is_the_compare(width: int) -> None:
    rng = np.random.default_rng(width)
    lengths = rng.integers(0, width + 1, 300)
    out = np.empty((300, width), bool)
    length_mask(lengths, out)
    assert np.array_equal(out, np.arange(width)[None, :] < lengths[:, None])


def test_length_mask_of_no_rows() -> None:
    out = np.empty((0, 4), bool)
    assert length_mask(np.zeros(0, np.int64), out).shape == (0, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_rows_are_the_records_then_zeros(dtype: str) -> None:
    """Both ways: windows as wide as the row (the widest record at least half of it) and as wide as the
    widest record (the rest zeroed); NaN past a record in floats; records in the array's last window."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        width = int(rng.integers(1, 40))
        lengths = rng.integers(0, width + 1, int(rng.integers(1, 30)))
        flat = (rng.standard_normal(int(lengths.sum()) + int(rng.integers(0, 4))) * 50).astype(dtype)
        if flat.dtype.kind == "f":
            flat[rng.random(len(flat)) < 0.2] = np.nan
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        pick = rng.integers(0, len(lengths), int(rng.integers(1, 12)))
        at, length = starts[pick], lengths[pick]
        mask = np.arange(width)[None, :] < length[:, None]
        out = np.full((len(pick), width), 1, dtype)
        _read_flat(flat, at, length, out, mask)
        for i in range(len(pick)):
            want = np.zeros(width, dtype)
            want[: length[i]] = flat[at[i] : at[i] + length[i]]
            assert out[i].tobytes() == want.tobytes(), (trial, i)
