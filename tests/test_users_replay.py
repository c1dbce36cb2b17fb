"""Our records replayed through the users' equations, graph by graph (stronger than distributions).

``test_users_recipes.py`` compares distributions of summary numbers; a mechanism
detail that moves few of them (which two parents an interaction node multiplies,
the order of clips, pandas' ddof, the coefficient order, the pooled statistics)
can hide there. Here each of our records is checked against the users'
``SCMGenerator.generate_data`` itself (``tests/users_scm_reference.py``, written
from ``MultiModelDeltaPredictor/src/data/SCMGenerator.py``):

1. The base world's exogenous noise is recovered from our raw record (a root is
   its noise; a node with parents is ``x - combine(terms)`` in float64 whenever its
   value is not at the total clip).
2. Every intervened world is recomputed with their code from that noise, our
   graph (``adj``, ``causal_order``), edge types, interaction nodes and value
   ``c``: their world recomputes *every* node, ours only the target's
   descendants, so this checks the mechanism on new inputs, not a copy.
3. ``c`` must be ``coeff * sigma * scale`` with their coefficients in their order,
   sigma the pandas (ddof 1) std of the target's base rows (< 1e-4 -> 1) and the
   graph's recorded scale; and the standardized record must be the raw one
   z-scored with the pooled (base + all intervened rows, ddof 1) statistics.

Values are float32 in our records and float64 in the replay, so they are compared
with a tolerance; a replayed value may also land on the other side of a ``step``
or ``sawtooth`` jump (one in ~10^5 values), so a few worlds may differ: the test
allows 0.5% of worlds and checks that a wrong mechanism breaks far more (each
mutation below turns >= 10% of worlds wrong; see ``test_replay_catches_*``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import users_scm_reference as ref
from test_users_recipes import TYPE_NAMES
from cachebuild.causal import EDGE_FUNCTIONS, generate_graphs, parse_causal_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
VERSIONS = ("2026-01-06", "2026-01-15")
COEFFS = {"2026-01-06": (-2.0, -1.0, 1.0, 2.0), "2026-01-15": (-2.0, 2.0)}
CLIP = {"2026-01-06": 100.0, "2026-01-15": 20.0}
# our registry name -> their edge type: test_users_recipes' table turned around (2026-01-06's log, exp
# and sqrt all fall back to x, our "linear": any of the three replays the same)
THEIR_TYPE = {version: {ours: theirs for theirs, ours in names.items()} for version, names in TYPE_NAMES.items()}
GRAPHS = 400
MAX_BAD_WORLDS = 0.005


def _cfg(version: str, **overrides):
    data = tomllib.loads((CONFIGS / f"causal-users-{version}.toml").read_text())
    for key, value in overrides.items():
        section, name = key.split(".")
        data[section][name] = value
    return parse_causal_config(data)


def _structure(version: str, rec: dict, parent_order: str = "causal"):
    """Their view of our graph: parents in causal (edge insertion) order, edge types, interactions.

    ``parent_order="index"`` sorts parents by node index instead (a bug the replay must catch:
    an interaction node would multiply other parents than theirs).
    """
    order = [int(v) for v in rec["json"]["causal_order"]]
    pos = {v: i for i, v in enumerate(order)} if parent_order == "causal" else {v: v for v in order}
    adj = rec["adj"]
    parents = {v: sorted(np.flatnonzero(adj[:, v]).tolist(), key=pos.__getitem__) for v in range(adj.shape[0])}
    types = {(p, v): THEIR_TYPE[version][EDGE_FUNCTIONS[int(rec["edge_fn"][p, v])]] for v in parents for p in parents[v]}
    inter = {v: bool(rec["interaction"][v]) for v in range(adj.shape[0])}
    return order, parents, types, inter


def _combine(version: str, data: np.ndarray, v: int, parents, types, inter) -> np.ndarray:
    """Their parent part of node ``v`` (terms, interaction), without noise and total clip."""
    terms = [ref.edge_term(version, types[(p, v)], data[:, p]) for p in parents[v]]
    if len(terms) > 1 and inter[v]:
        return terms[0] * terms[1] + (sum(terms[2:]) if len(terms) > 2 else 0)
    return sum(terms)


def _recover_noise(version: str, base: np.ndarray, parents, types, inter) -> np.ndarray | None:
    """The base world's noise, or None when a node sits at the total clip (its noise is lost)."""
    base = base.astype(np.float64)
    noise = base.copy()
    for v, ps in parents.items():
        if not ps:
            continue
        if np.any(np.abs(base[:, v]) >= CLIP[version]):
            return None
        noise[:, v] = base[:, v] - _combine(version, base, v, parents, types, inter)
    return noise


