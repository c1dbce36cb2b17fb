"""Simulate structural causal models, a block of graphs at a time.

:func:`generate_graphs` draws ``count`` causal-graph records from a numpy
``Generator``. Work is vectorised over graphs: graphs of one sub-block are
grouped by their node count ``n`` (so K, the number of interventions, is fixed
inside a group), and each group is simulated as whole arrays, looping only over
nodes in causal order and over the (at most 16) edge-function ids. All worlds
of a group live in one array ``[graph, world, sample, node index]`` that becomes
the records' ``base``/``int`` fields without a copy; the node at causal position
``j`` of graph ``g`` is written straight to its (randomly permuted) index column
``perm[g, j]``, so index order never is the causal order.

Simulation of one node ``j`` (causal order) for a set of rows (one row = one
world of one graph, holding S samples)::

    term_i  = w_ij * f_ij(clip(x_i, +-clip_parent)), clipped to +-clip_term  (nonlinear)
    term_i  = w_ij * x_i                                                      (linear)
    x_j     = ((noise_j + term_p0) + term_p1) + ...     parents p0 < p1 < ... in causal order
    x_j     = clip(x_j, +-clip_value)                                          (nonlinear)

An interaction node replaces ``term_p0 + term_p1`` by ``term_p0 * term_p1``.
The linear mechanism never clips, so its analytic formulas hold exactly.
Values are computed and stored in float32.

Interventions: the base world is simulated first (adaptive values need the
base standard deviation of the target), then all K intervened worlds of all
graphs of the group as rows of one array. In a twin world (``samples.twin``)
the rows start as copies of the base rows, the target is set to ``c``, and
only strict descendants of the target are recomputed, with the base rows'
noise. Every other node keeps its base value by construction, so ``delta`` is
bitwise 0 on non-descendants whatever numpy's SIMD code paths do. Without
twin, every non-target node is recomputed with fresh noise.

Determinism: everything is drawn from the ``Generator`` passed in, in an order
that depends only on the config and ``count`` (sub-blocks of a size fixed by
the config, groups in ascending ``n``, a fixed draw order inside a group).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import CausalConfig, MechanismConfig, NoiseConfig
from .graphs import descendants, random_permutations, sample_dags
from .mechanisms import EDGE_FUNCTION_WEIGHTS, EDGE_FUNCTIONS, apply_edge_function_, sample_noise

__all__ = ["CAUSAL_FIELDS", "CAUSAL_SHAPES", "generate_graphs"]

CAUSAL_FIELDS: dict[str, str] = {
    "adj": "uint8",
    "weights": "float32",
    "edge_fn": "int8",
    "interaction": "uint8",
    "noise_scale": "float32",
    "base": "float32",
    "int": "float32",
    "delta": "float32",
    "targets": "int16",
    "values": "float32",
}
"""Array fields of a causal record and their numpy dtypes (the record also has a ``json`` dict)."""

CAUSAL_SHAPES: dict[str, tuple[str, ...]] = {
    "adj": ("n", "n"),
    "weights": ("n", "n"),
    "edge_fn": ("n", "n"),
    "interaction": ("n",),
    "noise_scale": ("n",),
    "base": ("S", "n"),
    "int": ("K", "S", "n"),
    "delta": ("K", "S", "n"),
    "targets": ("K",),
    "values": ("K",),
}
"""Symbolic shape of each array field: ``n`` and ``K`` vary per record, ``S`` is fixed by the config."""

_DT = np.float32  # compute and storage dtype of values
_BLOCK_FLOATS = 1 << 26  # world values per sub-block, x3 for temporaries (~80 MB of records)
_MAX_BLOCK = 8192
_FUNCTION_IDS = {name: i for i, name in enumerate(EDGE_FUNCTIONS)}


def _block_size(cfg: CausalConfig) -> int:
    """Graphs per sub-block: a pure function of the config, so rng use depends only on (cfg, count)."""
    n = cfg.max_nodes()
    per_graph = 3 * (1 + cfg.max_interventions()) * cfg.samples.base * n + 8 * n * n
    return int(min(_MAX_BLOCK, max(1, _BLOCK_FLOATS // per_graph)))


def generate_graphs(cfg: CausalConfig, rng: np.random.Generator, count: int) -> list[dict]:
    """Draw ``count`` causal-graph records, in order, from ``rng``.

    Each record is a dict of C-contiguous arrays with the dtypes of
    :data:`CAUSAL_FIELDS` (shapes in :data:`CAUSAL_SHAPES`) plus ``"json"``,
    a small JSON-able dict: ``n``, ``family``, ``mechanism``, ``noise`` (the
    kind used), ``twin``, ``standardized``, ``causal_order`` (node indices in
    causal order) and, when standardized, ``mean``/``std`` per node index.
    The same config and generator state give byte-identical records.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    block = _block_size(cfg)
    records: list[dict] = []
    for start in range(0, count, block):
        records.extend(_generate_block(cfg, rng, min(block, count - start)))
    return records


