"""Clearing a ``TwinsContext`` region row before a graph is decoded into it: only what the last graph left.

A pool's graphs are decoded into rows of host regions that held other pools' graphs before
(:mod:`loaders.pool_decoder`). Padded fields must read zero outside the graph (``base [S, N]``,
``int``/``delta [K, S, N]``, ``adj [N, N]`` beyond its ``n`` nodes and ``K`` worlds), and the
scatter writes only the graph's own ``[:K, :, :n]``. Zeroing the pool's rows whole cost 1.2-3.4 ms of
the decode thread's ~34 ms a 1,000-graph pool (28.6 MB at the default recipe's ``N = K = 10``),
though a row needs it only where the graph before it was larger: the rows keep their graph's
extents (``n``, the ``worlds`` key: ``K``), and a row is cleared only when the last graph's ``n`` or
``K`` exceeds the new one's, its ``[K, S, N]`` fields only up to the last ``K``. A row whose decode did
not finish reads as full (``N``, ``K`` of the layout), so it is cleared whole next time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WORLDS", "mark_full", "clear_stale"]

WORLDS = "worlds"
"""The host key holding each row's graph's ``K`` (its ``n`` is the ``n`` key)."""


def clear_stale(arrays: dict[str, np.ndarray], dest: np.ndarray, n: np.ndarray, k: np.ndarray, zero: list[str]) -> None:
    """Zero in rows ``dest`` of ``arrays`` what the graphs before them left beyond the new graphs' ``n`` nodes
    and ``k`` worlds (fields ``zero``), then mark the rows full until the new graphs are written (:func:`mark_full`)."""
    old_n, old_k = arrays["n"][dest], arrays[WORLDS][dest]
    stale = (old_n > n) | (old_k > k)
    mark_full(arrays, dest)
    if not stale.any():
        return
    rows, old_k = dest[stale], old_k[stale]
    for name in zero:
        a = arrays[name]
        if a.ndim < 4:  # base [S, N], adj [N, N]: a few KB a row
            a[rows] = 0
            continue
        for kk in np.unique(old_k).tolist():  # [K, S, N]: only the worlds the last graph had
            a[rows[old_k == kk], :kk] = 0


def mark_full(arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
    """Rows ``dest`` may hold anything up to the layout's ``N`` and ``K`` (a decode under way or failed)."""
    arrays["n"][dest] = arrays["adj"].shape[1]
    arrays[WORLDS][dest] = arrays["int"].shape[1]
