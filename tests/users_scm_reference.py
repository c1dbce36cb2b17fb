"""TEST-ONLY reference of the users' causal generator (never shipped, never imported by cachebuild).

An independent re-implementation, written for the tests from reading
``MultiModelDeltaPredictor``'s ``src/data/SCMGenerator.py`` and
``src/data/CausalDataset.py`` at four versions:

* ``"2026-01-06"`` (commit 26c6c51): 16 edge types drawn uniformly, ``log``/``exp``/``sqrt``
  without a branch (identity), quadratic/cubic on the parent clipped at 5/3, poly
  unclipped, no per-term clip, total clipped at +-100, normal noise, coefficients
  (-2, -1, 1, 2), no normalisation.
* ``"2026-01-06-clipped"`` (commit dd4cd49, 2026-01-06 16:23, used until 2026-01-14): 26c6c51
  with clips: the noise at +-50 (every world), the intervened value at +-30, every parent
  at +-50 before its function, poly on its parent clipped at +-10, every term at +-50, an
  interaction node's product at +-50 and the sum of its other terms at +-50, the total at +-30.
* ``"2026-01-14"`` (commit 089a630, 17:17 to af0113d, 20:49): dd4cd49 with the noise family
  drawn per graph (the Cauchy draw not clipped at +-20: only the +-50 noise clip bounds it).
* ``"2026-01-15"`` (their newest): the 16 types all implemented (parents clipped at 5 for
  log, exp, quadratic, cubic, poly), every term clipped at +-10, total at +-20, the noise
  family drawn per graph, coefficients (-2, 2), every world z-scored with the pooled mean
  and std of base + intervened rows.

It works like theirs: one graph at a time, a Python loop over nodes in topological order,
float64 values, pandas for the standard deviations (ddof 1) and the pooled statistics,
float32 at the end (their ``torch.tensor(..., dtype=float32)``), ``delta`` in float32. It
uses a ``numpy.random.Generator`` instead of the global ``np.random`` state. ``twin_fix``
draws interaction nodes once per graph (ours); ``twin_fix=False`` re-draws them in every
world, as their code does. It shares no code with ``cachebuild``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["TYPES", "RefGraph", "edge_term", "generate", "generate_graph", "parent_part", "world"]

TYPES = (
    "linear", "negative linear", "sin", "cos", "tan", "log", "exp", "sqrt",
    "quadratic", "cubic", "sigmoid", "step", "abs", "poly", "sawtooth", "rational",
)  # fmt: skip
"""Their edge types, ``randint(1, 17)`` -> ``TYPES[eq - 1]``."""

NOISE_TYPES = ("normal", "laplace", "gumbel", "cauchy", "uniform")
CLIPPED = ("2026-01-06-clipped", "2026-01-14")
"""Versions with the dd4cd49 clips."""
TOTAL_CLIP = {"2026-01-06": 100.0, "2026-01-15": 20.0, "2026-01-06-clipped": 30.0, "2026-01-14": 30.0}
"""Their clip of every node with parents, per version."""


@dataclass
class RefGraph:
    """One graph as their pipeline hands it to the model, plus what the tests need."""

    n: int
    adj: np.ndarray  # [n, n] 0/1, node labels (their nx.to_numpy_array order)
    types: list[str]  # edge type of each edge
    noise: str
    scale: float
    targets: np.ndarray  # [K] node label of each intervention
    raw_values: np.ndarray  # [K] the value the target is set to (clipped in CLIPPED), before normalisation
    raw_base: np.ndarray  # [S, n] float64, before normalisation
    raw_int: np.ndarray  # [K, S, n] float64, before normalisation
    base: np.ndarray  # [S, n] float32, as yielded (normalised in 2026-01-15)
    ints: np.ndarray  # [K, S, n] float32
    delta: np.ndarray  # [K, S, n] float32: ints - base in float32


def _clipped_term(kind: str, x: np.ndarray) -> np.ndarray:
    """dd4cd49 / 089a630: the parent clipped to +-50 first, poly's to +-10, every term to +-50."""
    x = np.clip(x, -50.0, 50.0)
    if kind == "abs":
        term = np.abs(np.clip(x, -50.0, 50.0))
    elif kind == "poly":
        p = np.clip(x, -10.0, 10.0)
        term = 0.5 * (p**2) + 0.5 * p
    else:
        term = edge_term("2026-01-06", kind, x)  # otherwise 26c6c51's formulas (log, exp, sqrt: x)
    return np.clip(term, -50.0, 50.0)