def _generate_block(cfg: CausalConfig, rng: np.random.Generator, count: int) -> list[dict]:
    ns = rng.integers(cfg.graph.n_min, cfg.graph.n_max + 1, size=count)
    records: list = [None] * count
    for n in np.unique(ns).tolist():
        where = np.flatnonzero(ns == n).tolist()
        for pos, rec in zip(where, _generate_group(cfg, rng, len(where), n)):
            records[pos] = rec
    return records


def _edge_functions(mc: MechanismConfig, rng: np.random.Generator, adj: np.ndarray) -> np.ndarray:
    """int8 function id per edge (``-1`` where no edge), drawn from the allowed names by weight."""
    if mc.kind == "linear":
        return np.where(adj, 0, -1).astype(np.int8)
    ids = np.array([_FUNCTION_IDS[f] for f in mc.functions], dtype=np.int8)
    p = np.array([EDGE_FUNCTION_WEIGHTS[f] for f in mc.functions])
    drawn = ids[rng.choice(len(ids), size=adj.shape, p=p / p.sum())]
    return np.where(adj, drawn, np.int8(-1)).astype(np.int8)


def _draw_noise(
    rng: np.random.Generator, nc: NoiseConfig, kinds: tuple[str, ...], kind_ids: np.ndarray, rest: tuple[int, ...]
) -> np.ndarray:
    """Standardised noise ``[len(kind_ids), *rest]``; row r has kind ``kinds[kind_ids[r]]``."""
    if len(kinds) == 1:
        return sample_noise(rng, kinds[0], (len(kind_ids),) + rest, nc.cauchy_clip, _DT)
    out = np.empty((len(kind_ids),) + rest, dtype=_DT)
    for k, name in enumerate(kinds):
        sel = np.flatnonzero(kind_ids == k)
        if sel.size:
            out[sel] = sample_noise(rng, name, (sel.size,) + rest, nc.cauchy_clip, _DT)
    return out


class _Group(NamedTuple):
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
        xp *= w_e[:, None]
        return
    np.clip(xp, -mc.clip_parent, mc.clip_parent, out=xp)
    bounds = (np.flatnonzero(np.diff(f_e)) + 1).tolist()
    for a, b in zip([0] + bounds, bounds + [f_e.size]):
        apply_edge_function_(int(f_e[a]), xp[a:b])
    xp *= w_e[:, None]
    np.clip(xp, -mc.clip_term, mc.clip_term, out=xp)