def _expected_values(version: str, rec: dict) -> np.ndarray:
    """Their c for each world: coeffs in order per target, sigma = pandas std (ddof 1) of base rows."""
    stds = pd.DataFrame(rec["base"].astype(np.float64)).std()
    targets = rec["targets"].tolist()
    coeffs = COEFFS[version]
    scale = rec["json"]["value_scale"]
    out = []
    for i in range(0, len(targets), len(coeffs)):
        t = targets[i]
        assert targets[i : i + len(coeffs)] == [t] * len(coeffs)  # one target, every coefficient, in turn
        sigma = float(stds[t])
        sigma = 1.0 if sigma < 1e-4 else sigma
        out += [c * sigma * scale for c in coeffs]
    return np.array(out)


def _replay(version: str, rec: dict, parent_order: str = "causal") -> tuple[int, int] | None:
    """(worlds replayed, worlds that differ) for one raw record; None when its noise is not recoverable."""
    order, parents, types, inter = _structure(version, rec, parent_order)
    noise = _recover_noise(version, rec["base"], parents, types, inter)
    if noise is None:
        return None
    bad = 0
    for k, (t, c) in enumerate(zip(rec["targets"].tolist(), rec["values"].astype(np.float64).tolist())):
        want = ref.world(version, None, order, parents, types, noise, inter, (t, c))
        got = rec["int"][k].astype(np.float64)
        bad += not np.allclose(got, want, rtol=1e-4, atol=1e-3)
    return len(rec["targets"]), bad


def _replay_all(version: str, recs: list[dict], parent_order: str = "causal") -> tuple[int, int, int]:
    """(graphs replayed, worlds replayed, worlds that differ)."""
    graphs = worlds = bad = 0
    for rec in recs:
        r = _replay(version, rec, parent_order)
        if r is not None:
            graphs, worlds, bad = graphs + 1, worlds + r[0], bad + r[1]
    return graphs, worlds, bad


@pytest.fixture(scope="module", params=VERSIONS)
def raw(request) -> tuple[str, list[dict]]:
    """Raw (unstandardized) records of a users' recipe, with their training's scale range (1, 50)."""
    version = request.param
    cfg = _cfg(version, **{"samples.standardize": "none", "interventions.value_scale": [1.0, 50.0]})
    return version, generate_graphs(cfg, np.random.default_rng(77), GRAPHS)


@pytest.mark.slow
def test_intervened_worlds_equal_their_generate_data(raw) -> None:
    version, recs = raw
    graphs, worlds, bad = _replay_all(version, recs)
    assert graphs >= GRAPHS * 0.5, f"only {graphs} of {GRAPHS} graphs had recoverable noise"
    assert worlds > 1000 and sum(int(r["interaction"].sum()) for r in recs) > 50  # interactions are exercised
    assert bad <= MAX_BAD_WORLDS * worlds, f"{version}: {bad} of {worlds} intervened worlds differ from their equations"


