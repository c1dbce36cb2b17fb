"""From a simulated group of graphs to records: index order, z-scoring, delta, finiteness.

``samples.standardize`` picks the statistics every world (and ``values``) is
z-scored with, per graph and node:

* ``none``: raw values.
* ``base``: mean and population std (ddof 0) of the base world's S rows (ours).
* ``pooled``: mean and sample std (ddof 1, pandas' ``.std()``) of the base and
  all K intervened worlds' ``(1 + K) * S`` rows together; a std of exactly 0 is
  replaced by 1 (the users' 2026-01-15 generator).

Statistics are computed in float64 and applied as float32 ``(x - mean) / std``;
``values`` go through the same float32 operations as the target column of the
intervened rows, so the twin identities stay exact after z-scoring: ``delta``
is bitwise 0 on non-descendants and ``values - base_k`` on the target.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .config import CausalConfig
from .simulate import Group

__all__ = ["assemble_records"]

_DT = np.float32


def _statistics(mode: str, worlds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 (mean, std) [g, n] for ``base`` or ``pooled`` z-scoring; std never 0."""
    g, w, s, n = worlds.shape
    if mode == "base":
        rows = worlds[:, 0]
        mean = rows.mean(axis=1, dtype=np.float64)
        std = rows.std(axis=1, dtype=np.float64)
    else:
        # One pass of float64 sums instead of np.std's float64 copy of every world (2x faster).
        # Values are clipped to <= 1e6, so sum(x^2) - sum(x) * mean loses nothing that a
        # float32 std keeps; a constant column gives exactly 0 (its sums are exact).
        m = w * s
        rows = worlds.reshape(g, m, n)
        total = np.add.reduce(rows, axis=1, dtype=np.float64)
        mean = total / m
        squares = np.einsum("gmn,gmn->gn", rows, rows, dtype=np.float64)
        std = np.sqrt(np.maximum(squares - total * mean, 0.0) / max(m - 1, 1))
    std[std == 0] = 1.0
    mean32, std32 = mean.astype(_DT), std.astype(_DT)
    std32[~(std32 > 0)] = 1.0  # a float64 std below float32's range
    return mean32, std32


def _check_finite(cfg: CausalConfig, delta: np.ndarray) -> None:
    """Refuse a block whose values overflowed float32 (``delta`` holds every world's values)."""
    if not np.isfinite(delta).all():
        mc = cfg.mechanism
        clip = f"mechanism.clip_value={mc.clip_value}, " if mc.kind != "linear" else ""
        raise ConfigError(
            f"the causal recipe produced non-finite values (mechanism.kind={mc.kind!r}, "
            f"{clip}graph.n_max={cfg.graph.n_max}, mechanism.w_hi={mc.w_hi}): "
            "values overflowed float32; lower mechanism.w_hi, graph.n_max or interventions.value_scale, "
            "or use the nonlinear mechanism with clips"
        )


def _metadata(cfg: CausalConfig, p: Group, kinds: tuple[str, ...], scales: np.ndarray | None) -> list[dict]:
    g = p.perm.shape[0]
    orders = p.perm.tolist()
    kind_names = [kinds[i] for i in p.kind_ids.tolist()]
    scale_list = scales.tolist() if scales is not None else None
    out = []
    for i in range(g):
        meta = {
            "n": int(p.perm.shape[1]),
            "family": cfg.graph.family,
            "mechanism": cfg.mechanism.kind,
            "noise": kind_names[i],
            "twin": cfg.samples.twin,
            "standardized": cfg.samples.standardize,
            "causal_order": orders[i],
        }
        if scale_list is not None:
            meta["value_scale"] = scale_list[i]
        out.append(meta)
    return out


def assemble_records(
    cfg: CausalConfig,
    p: Group,
    kinds: tuple[str, ...],
    targets: np.ndarray,
    c: np.ndarray,
    worlds: np.ndarray,
    scales: np.ndarray | None,
) -> list[dict]:
    """Permute parameters to node-index order, z-score if asked, compute delta, slice records.

    ``worlds`` [g, 1 + K, S, n] (index order, world 0 = base) is z-scored in
    place; ``scales`` [g] are the per-graph intervention scales (adaptive mode).
    """
    g, n = p.perm.shape
    inv = np.argsort(p.perm, axis=1)  # inv[g, index] = causal position
    gi = np.arange(g)[:, None]
    g3, ii, jj = gi[:, :, None], inv[:, :, None], inv[:, None, :]
    adj_p = p.adj[g3, ii, jj].astype(np.uint8)
    w_p = p.w[g3, ii, jj]
    fn_p = p.fn[g3, ii, jj]
    inter_p = p.inter[gi, inv].astype(np.uint8)
    scale_p = p.scale[gi, inv]
    meta = _metadata(cfg, p, kinds, scales)
    if cfg.samples.standardize != "none":
        mean, std = _statistics(cfg.samples.standardize, worlds)
        worlds -= mean[:, None, None, :]
        worlds /= std[:, None, None, :]
        # Same float32 ops, in the same order, as the target column of the intervened rows.
        c = np.subtract(c, mean[gi, targets]) / std[gi, targets]
        for m, mu, sd in zip(meta, mean.tolist(), std.tolist()):
            m["mean"], m["std"] = mu, sd
    delta = worlds[:, 1:] - worlds[:, :1]
    _check_finite(cfg, delta)
    targets = targets.astype(np.int16)
    return [
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
            "json": meta[i],
        }
        for i in range(g)
    ]