def _simulate(
    x: np.ndarray,
    rows_all: np.ndarray,
    row_graph: np.ndarray,
    p: _Group,
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
    adj, perm, w, fn, inter = p.adj, p.perm, p.w, p.fn, p.inter
    n = perm.shape[1]
    active_t = None if active is None else np.ascontiguousarray(active.T)
    nonlinear = mc.kind == "nonlinear"
    for j in range(n):
        sel = slice(None) if active_t is None else np.flatnonzero(active_t[j])
        rows, g = rows_all[sel], row_graph[sel]
        if rows.size == 0:
            continue
        acc = eps[eps_rows[sel], j]  # [rows, S], a fresh copy
        if j > 0:
            parents = adj[g, :j, j]
            r_loc, i_par = np.nonzero(parents)  # sorted by row, then causal parent order
            if r_loc.size:
                ge = g[r_loc]
                f_e = fn[ge, i_par, j]
                order = np.argsort(f_e, kind="stable") if nonlinear else slice(None)
                ro, go, io = r_loc[order], ge[order], i_par[order]
                xp = x[rows[ro], :, perm[go, io]]  # [E, S], edges grouped by function
                _edge_terms(xp, f_e[order], w[go, io, j], mc)
                terms = xp[np.argsort(order)] if nonlinear else xp  # back to (row, parent) order
                counts = parents.sum(axis=1)
                starts = np.cumsum(counts) - counts
                if nonlinear:
                    ir = np.flatnonzero(inter[g, j])  # only nodes with >= 2 parents
                    if ir.size:
                        first = starts[ir]
                        terms[first + 1] *= terms[first]
                        terms[first] = 0.0
                for rank in range(int(counts.max())):  # add terms in causal parent order
                    rr = np.flatnonzero(counts > rank)
                    acc[rr] = acc.take(rr, axis=0) + terms.take(starts[rr] + rank, axis=0)
        if nonlinear:
            np.clip(acc, -mc.clip_value, mc.clip_value, out=acc)
        x[rows, :, perm[g, j]] = acc


def _generate_group(cfg: CausalConfig, rng: np.random.Generator, g: int, n: int) -> list[dict]:
    """All records of ``g`` graphs with ``n`` nodes, drawn in a fixed order from ``rng``."""
    mc, nc, ic, sc = cfg.mechanism, cfg.noise, cfg.interventions, cfg.samples
    s = sc.base
    # --- structure and mechanism parameters (causal order)
    adj = sample_dags(cfg.graph, rng, g, n)
    perm = random_permutations(rng, g, n)
    mag = rng.uniform(mc.w_lo, mc.w_hi, size=(g, n, n))
    neg = rng.random((g, n, n)) < 0.5
    w = np.where(adj, np.where(neg, -mag, mag), 0.0).astype(_DT)
    fn = _edge_functions(mc, rng, adj)
    if mc.kind == "nonlinear":
        inter = (rng.random((g, n)) < mc.interaction_prob) & (adj.sum(axis=1) >= 2)
    else:
        inter = np.zeros((g, n), dtype=bool)
    kinds = nc.kinds if nc.kind == "mixed" else (nc.kind,)
    kind_ids = rng.integers(0, len(kinds), size=g) if len(kinds) > 1 else np.zeros(g, dtype=np.int64)
    if nc.per_node:
        scale = rng.uniform(nc.scale_lo, nc.scale_hi, size=(g, n)).astype(_DT)
    else:
        scale = np.full((g, n), nc.scale, dtype=_DT)
    n_targets, per = ic.num_targets(n), ic.per_target_count()
    k = n_targets * per
    p = _Group(adj, perm, w, fn, inter, scale, kind_ids)
    tpos = np.argsort(rng.random((g, n)), axis=1)[:, :n_targets]
    wpos = np.repeat(tpos, per, axis=1)  # [g, k] causal position of each world's target
    gidx = np.arange(g)
    targets = perm[gidx[:, None], wpos]  # [g, k] node index of each world's target
    # --- all worlds of all graphs live in one array: [graph, world (0 = base), sample, node index]
    worlds = np.empty((g, 1 + k, s, n), dtype=_DT)
    flat = worlds.reshape(g * (1 + k), s, n)
    eps = _draw_noise(rng, nc, kinds, kind_ids, (n, s))
    eps *= scale[:, :, None]
    _simulate(flat, gidx * (1 + k), gidx, p, eps, gidx, None, mc)
    # --- intervention values
    if ic.mode == "adaptive":
        sigma = worlds[:, 0].std(axis=1, dtype=np.float64)[gidx[:, None], targets]
        c = np.tile(np.asarray(ic.coeffs), n_targets) * sigma * ic.value_scale
    elif ic.mode == "fixed":
        c = np.broadcast_to(np.tile(np.asarray(ic.values), n_targets), (g, k))
    else:
        c = rng.uniform(ic.value_lo, ic.value_hi, size=(g, k))
    c = np.ascontiguousarray(c, dtype=_DT)
    # --- intervened worlds: start from the base world, set the target, recompute
    worlds[:, 1:] = worlds[:, :1]
    worlds[gidx[:, None], 1 + np.arange(k)[None, :], :, targets] = c[:, :, None]
    rows = (gidx[:, None] * (1 + k) + 1 + np.arange(k)).reshape(-1)
    row_graph = np.repeat(gidx, k)
    row_target = wpos.reshape(-1)
    if sc.twin:
        active = descendants(adj)[row_graph, row_target]
        _simulate(flat, rows, row_graph, p, eps, row_graph, active, mc)
    else:
        active = np.ones((g * k, n), dtype=bool)
        active[np.arange(g * k), row_target] = False
        eps_i = _draw_noise(rng, nc, kinds, kind_ids[row_graph], (n, s))
        eps_i *= scale[row_graph][:, :, None]
        _simulate(flat, rows, row_graph, p, eps_i, np.arange(g * k), active, mc)
    return _assemble(cfg, p, kinds, targets, c, worlds)


def _assemble(
    cfg: CausalConfig, p: _Group, kinds: tuple[str, ...], targets: np.ndarray, c: np.ndarray, worlds: np.ndarray
) -> list[dict]:
    """Permute parameters to node-index order, standardise if asked, compute delta, slice records."""
    adj, perm, w, fn, inter, scale, kind_ids = p
    g, n = perm.shape
    inv = np.argsort(perm, axis=1)  # inv[g, index] = causal position
    gi = np.arange(g)[:, None]
    g3, ii, jj = gi[:, :, None], inv[:, :, None], inv[:, None, :]
    adj_p = adj[g3, ii, jj].astype(np.uint8)
    w_p = w[g3, ii, jj]
    fn_p = fn[g3, ii, jj]
    inter_p = inter[gi, inv].astype(np.uint8)
    scale_p = scale[gi, inv]
    mean = std = None
    if cfg.samples.standardize:
        mean = worlds[:, 0].mean(axis=1, dtype=np.float64).astype(_DT)  # [g, n], index order
        std = worlds[:, 0].std(axis=1, dtype=np.float64).astype(_DT)
        std[~(std > 0)] = 1.0
        worlds -= mean[:, None, None, :]
        worlds /= std[:, None, None, :]
        # Same float32 ops, in the same order, as the target column of the intervened rows.
        c = np.subtract(c, mean[gi, targets]) / std[gi, targets]
    delta = worlds[:, 1:] - worlds[:, :1]
    targets = targets.astype(np.int16)
    family, mech = cfg.graph.family, cfg.mechanism.kind
    twin, stdz = cfg.samples.twin, cfg.samples.standardize
    orders = perm.tolist()
    kind_names = [kinds[i] for i in kind_ids.tolist()]
    means = mean.tolist() if stdz else None
    stds = std.tolist() if stdz else None
    out = []
    for i in range(g):
        meta = {
            "n": n,
            "family": family,
            "mechanism": mech,
            "noise": kind_names[i],
            "twin": twin,
            "standardized": stdz,
            "causal_order": orders[i],
        }
        if stdz:
            meta["mean"], meta["std"] = means[i], stds[i]
        out.append(
            {
                "adj": adj_p[i],
                "weights": w_p[i],
                "edge_fn": fn_p[i],
                "interaction": inter_p[i],
                "noise_scale": scale_p[i],
                "base": worlds[i, 0],
                "int": worlds[i, 1:],
                "delta": delta[i],
                "targets": targets[i],
                "values": c[i],
                "json": meta,
            }
        )
    return out