def edge_term(version: str, kind: str, x: np.ndarray) -> np.ndarray:
    """Their term for one edge type, float64, including the per-term clips (2026-01-15, CLIPPED)."""
    x = np.asarray(x, dtype=np.float64)
    if version in CLIPPED:
        return _clipped_term(kind, x)
    if version == "2026-01-06":
        table = {
            "linear": lambda: 2.0 * x, "negative linear": lambda: -2.0 * x,
            "sin": lambda: np.sin(x), "cos": lambda: np.cos(x), "tan": lambda: np.tanh(x),
            "quadratic": lambda: np.clip(x, -5, 5) ** 2, "cubic": lambda: np.clip(x, -3, 3) ** 3,
            "sigmoid": lambda: 1.0 / (1.0 + np.exp(-x)), "step": lambda: (x > 0).astype(float),
            "abs": lambda: np.abs(x), "poly": lambda: 0.5 * (x**2) + 0.5 * x,
            "sawtooth": lambda: 2.0 * (x - np.floor(x)) - 1.0,
            "rational": lambda: 2.0 * x / (1.0 + np.abs(x)),
        }  # fmt: skip
        with np.errstate(over="ignore"):  # their expit saturates silently
            return table[kind]() if kind in table else x  # log, exp, sqrt: no branch, fall back to x
    safe = np.clip(x, -5.0, 5.0)
    table = {
        "linear": lambda: 2.0 * x, "negative linear": lambda: -2.0 * x,
        "sin": lambda: np.sin(x), "cos": lambda: np.cos(x), "tan": lambda: np.tanh(x),
        "quadratic": lambda: safe**2, "cubic": lambda: safe**3,
        "sigmoid": lambda: 1.0 / (1.0 + np.exp(-x)), "step": lambda: (x > 0).astype(float),
        "abs": lambda: np.abs(x), "log": lambda: np.log(np.abs(safe) + 1e-6), "exp": lambda: np.exp(safe),
        "sqrt": lambda: np.sqrt(np.abs(x)), "poly": lambda: 0.5 * (safe**2) + 0.5 * safe,
        "sawtooth": lambda: 2.0 * (x - np.floor(x)) - 1.0,
        "rational": lambda: 2.0 * x / (1.0 + np.abs(x)),
    }  # fmt: skip
    with np.errstate(over="ignore"):
        return np.clip(table[kind](), -10.0, 10.0)


def _noise(rng: np.random.Generator, kind: str, size: tuple[int, int], version: str = "2026-01-15", s: float = 1.0) -> np.ndarray:
    """Their sample_noise with noise_scale ``s`` (the Cauchy clipped at +-20 only from 2026-01-15)."""
    if kind == "normal":
        return rng.normal(scale=s, size=size)
    if kind == "laplace":
        return rng.laplace(scale=s, size=size)
    if kind == "gumbel":
        return rng.gumbel(scale=s, size=size)
    if kind == "cauchy":
        c = rng.standard_cauchy(size=size) * s
        return c if version == "2026-01-14" else np.clip(c, -20.0, 20.0)
    return rng.uniform(low=-s * 1.73, high=s * 1.73, size=size)


def parent_part(version: str, data: np.ndarray, node: int, parents, types, interact: bool) -> np.ndarray:
    """What generate_data() adds to ``node``'s noise before the total clip: its terms, combined."""
    terms = [edge_term(version, types[(p, node)], data[:, p]) for p in parents[node]]
    if len(terms) > 1 and interact and version in CLIPPED:  # dd4cd49: product and rest clipped to +-50
        return np.clip(terms[0] * terms[1], -50.0, 50.0) + np.clip(sum(terms[2:]) if len(terms) > 2 else 0, -50.0, 50.0)
    if len(terms) > 1 and interact:
        return terms[0] * terms[1] + (sum(terms[2:]) if len(terms) > 2 else 0)
    return sum(terms)


