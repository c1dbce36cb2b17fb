"""Structural equations of a group of same-size graphs, node by node in causal order.

Simulation of one node ``j`` (causal order) for a set of rows (one row = one
world of one graph, holding S samples)::

    term_i = clip(w_ij * f_ij(clip(x_i, +-clip_parent)), +-clip_term)   (nonlinear; None = no clip)
    term_i = w_ij * x_i                                                  (linear)
    x_j    = ((noise_j + term_p0) + term_p1) + ...     parents p0 < p1 < ... in causal order
    x_j    = clip(x_j, +-clip_value)                   (nonlinear, nodes with parents only)

An interaction node replaces ``term_p0 + term_p1`` by ``term_p0 * term_p1``, clipped to
``+-clip_interaction``; with ``clip_rest`` its other terms are summed first and the sum
clipped to ``+-clip_rest`` (the users' 2026-01-06 dd4cd49 to 2026-01-14 generator:
``noise + (clip(t0 * t1) + clip(t2 + t3 + ...))``).
With ``mechanism.weights = "one"`` every ``w_ij`` is 1 and the multiply is
skipped. Root nodes are their noise, never clipped (as in the users' code).
The linear mechanism never clips, so its analytic formulas hold exactly.
Values are computed and stored in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import MechanismConfig
from .functions import apply_edge_function_

__all__ = ["Group", "simulate"]


class Group(NamedTuple):
    """Per-graph parameters of a group of same-size graphs, in causal order (leading axis: graph)."""

    adj: np.ndarray  # bool [g, n, n], strictly upper triangular
    perm: np.ndarray  # int [g, n]: node index of causal position j
    w: np.ndarray  # float32 [g, n, n]
    fn: np.ndarray  # int8 [g, n, n], -1 where no edge
    inter: np.ndarray  # bool [g, n]
    scale: np.ndarray  # float32 [g, n]
    kind_ids: np.ndarray  # int [g]: index into the noise kinds


def _edge_terms(xp: np.ndarray, f_e: np.ndarray, w_e: np.ndarray, mc: MechanismConfig) -> None:
    """Overwrite parent values ``xp`` [E, S] (edges sorted by function id) with edge terms."""
    if mc.kind == "linear":
        if mc.weights != "one":
            xp *= w_e[:, None]
        return
    if mc.clip_parent is not None:
        np.clip(xp, -mc.clip_parent, mc.clip_parent, out=xp)
    bounds = (np.flatnonzero(np.diff(f_e)) + 1).tolist()
    for a, b in zip([0] + bounds, bounds + [f_e.size]):
        apply_edge_function_(int(f_e[a]), xp[a:b])
    if mc.weights != "one":
        xp *= w_e[:, None]
    if mc.clip_term is not None:
        np.clip(xp, -mc.clip_term, mc.clip_term, out=xp)


def _clip_rows(acc: np.ndarray, rows: np.ndarray, bound: float) -> None:
    """Clip the rows of ``acc`` where ``rows`` is True to ``+-bound``."""
    if rows.all():
        np.clip(acc, -bound, bound, out=acc)
    else:
        idx = np.flatnonzero(rows)
        acc[idx] = np.clip(acc[idx], -bound, bound)


def _interact(terms: np.ndarray, first: np.ndarray, count: np.ndarray, mc: MechanismConfig) -> None:
    """Interaction nodes (their terms start at ``first``): term 0 becomes 0, term 1 the product
    of both (clipped to ``clip_interaction``); with ``clip_rest``, term 2 becomes the sum of
    terms 2, 3, ... (in order) clipped to ``+-clip_rest`` and the later ones 0."""
    terms[first + 1] *= terms[first]
    terms[first] = 0.0
    if mc.clip_interaction is not None:
        terms[first + 1] = np.clip(terms[first + 1], -mc.clip_interaction, mc.clip_interaction)
    if mc.clip_rest is None:
        return
    for rank in range(3, int(count.max())):  # one step per parent rank, every node at once
        has = np.flatnonzero(count > rank)
        terms[first[has] + 2] += terms[first[has] + rank]
        terms[first[has] + rank] = 0.0
    rest = first[count > 2] + 2
    terms[rest] = np.clip(terms[rest], -mc.clip_rest, mc.clip_rest)


def _add_parent_terms(x: np.ndarray, rows: np.ndarray, g: np.ndarray, j: int, p: Group, acc: np.ndarray, mc: MechanismConfig) -> None:
    """Add node ``j``'s parent terms to ``acc`` [rows, S] in causal parent order; clip (nonlinear)."""
    nonlinear = mc.kind == "nonlinear"
    parents = p.adj[g, :j, j]
    r_loc, i_par = np.nonzero(parents)  # sorted by row, then causal parent order
    if not r_loc.size:
        return
    ge = g[r_loc]
    f_e = p.fn[ge, i_par, j]
    order = np.argsort(f_e, kind="stable") if nonlinear else slice(None)
    ro, go, io = r_loc[order], ge[order], i_par[order]
    xp = x[rows[ro], :, p.perm[go, io]]  # [E, S], edges grouped by function
    _edge_terms(xp, f_e[order], p.w[go, io, j], mc)
    terms = xp[np.argsort(order)] if nonlinear else xp  # type: ignore[arg-type]  # order is an array when nonlinear  # back to (row, parent) order
    counts = parents.sum(axis=1)
    starts = np.cumsum(counts) - counts
    if nonlinear:
        ir = np.flatnonzero(p.inter[g, j])  # only nodes with >= 2 parents
        if ir.size:
            _interact(terms, starts[ir], counts[ir], mc)
    for rank in range(int(counts.max())):  # add terms in causal parent order
        rr = np.flatnonzero(counts > rank)
        acc[rr] = acc.take(rr, axis=0) + terms.take(starts[rr] + rank, axis=0)
    if nonlinear:
        _clip_rows(acc, counts > 0, mc.clip_value)


def simulate(
    x: np.ndarray,
    rows_all: np.ndarray,
    row_graph: np.ndarray,
    p: Group,
    eps: np.ndarray,
    eps_rows: np.ndarray,
    active: np.ndarray | None,
    mc: MechanismConfig,
) -> None:
    """Compute node values in causal order, in place in ``x`` [rows, S, node index].

    ``rows_all``: the rows of ``x`` to simulate; aligned with it, ``row_graph``
    (graph of the row), ``eps_rows`` (row of ``eps`` [*, n, S] holding its
    noise, causal order) and ``active`` [len(rows_all), n] (which causal nodes
    to compute; None: all). Node at causal position j of graph g lives in
    column ``perm[g, j]``; inactive nodes keep the value already in ``x``.
    """
    n = p.perm.shape[1]
    active_t = None if active is None else np.ascontiguousarray(active.T)
    for j in range(n):
        sel = slice(None) if active_t is None else np.flatnonzero(active_t[j])
        rows, g = rows_all[sel], row_graph[sel]
        if rows.size == 0:
            continue
        acc = eps[eps_rows[sel], j]  # [rows, S], a fresh copy
        if j > 0:
            _add_parent_terms(x, rows, g, j, p, acc, mc)
        x[rows, :, p.perm[g, j]] = acc
