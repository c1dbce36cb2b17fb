"""Simulate structural causal models, a block of graphs at a time.

:func:`generate_graphs` draws ``count`` causal-graph records from a numpy
``Generator``. Work is vectorised over graphs: graphs of one sub-block are
grouped by their node count ``n`` (so K, the number of interventions, is fixed
inside a group), and each group is simulated as whole arrays, looping only over
nodes in causal order and over the edge-function ids in use. All worlds
of a group live in one array ``[graph, world, sample, node index]`` that becomes
the records' ``base``/``int`` fields without a copy; the node at causal position
``j`` of graph ``g`` is written straight to its (randomly permuted) index column
``perm[g, j]``, so index order never is the causal order.

The structural equations are in :mod:`cachebuild.causal.simulate`; z-scoring,
``delta`` and the finiteness check in :mod:`cachebuild.causal.assemble`.

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
the config, groups in ascending ``n``, a fixed draw order inside a group). The
bytes are a function of (config, generator state, ``count``, numpy version, CPU
kind): numpy's float32 ``sin``/``exp``/``log``/``log1p``/... use SIMD kernels
chosen at run time (AVX2, AVX-512, ...) that may differ in the last bits.
"""

from __future__ import annotations

import functools

import numpy as np

from .assemble import assemble_records
from .config import CausalConfig, InterventionConfig, MechanismConfig, NoiseConfig
from .functions import EDGE_FUNCTION_IDS
from .graphs import descendants, random_permutations, sample_dags
from .noise import sample_noise
from .simulate import Group, simulate

__all__ = ["CAUSAL_FIELDS", "CAUSAL_SHAPES", "generate_graphs", "sub_block_size"]

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