def world(version, rng, order, parents, types, noise, inter, intervention=None) -> np.ndarray:
    """generate_data(): every node in topological order, the intervened one set to its value.

    ``parents[v]``: v's parents in their insertion (causal) order; ``types[(p, v)]``: their edge
    type; ``inter``: interaction flag per node, or None to draw it per world from ``rng``, as
    their code does; ``intervention``: ``(node, value)`` or None for the base world.
    """
    clip, clipped = TOTAL_CLIP[version], version in CLIPPED
    data = np.clip(noise, -50.0, 50.0) if clipped else noise.copy()
    for node in order:
        if intervention is not None and node == intervention[0]:
            data[:, node] = np.clip(intervention[1], -30.0, 30.0) if clipped else intervention[1]
            continue
        if not parents[node]:
            continue
        interact = inter[node] if inter is not None else (len(parents[node]) > 1 and rng.random() < 0.3)
        total = data[:, node] + parent_part(version, data, node, parents, types, interact)
        data[:, node] = np.clip(total, -clip, clip)
    return data


def generate_graph(
    version: str, rng: np.random.Generator, n_range=(5, 10), edge_prob=0.3, samples=64,
    intervention_prob=0.5, scale_range=(1.0, 1.0), twin_fix: bool = True, noise_scale: float = 1.0,
) -> RefGraph:  # fmt: skip
    """One graph of CausalDataset.__iter__ -> SCMGenerator.generate_pipeline."""
    scale = rng.uniform(scale_range[0], scale_range[1])
    n = int(rng.integers(n_range[0], n_range[1] + 1))
    topo = np.arange(n)
    rng.shuffle(topo)
    parents: dict[int, list[int]] = {v: [] for v in range(n)}
    types: dict[tuple[int, int], str] = {}
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < edge_prob:
                parents[int(topo[j])].append(int(topo[i]))  # parents in causal (insertion) order
    for child in range(n):  # their edge_parameters loop: one randint per edge
        for p in parents[child]:
            types[(p, child)] = TYPES[int(rng.integers(1, 17)) - 1]
    order = [int(v) for v in topo]
    noise_type = str(rng.choice(NOISE_TYPES)) if version in ("2026-01-15", "2026-01-14") else "normal"
    noise = _noise(rng, noise_type, (samples, n), version, noise_scale)
    inter = {v: len(parents[v]) > 1 and rng.random() < 0.3 for v in range(n)} if twin_fix else None
    base = world(version, rng, order, parents, types, noise, inter)
    targets = rng.choice(n, size=max(1, int(n * intervention_prob)), replace=False)
    stds = pd.DataFrame(base).std()  # pandas: ddof 1
    coeffs = [-2.0, 2.0] if version == "2026-01-15" else [-2.0, -1.0, 1.0, 2.0]
    worlds, values, tlist = [], [], []
    for t in targets:
        sigma = float(stds[int(t)])
        if sigma < 1e-4:
            sigma = 1.0
        for c in coeffs:
            val = c * sigma * scale
            worlds.append(world(version, rng, order, parents, types, noise, inter, (int(t), val)))
            values.append(float(np.clip(val, -30.0, 30.0)) if version in CLIPPED else val)
            tlist.append(int(t))
    raw_int = np.stack(worlds)
    if version == "2026-01-15":
        combined = pd.concat([pd.DataFrame(base)] + [pd.DataFrame(w) for w in worlds], axis=0)
        mean, std = combined.mean(), combined.std().replace(0, 1.0)
        base_out = ((pd.DataFrame(base) - mean) / std).values
        int_out = np.stack([((pd.DataFrame(w) - mean) / std).values for w in worlds])
    else:
        base_out, int_out = base, raw_int
    base32, int32 = base_out.astype(np.float32), int_out.astype(np.float32)
    adj = np.zeros((n, n))
    for child in range(n):
        adj[parents[child], child] = 1.0
    return RefGraph(
        n, adj, [types[e] for e in sorted(types)], noise_type, float(scale), np.array(tlist),
        np.array(values), base, raw_int, base32, int32, int32 - base32[None],
    )  # fmt: skip


def generate(version: str, seed: int, count: int, **kwargs) -> list[RefGraph]:
    """``count`` graphs from one ``numpy.random.Generator(seed)``."""
    rng = np.random.default_rng(seed)
    return [generate_graph(version, rng, **kwargs) for _ in range(count)]
