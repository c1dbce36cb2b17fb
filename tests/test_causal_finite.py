"""No inf or NaN in any causal record: every noise family, convention and mechanism."""

from __future__ import annotations

import numpy as np
import pytest

from cachebuild.causal import CAUSAL_FIELDS, EDGE_FUNCTIONS, NOISE_CONVENTIONS, NOISE_KINDS, generate_graphs
from cachebuild.causal import parse_causal_config
from cachebuild.causal.noise import sample_noise
from cachebuild.errors import ConfigError

_FLOAT_FIELDS = [f for f, dt in CAUSAL_FIELDS.items() if dt.startswith("float")]


def _all_finite(recs: list[dict]) -> bool:
    return all(np.isfinite(r[f]).all() for r in recs for f in _FLOAT_FIELDS)


@pytest.mark.parametrize("convention", NOISE_CONVENTIONS)
@pytest.mark.parametrize("kind", NOISE_KINDS)
def test_noise_never_infinite(kind: str, convention: str) -> None:
    """numpy's float32 exponential returns exact zeros (seed 2: three in 10 million): -log must not be inf."""
    rng = np.random.default_rng(2)
    assert (np.random.default_rng(2).standard_exponential(10_000_000, dtype=np.float32) == 0).sum() == 3
    x = sample_noise(rng, kind, (10_000_000,), 20.0, np.float32, convention, scale=1.5)
    assert np.isfinite(x).all(), (kind, convention)
    if kind == "gumbel":
        assert x.max() > 20  # the zeros became large finite values, not inf
    if kind == "cauchy":
        assert np.abs(x).max() <= (20.0 * 1.5 if convention == "unit_variance" else 20.0)


_MECHANISMS = [("nonlinear", f) for f in EDGE_FUNCTIONS] + [("linear", "linear")]


@pytest.mark.parametrize("mechanism, function", _MECHANISMS, ids=[f"{m}-{f}" for m, f in _MECHANISMS])
def test_every_mechanism_and_noise_family_is_finite(mechanism: str, function: str) -> None:
    """Each edge function alone, every noise family, no parent/term clips, large interventions."""
    for convention in NOISE_CONVENTIONS:
        cfg = parse_causal_config(
            {
                "mechanism": {"kind": mechanism, "functions": [function], "clip_parent": "none", "clip_term": "none",
                              "interaction_prob": 0.5, "weights": "signed_uniform"},
                "noise": {"kind": "mixed", "convention": convention, "per_node": True, "scale_hi": 3.0},
                "interventions": {"value_scale": [1.0, 100.0]},
                "samples": {"base": 16, "per_intervention": 16, "standardize": "pooled"},
            }
        )  # fmt: skip
        recs = generate_graphs(cfg, np.random.default_rng(EDGE_FUNCTIONS.index(function)), 150)
        assert _all_finite(recs), (function, mechanism, convention)


@pytest.mark.parametrize("recipe", ["causal-users-2026-01-15.toml", "causal-users-2026-01-06.toml", "causal-users-2026-01-06-clipped.toml", "causal-users-2026-01-14.toml", "causal-rich.toml"])
def test_recipes_are_finite(recipe: str) -> None:
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).resolve().parent.parent / "configs" / recipe).read_text())
    data["noise"]["kind"] = "mixed"  # every family, whatever the recipe's own choice
    recs = generate_graphs(parse_causal_config(data), np.random.default_rng(4), 2000)
    assert _all_finite(recs)


def test_overflowing_recipe_is_refused_not_written() -> None:
    """A linear SEM on a dense 40-node graph with weights near 100 overflows float32: a ConfigError."""
    cfg = parse_causal_config(
        {
            "graph": {"n_min": 40, "n_max": 40, "edge_prob": 1.0},
            "mechanism": {"kind": "linear", "weights": "signed_uniform", "w_lo": 90.0, "w_hi": 100.0},
            "samples": {"base": 4, "per_intervention": 4, "standardize": "none"},
        }
    )
    with np.errstate(over="ignore", invalid="ignore"), pytest.raises(ConfigError, match="non-finite"):
        generate_graphs(cfg, np.random.default_rng(0), 3)