def sub_block_size(cfg: CausalConfig) -> int:
    """Graphs per sub-block: a pure function of the config, so rng use depends only on (cfg, count)."""
    n = cfg.max_nodes()
    per_graph = 3 * (1 + cfg.max_interventions()) * cfg.samples.base * n + 8 * n * n
    return int(min(_MAX_BLOCK, max(1, _BLOCK_FLOATS // per_graph)))


def generate_graphs(cfg: CausalConfig, rng: np.random.Generator, count: int) -> list[dict]:
    """Draw ``count`` causal-graph records, in order, from ``rng``.

    Each record is a dict of C-contiguous arrays with the dtypes of
    :data:`CAUSAL_FIELDS` (shapes in :data:`CAUSAL_SHAPES`) plus ``"json"``,
    a small JSON-able dict: ``n``, ``family``, ``mechanism``, ``noise`` (the
    kind used), ``twin``, ``standardized`` (``none``/``base``/``pooled``),
    ``causal_order`` (node indices in causal order), in adaptive mode
    ``value_scale`` (the graph's intervention scale) and, when standardized,
    ``mean``/``std`` per node index. The same config and generator state give
    byte-identical records (on the same numpy version and CPU kind).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    block = sub_block_size(cfg)
    records: list[dict] = []
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing recipe is refused with one line (_check_finite)
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
    ids = np.array([EDGE_FUNCTION_IDS[f] for f in mc.functions], dtype=np.int8)
    p = np.asarray(mc.function_weights, dtype=np.float64)
    drawn = ids[rng.choice(len(ids), size=adj.shape, p=p / p.sum())]
    return np.where(adj, drawn, np.int8(-1)).astype(np.int8)


def _draw_noise(
    rng: np.random.Generator,
    nc: NoiseConfig,
    kinds: tuple[str, ...],
    kind_ids: np.ndarray,
    scale: np.ndarray | None,
    rest: tuple[int, ...],
) -> np.ndarray:
    """Scaled noise ``[len(kind_ids), *rest]``; row r has kind ``kinds[kind_ids[r]]`` and scales ``scale[r]``."""
    draw = functools.partial(sample_noise, cauchy_clip=nc.cauchy_clip, dtype=_DT, convention=nc.convention)
    if len(kinds) == 1:
        out = draw(rng, kinds[0], (len(kind_ids),) + rest, scale=None if scale is None else scale[:, :, None])
    else:
        out = np.empty((len(kind_ids),) + rest, dtype=_DT)
        for k, name in enumerate(kinds):
            sel = np.flatnonzero(kind_ids == k)
            if sel.size:
                out[sel] = draw(rng, name, (sel.size,) + rest, scale=None if scale is None else scale[sel][:, :, None])
    if nc.clip is not None:  # the users' 2026-01-06 (dd4cd49) to -14 generate_data: np.clip(noise, -50, 50)
        np.clip(out, -nc.clip, nc.clip, out=out)
    return out


def _weights(mc: MechanismConfig, rng: np.random.Generator, adj: np.ndarray) -> np.ndarray:
    """float32 edge weights [g, n, n]: 1 on every edge (``one``) or +-U(w_lo, w_hi); 0 off edges."""
    if mc.weights == "one":
        return adj.astype(_DT)
    mag = rng.uniform(mc.w_lo, mc.w_hi, size=adj.shape)
    neg = rng.random(adj.shape) < 0.5
    return np.where(adj, np.where(neg, -mag, mag), 0.0).astype(_DT)


def _values(ic: InterventionConfig, rng: np.random.Generator, base: np.ndarray, targets: np.ndarray, n_targets: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Intervention values c [g, K] (float32) and the per-graph scales (adaptive mode, else None)."""
    g, s, _ = base.shape
    k = targets.shape[1]
    scales: np.ndarray | None = None
    if ic.mode == "adaptive":
        gidx = np.arange(g)[:, None]
        if s > ic.sigma_ddof:
            sigma = base.std(axis=1, dtype=np.float64, ddof=ic.sigma_ddof)[gidx, targets]
        else:
            sigma = np.zeros((g, k))
        sigma[~(sigma >= ic.sigma_min)] = 1.0
        lo, hi = ic.value_scale
        scales = np.asarray(rng.uniform(lo, hi, size=g)) if lo < hi else np.full(g, lo)
        c = np.tile(np.asarray(ic.coeffs), n_targets) * sigma * scales[:, None]
    elif ic.mode == "fixed":
        c = np.broadcast_to(np.tile(np.asarray(ic.values), n_targets), (g, k))
    else:
        c = rng.uniform(ic.value_lo, ic.value_hi, size=(g, k))
    if ic.value_clip is not None:  # the value the target is set to (theirs: np.clip(intervention[node], -30, 30))
        c = np.clip(c, -ic.value_clip, ic.value_clip)
    return np.ascontiguousarray(c, dtype=_DT), scales


def _parameters(cfg: CausalConfig, rng: np.random.Generator, g: int, n: int) -> tuple[Group, tuple[str, ...]]:
    """Structure and mechanism of ``g`` graphs (causal order), drawn once per graph for all worlds."""
    mc, nc = cfg.mechanism, cfg.noise
    adj = sample_dags(cfg.graph, rng, g, n)
    perm = random_permutations(rng, g, n)
    w = _weights(mc, rng, adj)
    fn = _edge_functions(mc, rng, adj)
    if mc.kind == "nonlinear":
        # Once per graph, shared by every world (the users re-draw it per world, breaking twins).
        inter = (rng.random((g, n)) < mc.interaction_prob) & (adj.sum(axis=1) >= 2)
    else:
        inter = np.zeros((g, n), dtype=bool)
    kinds = nc.kinds if nc.kind == "mixed" else (nc.kind,)
    kind_ids = rng.integers(0, len(kinds), size=g) if len(kinds) > 1 else np.zeros(g, dtype=np.int64)
    if nc.per_node:
        scale = rng.uniform(nc.scale_lo, nc.scale_hi, size=(g, n)).astype(_DT)
    else:
        scale = np.full((g, n), nc.scale, dtype=_DT)
    return Group(adj, perm, w, fn, inter, scale, kind_ids), kinds


def _noise_scale(cfg: CausalConfig, p: Group) -> np.ndarray | None:
    """Per-node scales to multiply noise by, or None when every scale is 1 (nothing to do)."""
    return None if not cfg.noise.per_node and cfg.noise.scale == 1.0 else p.scale


def _generate_group(cfg: CausalConfig, rng: np.random.Generator, g: int, n: int) -> list[dict]:
    """All records of ``g`` graphs with ``n`` nodes, drawn in a fixed order from ``rng``."""
    mc, nc, ic, sc = cfg.mechanism, cfg.noise, cfg.interventions, cfg.samples
    s = sc.base
    p, kinds = _parameters(cfg, rng, g, n)
    n_targets, per = ic.num_targets(n), ic.per_target_count()
    k = n_targets * per
    tpos = np.argsort(rng.random((g, n)), axis=1)[:, :n_targets]
    wpos = np.repeat(tpos, per, axis=1)  # [g, k] causal position of each world's target
    gidx = np.arange(g)
    targets = p.perm[gidx[:, None], wpos]  # [g, k] node index of each world's target
    # --- all worlds of all graphs live in one array: [graph, world (0 = base), sample, node index]
    worlds = np.empty((g, 1 + k, s, n), dtype=_DT)
    flat = worlds.reshape(g * (1 + k), s, n)
    scale = _noise_scale(cfg, p)
    eps = _draw_noise(rng, nc, kinds, p.kind_ids, scale, (n, s))
    simulate(flat, gidx * (1 + k), gidx, p, eps, gidx, None, mc)
    c, scales = _values(ic, rng, worlds[:, 0], targets, n_targets)
    # --- intervened worlds: start from the base world, set the target, recompute
    worlds[:, 1:] = worlds[:, :1]
    worlds[gidx[:, None], 1 + np.arange(k)[None, :], :, targets] = c[:, :, None]
    rows = (gidx[:, None] * (1 + k) + 1 + np.arange(k)).reshape(-1)
    row_graph = np.repeat(gidx, k)
    row_target = wpos.reshape(-1)
    if sc.twin:
        active = descendants(p.adj)[row_graph, row_target]
        simulate(flat, rows, row_graph, p, eps, row_graph, active, mc)
    else:
        active = np.ones((g * k, n), dtype=bool)
        active[np.arange(g * k), row_target] = False
        eps_i = _draw_noise(rng, nc, kinds, p.kind_ids[row_graph], None if scale is None else scale[row_graph], (n, s))
        simulate(flat, rows, row_graph, p, eps_i, np.arange(g * k), active, mc)
    return assemble_records(cfg, p, kinds, targets, c, worlds, scales)
