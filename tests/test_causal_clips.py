"""The clips of the users' 2026-01-06 (dd4cd49) to 2026-01-14 generator, as generator options.

``noise.clip``, ``interventions.value_clip``, ``mechanism.clip_interaction`` and
``mechanism.clip_rest`` (``configs/causal-users-2026-01-06-clipped.toml``). Here with
small bounds, so that every clip acts on many values: each option against a direct
per-graph formula, and the same seed with and without the option.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from cachebuild.causal import generate_graphs, parse_causal_config
from cachebuild.causal.functions import apply_edge_function

_SMALL = {"clip_term": 3.0, "clip_value": 6.0, "clip_interaction": 2.0, "clip_rest": 1.5}


def _cfg(mechanism: dict | None = None, noise: dict | None = None, interventions: dict | None = None):
    data = {
        "mechanism": {"functions": ["linear_2x", "poly_clip10", "sin", "rational"], "interaction_prob": 0.8} | (mechanism or {}),
        "noise": {"kind": "normal", "scale": 2.0} | (noise or {}),
        "interventions": {"value_scale": [1.0, 5.0]} | (interventions or {}),
        "graph": {"edge_prob": 0.6},
        "samples": {"base": 16, "standardize": "none"},
    }
    return parse_causal_config(data)


def _parent_part(rec: dict, x: np.ndarray, j: int, mc) -> np.ndarray:
    """Node j's parent part in float64: clip(t0 * t1, +-ci) + clip(t2 + t3 + ..., +-cr) for an interaction node."""
    order = rec["json"]["causal_order"]
    parents = sorted(np.flatnonzero(rec["adj"][:, j]).tolist(), key=order.index)
    terms = [np.clip(apply_edge_function(int(rec["edge_fn"][i, j]), x[:, i].astype(np.float32)), -mc.clip_term, mc.clip_term).astype(np.float64) for i in parents]
    if not rec["interaction"][j]:
        return np.sum(terms, axis=0)
    inter = terms[0] * terms[1]
    rest = np.sum(terms[2:], axis=0) if len(terms) > 2 else np.zeros_like(inter)
    if mc.clip_interaction is not None:
        inter = np.clip(inter, -mc.clip_interaction, mc.clip_interaction)
    if mc.clip_rest is not None:
        rest = np.clip(rest, -mc.clip_rest, mc.clip_rest)
    return inter + rest


def _mismatches(recs: list[dict], mc) -> tuple[int, int]:
    """(descendant columns checked, columns whose twin delta is not g(int parents) - g(base parents))."""
    checked = bad = 0
    for rec in recs:
        g = nx.DiGraph(list(zip(*(a.tolist() for a in np.nonzero(rec["adj"])))))
        base = rec["base"].astype(np.float64)
        for w, k in enumerate(rec["targets"].tolist()):
            xi = rec["int"][w].astype(np.float64)
            for j in nx.descendants(g, k) if k in g else ():
                ok = (np.abs(base[:, j]) < mc.clip_value) & (np.abs(xi[:, j]) < mc.clip_value)
                want = _parent_part(rec, xi, j, mc) - _parent_part(rec, base, j, mc)
                got = xi[:, j] - base[:, j]
                checked += 1
                bad += not np.all(np.abs(got - want)[ok] <= 1e-4 * (1 + np.abs(base[:, j]) + np.abs(xi[:, j]))[ok])
    return checked, bad


def test_interaction_and_rest_clips_follow_their_formula() -> None:
    cfg = _cfg(_SMALL)
    recs = generate_graphs(cfg, np.random.default_rng(4), 200)
    checked, bad = _mismatches(recs, cfg.mechanism)
    assert checked > 500 and bad == 0
    assert sum(int(((r["adj"].sum(axis=0) >= 3) & (r["interaction"] == 1)).sum()) for r in recs) > 50  # rest sums exist
    # the formula has power: the same records against no product clip, or no rest clip, fail
    for off in ("clip_interaction", "clip_rest"):
        _, wrong = _mismatches(recs, parse_causal_config({"mechanism": _SMALL | {off: "none"}}).mechanism)
        assert wrong > 20, off


def test_without_the_new_clips_the_records_are_the_old_ones() -> None:
    """Bounds nothing reaches change nothing: the options only clip (no extra draws, same order of sums)."""
    plain = generate_graphs(_cfg({"clip_term": 3.0}), np.random.default_rng(8), 120)
    wide = {"clip_term": 3.0, "clip_interaction": 1e6, "clip_rest": 1e6}
    clipped = generate_graphs(_cfg(wide, {"clip": 1e6}, {"value_clip": 1e6}), np.random.default_rng(8), 120)
    for a, b in zip(plain, clipped):
        for field in ("base", "int", "values", "delta"):
            np.testing.assert_allclose(a[field], b[field], rtol=1e-6, atol=1e-5)


def test_value_clip_is_the_value_set_and_recorded() -> None:
    free = generate_graphs(_cfg(), np.random.default_rng(5), 150)
    held = generate_graphs(_cfg(interventions={"value_clip": 1.5}), np.random.default_rng(5), 150)
    v_free, v_held = (np.concatenate([r["values"] for r in recs]) for recs in (free, held))
    assert np.array_equal(v_held, np.clip(v_free, np.float32(-1.5), np.float32(1.5)))
    assert np.mean(np.abs(v_held) == 1.5) > 0.3  # the clip acts
    for r in held:  # the target column holds the clipped value; delta on the target is value - base
        for w, t in enumerate(r["targets"].tolist()):
            assert np.all(r["int"][w][:, t] == r["values"][w]) and np.array_equal(r["delta"][w][:, t], r["values"][w] - r["base"][:, t])


@pytest.mark.parametrize("kind", ["normal", "cauchy"])
def test_noise_clip_bounds_every_draw(kind: str) -> None:
    """Roots are their noise: with the clip they are the unclipped roots clipped, in every world."""
    free = generate_graphs(_cfg(noise={"kind": kind}), np.random.default_rng(6), 150)
    held = generate_graphs(_cfg(noise={"kind": kind, "clip": 2.5}), np.random.default_rng(6), 150)
    at_bound = []
    for a, b in zip(free, held):
        roots = np.flatnonzero(a["adj"].sum(axis=0) == 0)
        assert np.array_equal(b["base"][:, roots], np.clip(a["base"][:, roots], np.float32(-2.5), np.float32(2.5)))
        at_bound.append(np.abs(b["base"][:, roots]) == 2.5)
    assert np.mean(np.concatenate([m.ravel() for m in at_bound])) > 0.1