def test_values_are_their_coefficients_sigma_and_scale(raw) -> None:
    version, recs = raw
    scales = np.array([r["json"]["value_scale"] for r in recs])
    assert scales.min() >= 1.0 and scales.max() <= 50.0 and scales.std() > 10  # one U(1, 50) scale per graph
    for rec in recs:
        want = _expected_values(version, rec)
        np.testing.assert_allclose(rec["values"], want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("version", VERSIONS)
def test_standardized_records_are_raw_records_z_scored_with_pooled_statistics(version: str) -> None:
    """2026-01-15: (x - mean) / std with pandas' mean and std (ddof 1) of base + all intervened rows, std 0 -> 1."""
    mode = "pooled" if version == "2026-01-15" else "none"
    assert _cfg(version).samples.standardize == mode  # the recipe says what their version does
    std_recs = generate_graphs(_cfg(version, **{"samples.standardize": "pooled"}), np.random.default_rng(5), 150)
    raw_recs = generate_graphs(_cfg(version, **{"samples.standardize": "none"}), np.random.default_rng(5), 150)
    for s, r in zip(std_recs, raw_recs):
        rows = np.concatenate([r["base"][None], r["int"]]).reshape(-1, r["base"].shape[1]).astype(np.float64)
        frame = pd.DataFrame(rows)
        mean, std = frame.mean().to_numpy(), frame.std().replace(0, 1.0).to_numpy()
        np.testing.assert_allclose(s["base"], (r["base"] - mean) / std, rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(s["int"], (r["int"] - mean) / std, rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(s["values"], (r["values"] - mean[r["targets"]]) / std[r["targets"]], rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------- the replay has power


def _multiplies_other_parents(version: str, rec: dict) -> bool:
    """An interaction node whose first two parents by index are not its first two in causal order."""
    _, causal, _, inter = _structure(version, rec)
    _, by_index, _, _ = _structure(version, rec, "index")
    return any(inter[v] and set(causal[v][:2]) != set(by_index[v][:2]) for v in causal)


@pytest.mark.slow
def test_replay_catches_a_wrong_interaction(raw) -> None:
    """Records replayed with other interaction semantics fail: the replay can tell them apart."""
    version, recs = raw
    no_inter = [dict(r, interaction=np.zeros_like(r["interaction"])) for r in recs if r["interaction"].any()][:60]
    _, worlds, bad = _replay_all(version, no_inter)
    assert bad > 0.1 * worlds, ("interaction ignored", worlds, bad)
    other = [r for r in recs if _multiplies_other_parents(version, r)][:60]
    _, worlds, bad = _replay_all(version, other, parent_order="index")
    assert bad > 0.1 * worlds, ("parents multiplied by index order", worlds, bad)


# ------------------------------------------------------------- noise: their numpy calls


def _their_noise(rng: np.random.Generator, kind: str, scale: float, size: int) -> np.ndarray:
    """``SCMGenerator.sample_noise`` (2026-01-15) with ``noise_scale = scale``, numpy's own samplers."""
    if kind == "normal":
        return rng.normal(scale=scale, size=size)
    if kind == "laplace":
        return rng.laplace(scale=scale, size=size)
    if kind == "gumbel":
        return rng.gumbel(scale=scale, size=size)
    if kind == "cauchy":
        return np.clip(rng.standard_cauchy(size=size) * scale, -20.0, 20.0)
    return rng.uniform(low=-scale * 1.73, high=scale * 1.73, size=size)


def _root_noise(cfg, seed: int, graphs: int) -> dict[str, np.ndarray]:
    """Base values of root nodes (a root is its noise), pooled per the graph's noise family."""
    out: dict[str, list[np.ndarray]] = {}
    for rec in generate_graphs(cfg, np.random.default_rng(seed), graphs):
        roots = np.flatnonzero(rec["adj"].sum(axis=0) == 0)
        out.setdefault(rec["json"]["noise"], []).append(rec["base"][:, roots].ravel())
    return {k: np.concatenate(v).astype(np.float64) for k, v in out.items()}


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_noise_families_are_their_numpy_distributions(scale: float) -> None:
    """Root values of each family against their numpy call (two-sample KS on ~10,000 values each).

    The family is drawn per graph, uniformly among their five; ``noise_scale`` is numpy's
    ``scale`` (Laplace variance 2 s^2, Gumbel mean 0.577 s, Cauchy clipped at +-20 after
    scaling, uniform +-1.73 s). With ``convention = "unit_variance"`` (ours) the same test fails.
    """
    from scipy import stats

    cfg = _cfg("2026-01-15", **{"samples.standardize": "none", "noise.scale": scale})
    ours = _root_noise(cfg, 11, 600)
    assert set(ours) == set(ref.NOISE_TYPES)
    rng = np.random.default_rng(12)
    for kind, values in ours.items():
        assert values.size > 5000, kind
        p = stats.ks_2samp(values, _their_noise(rng, kind, scale, 40_000)).pvalue
        assert p > 0.001, f"{kind} noise at scale {scale}: KS p = {p:.2g}"
    unit = _root_noise(_cfg("2026-01-15", **{"samples.standardize": "none", "noise.convention": "unit_variance"}), 11, 600)
    assert stats.ks_2samp(unit["laplace"], _their_noise(rng, "laplace", 1.0, 40_000)).pvalue < 1e-6
    assert stats.ks_2samp(unit["gumbel"], _their_noise(rng, "gumbel", 1.0, 40_000)).pvalue < 1e-6


# ------------------------------------------------------------- structure: exact rates on many graphs


@pytest.mark.parametrize("version", VERSIONS)
def test_graph_structure_rates_are_theirs(version: str) -> None:
    """On 20,000 graphs: n uniform on 5..10, each forward pair of the causal order an edge w.p.
    0.3, K = coeffs x max(1, int(0.5 n)) distinct targets, interaction w.p. 0.3 on nodes with
    >= 2 parents. Binomial z-tests at 4 sigma resolve an edge probability of 0.3 from 0.305."""
    cfg = _cfg(version, **{"samples.base": 2, "samples.per_intervention": 2, "samples.standardize": "none"})
    recs = generate_graphs(cfg, np.random.default_rng(99), 20_000)
    ns = np.array([r["adj"].shape[0] for r in recs])
    counts = np.bincount(ns, minlength=11)[5:]
    assert np.all(np.abs(counts - len(recs) / 6) < 4 * np.sqrt(len(recs) * (1 / 6) * (5 / 6))), counts
    pairs = edges = multi = inter = 0
    for r, n in zip(recs, ns):
        order = np.asarray(r["json"]["causal_order"])
        causal_adj = r["adj"][np.ix_(order, order)]
        assert not np.tril(causal_adj).any()  # every edge goes forward in the causal order
        pairs, edges = pairs + n * (n - 1) // 2, edges + int(causal_adj.sum())
        has_two = r["adj"].sum(axis=0) >= 2
        multi, inter = multi + int(has_two.sum()), inter + int(r["interaction"][has_two].sum())
        assert not r["interaction"][~has_two].any()
        targets = r["targets"].tolist()
        k = len(COEFFS[version])
        assert len(targets) == k * max(1, int(n * 0.5)) and len(set(targets)) == len(targets) // k
    for hits, trials, p in ((edges, pairs, 0.3), (inter, multi, 0.3)):
        assert abs(hits / trials - p) < 4 * np.sqrt(p * (1 - p) / trials), (hits, trials, p)
