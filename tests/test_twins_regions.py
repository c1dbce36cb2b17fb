"""Region rows of a ``TwinsContext`` are cleared only of what the graph before left (``twins_regions``).

The end-to-end check (every expanded key equal to the default ``twins`` view over two epochs, regions
reused by pools of other graphs) is ``tests/test_twins_pool.py``; here the rule itself, row by row."""

from __future__ import annotations

import numpy as np

from loaders.views.twins_regions import WORLDS, clear_stale, mark_full

S, K, N = 2, 3, 4


def _rows(count: int) -> dict[str, np.ndarray]:
    return {
        "base": np.zeros((count, S, N), np.float32),
        "int": np.zeros((count, K, S, N), np.float32),
        "adj": np.zeros((count, N, N), np.float32),
        "n": np.zeros(count, np.int64),
        WORLDS: np.zeros(count, np.int64),
    }


def _write(a: dict[str, np.ndarray], row: int, n: int, k: int) -> None:
    """A graph of ``n`` nodes and ``k`` worlds scattered into ``row``, as ``decode_twins`` does."""
    a["base"][row, :, :n] = 1
    a["int"][row, :k, :, :n] = 2
    a["adj"][row, :n, :n] = 3
    a["n"][row], a[WORLDS][row] = n, k


def _padding_is_zero(a: dict[str, np.ndarray], row: int, n: int, k: int) -> bool:
    base, world, adj = a["base"][row].copy(), a["int"][row].copy(), a["adj"][row].copy()
    base[:, :n], world[:k, :, :n], adj[:n, :n] = 0, 0, 0
    return not (base.any() or world.any() or adj.any())


def test_a_row_is_cleared_only_where_the_graph_before_was_larger() -> None:
    a = _rows(4)
    old = [(4, 3), (2, 1), (4, 1), (4, 3)]  # (n, k) of the graphs the rows held
    new = [(2, 1), (4, 3), (4, 3), (3, 3)]
    for r, (n, k) in enumerate(old):
        _write(a, r, n, k)
    dest = np.arange(4)
    clear_stale(a, dest, np.array([n for n, _ in new]), np.array([k for _, k in new]), ["base", "int", "adj"])
    assert (a["n"] == N).all() and (a[WORLDS] == K).all(), "rows read as full until the new graphs are written"
    assert not a["base"][0].any() and not a["int"][0].any() and not a["adj"][0].any(), "a larger graph before: cleared"
    assert a["base"][1].any() and a["int"][1].any(), "a smaller graph before: left for the scatter to overwrite"
    assert a["int"][2].any(), "more worlds now, same nodes: nothing stale"
    assert not a["base"][3].any() and not a["int"][3].any(), "fewer nodes now: cleared"
    for r, (n, k) in enumerate(new):
        _write(a, r, n, k)
        assert _padding_is_zero(a, r, n, k), r


def test_a_row_whose_decode_did_not_finish_is_cleared_whole_next_time() -> None:
    a = _rows(1)
    mark_full(a, np.arange(1))
    a["int"][0] = 7  # whatever a failed scatter left, up to the layout's K and N
    a["base"][0], a["adj"][0] = 7, 7
    clear_stale(a, np.arange(1), np.array([1]), np.array([1]), ["base", "int", "adj"])
    _write(a, 0, 1, 1)
    assert _padding_is_zero(a, 0, 1, 1)
