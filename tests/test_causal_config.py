"""The causal config: defaults, TOML files, round trips, and one error per bad value."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachebuild.causal import EDGE_FUNCTIONS, NOISE_KINDS, CausalConfig, parse_causal_config
from cachebuild.errors import ConfigError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_empty_table_gives_defaults() -> None:
    cfg = parse_causal_config({})
    assert cfg == CausalConfig()
    assert cfg.graph.family == "topo" and (cfg.graph.n_min, cfg.graph.n_max) == (5, 10)
    assert cfg.graph.edge_prob == 0.3 and cfg.mechanism.kind == "nonlinear"
    assert cfg.interventions.coeffs == (-2.0, -1.0, 1.0, 2.0) and cfg.samples.base == 64 and cfg.samples.twin


def test_default_toml_reproduces_defaults() -> None:
    data = tomllib.loads((CONFIGS / "causal-default.toml").read_text())
    assert "seed" in data and "graphs" in data
    assert parse_causal_config(data) == CausalConfig()


def test_linear_toml_is_linear_gaussian() -> None:
    cfg = parse_causal_config(tomllib.loads((CONFIGS / "causal-linear.toml").read_text()))
    assert cfg.mechanism.kind == "linear" and cfg.noise.kind == "normal"
    assert not cfg.samples.standardize


def test_ignored_top_level_keys() -> None:
    cfg = parse_causal_config({"seed": 3, "graphs": 10, "out": "x", "build": {"workers": 2}, "kind": "causal"})
    assert cfg == CausalConfig()


def test_to_dict_round_trips_through_json() -> None:
    cfg = parse_causal_config(
        {
            "graph": {"family": "scale_free", "m": 3},
            "mechanism": {"functions": ["sin", "abs"]},
            "noise": {"kind": "mixed"},
        }
    )
    d = json.loads(json.dumps(cfg.to_dict()))
    assert parse_causal_config(d) == cfg


def test_sizes() -> None:
    cfg = CausalConfig()
    assert cfg.max_nodes() == 10
    assert cfg.max_interventions() == 5 * 4
    # mean over n = 5..10 of the payload bytes: about 55-60 KB for the defaults
    assert 50_000 < cfg.estimated_record_bytes() < 65_000


_bad = [
    ({"graph": {"n_min": 0}}, "graph.n_min"),
    ({"graph": {"n_min": 1}}, "graph.n_min"),
    ({"graph": {"n_min": 6, "n_max": 5}}, "graph.n_max"),
    ({"graph": {"n_min": 5.0}}, "graph.n_min"),
    ({"graph": {"edge_prob": 1.5}}, "graph.edge_prob"),
    ({"graph": {"edge_prob": -0.1}}, "graph.edge_prob"),
    ({"graph": {"edge_prob": "0.3"}}, "graph.edge_prob"),
    ({"graph": {"family": "smallworld"}}, "graph.family"),
    ({"graph": {"family": "scale_free", "m": 5}}, "graph.m"),
    ({"graph": {"family": "er", "expected_degree": 7.0}}, "graph.expected_degree"),
    ({"mechanism": {"kind": "quadratic"}}, "mechanism.kind"),
    ({"mechanism": {"functions": ["sin", "sinh"]}}, "mechanism.functions"),
    ({"mechanism": {"functions": []}}, "mechanism.functions"),
    ({"mechanism": {"functions": "sin"}}, "mechanism.functions"),
    ({"mechanism": {"w_lo": 2.0, "w_hi": 1.0}}, "mechanism.w_hi"),
    ({"mechanism": {"interaction_prob": 2}}, "mechanism.interaction_prob"),
    ({"mechanism": {"clip_value": 0}}, "mechanism.clip_value"),
    ({"noise": {"kind": "poisson"}}, "noise.kind"),
    ({"noise": {"kinds": ["normal", "mixed"]}}, "noise.kinds"),
    ({"noise": {"scale": 0.0}}, "noise.scale"),
    ({"noise": {"per_node": 1}}, "noise.per_node"),
    ({"noise": {"scale_lo": 2.0, "scale_hi": 1.0}}, "noise.scale_hi"),
    ({"interventions": {"intervention_prob": 1.5}}, "interventions.intervention_prob"),
    ({"interventions": {"mode": "random"}}, "interventions.mode"),
    ({"interventions": {"coeffs": []}}, "interventions.coeffs"),
    ({"interventions": {"values": [1.0, "a"]}}, "interventions.values"),
    ({"interventions": {"per_target": 0}}, "interventions.per_target"),
    ({"samples": {"base": 0}}, "samples.base"),
    ({"samples": {"per_intervention": 32}}, "samples.per_intervention"),
    ({"samples": {"twin": "yes"}}, "samples.twin"),
    ({"samples": {"base": True}}, "samples.base"),
    ({"noise": {"kindd": "normal"}}, "noise.kindd"),
    ({"graphh": {}}, "graphh"),
    ({"graph": 3}, "graph"),
]


@pytest.mark.parametrize("data, key", _bad, ids=[k for _, k in _bad])
def test_bad_values_raise_config_error_naming_the_key(data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_causal_config(data)
    assert f"'{key}'" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_function_lists_allowed_names() -> None:
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"mechanism": {"functions": ["sinh"]}})
    msg = str(info.value)
    assert "'sinh'" in msg and all(name in msg for name in EDGE_FUNCTIONS)


def test_unknown_noise_lists_allowed_names() -> None:
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"noise": {"kind": "poisson"}})
    assert all(name in str(info.value) for name in NOISE_KINDS + ("mixed",))


_configs = st.fixed_dictionaries(
    {
        "graph": st.fixed_dictionaries(
            {
                "family": st.sampled_from(["topo", "er", "scale_free"]),
                "n_min": st.integers(4, 8),
                "edge_prob": st.floats(0, 1),
                "expected_degree": st.floats(0, 3),
                "m": st.integers(1, 3),
            }
        ),
        "mechanism": st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["linear", "nonlinear"]),
                "functions": st.lists(st.sampled_from(EDGE_FUNCTIONS), min_size=1, unique=True),
                "interaction_prob": st.floats(0, 1),
            }
        ),
        "noise": st.fixed_dictionaries(
            {"kind": st.sampled_from(NOISE_KINDS + ("mixed",)), "per_node": st.booleans(), "scale": st.floats(0.1, 5)}
        ),
        "interventions": st.fixed_dictionaries(
            {
                "mode": st.sampled_from(["adaptive", "fixed", "sampled"]),
                "coeffs": st.lists(st.floats(-3, 3), min_size=1, max_size=5),
                "intervention_prob": st.floats(0, 1),
            }
        ),
        "samples": st.fixed_dictionaries({"twin": st.booleans(), "standardize": st.booleans()}),
    }
)


@settings(max_examples=60, deadline=None)
@given(_configs)
def test_round_trip_property(data: dict) -> None:
    data["graph"]["n_max"] = data["graph"]["n_min"] + 3
    cfg = parse_causal_config(data)
    again = parse_causal_config(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
