"""Padded copies of short rows, one opaque item per row.

Scattering a record ``[..., n]`` into a batch key ``[B, ..., N]`` (``n < N``: a
graph's nodes, padded to the cache's largest) is a strided copy whose innermost
rows are a few elements long; numpy's copy loop then pays its per-row overhead
every few elements. Viewed as one ``V{n * itemsize}`` item per row on both
sides, the same bytes move row by row. Used by
:meth:`cachebuild.format.decode.FieldBlock.scatter`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_rows"]


def as_rows(target: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``target`` and ``data`` with their last axis viewed as one opaque item (``V{bytes}``), or None.

    A padded copy's innermost rows are short (a graph's ``n`` floats): numpy's strided copy then
    pays its inner-loop cost per few elements; as one item per row it copies whole rows (about 2x
    faster for the causal ``int`` field). Same bytes either way; only where no cast is needed and
    both last axes are contiguous.
    """
    if data.ndim < 2 or target.dtype != data.dtype or data.shape[-1] < 2:
        return None
    size = data.dtype.itemsize
    if target.strides[-1] != size or data.strides[-1] != size:
        return None
    row = np.dtype((np.void, size * data.shape[-1]))
    return target.view(row)[..., 0], data.view(row)[..., 0]
