"""The causal config: defaults, TOML files, round trips, and one error per bad value."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachebuild.causal import EDGE_FUNCTIONS, NOISE_KINDS, CausalConfig, parse_causal_config
from cachebuild.causal.config import STORED_WHEN_SET, SampleConfig
from cachebuild.errors import ConfigError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_empty_table_gives_defaults() -> None:
    cfg = parse_causal_config({})
    assert cfg == CausalConfig()
    assert cfg.graph.family == "topo" and (cfg.graph.n_min, cfg.graph.n_max) == (5, 10)
    assert cfg.graph.edge_prob == 0.3 and cfg.mechanism.kind == "nonlinear"
    assert cfg.interventions.coeffs == (-2.0, 2.0) and cfg.samples.base == 64 and cfg.samples.twin
    assert cfg.samples.standardize == "pooled" and cfg.noise.kind == "mixed" and cfg.noise.convention == "numpy"


def _load(name: str) -> CausalConfig:
    return parse_causal_config(tomllib.loads((CONFIGS / name).read_text()))


def _all_keys() -> dict[str, set[str]]:
    """Every key of every section (``to_dict`` leaves out the later keys at their default)."""
    cfg = CausalConfig()
    return {f.name: {k.name for k in dataclasses.fields(getattr(cfg, f.name))} for f in dataclasses.fields(cfg)}


def test_users_2026_01_15_toml_is_the_builtin_default() -> None:
    data = tomllib.loads((CONFIGS / "causal-users-2026-01-15.toml").read_text())
    assert "seed" in data and "graphs" in data
    assert parse_causal_config(data) == CausalConfig()
    # every key is spelled out in the file, so the file alone documents the default
    for section, keys in _all_keys().items():
        assert set(data[section]) == keys, section


def test_causal_default_toml_is_the_builtin_default() -> None:
    """Issue 2 names the default recipe ``configs/causal-default.toml``: it must exist and equal the default."""
    data = tomllib.loads((CONFIGS / "causal-default.toml").read_text())
    assert parse_causal_config(data) == CausalConfig()
    assert data == tomllib.loads((CONFIGS / "causal-users-2026-01-15.toml").read_text())


USERS_RECIPES = ("causal-users-2026-01-06.toml", "causal-users-2026-01-06-clipped.toml", "causal-users-2026-01-14.toml")


def test_recipes_spell_out_every_key() -> None:
    keys = _all_keys()
    for name in USERS_RECIPES + ("causal-rich.toml", "causal-default.toml"):
        data = tomllib.loads((CONFIGS / name).read_text())
        assert {s: set(data[s]) for s in keys} == keys, name


def test_later_keys_are_stored_only_when_set() -> None:
    """Keys added for the clipped recipes leave the manifests (and fingerprints) of older recipes as they were."""
    for section, names in STORED_WHEN_SET.items():
        assert not set(names) & set(CausalConfig().to_dict()[section]), section
    for name in ("causal-users-2026-01-06.toml", "causal-rich.toml", "causal-users-2026-01-15.toml"):
        d = _load(name).to_dict()
        assert all(not set(names) & set(d[s]) for s, names in STORED_WHEN_SET.items()), name
    cfg = _load("causal-users-2026-01-06-clipped.toml")
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["noise"]["clip"] == 50.0 and d["interventions"]["value_clip"] == 30.0
    assert (d["mechanism"]["clip_interaction"], d["mechanism"]["clip_rest"]) == (50.0, 50.0)
    assert parse_causal_config(d) == cfg


@pytest.mark.parametrize("name", USERS_RECIPES[1:])
def test_users_clipped_tomls(name: str) -> None:
    """dd4cd49 (2026-01-06 16:23) and 089a630 (2026-01-14): 26c6c51 with their clips."""
    cfg, before = _load(name), _load("causal-users-2026-01-06.toml")
    mc = cfg.mechanism
    assert (mc.clip_parent, mc.clip_term, mc.clip_value, mc.clip_interaction, mc.clip_rest) == (50.0, 50.0, 30.0, 50.0, 50.0)
    assert cfg.noise.clip == 50.0 and cfg.interventions.value_clip == 30.0
    assert mc.functions == tuple("poly_clip10" if f == "poly" else f for f in before.mechanism.functions)
    assert mc.function_weights == before.mechanism.function_weights and mc.interaction_prob == 0.3
    assert cfg.interventions == dataclasses.replace(before.interventions, value_clip=30.0)
    assert cfg.graph == before.graph and cfg.samples == before.samples
    if name == "causal-users-2026-01-14.toml":  # 089a630: a noise family per graph, Cauchy up to the noise clip
        assert cfg.noise.kind == "mixed" and cfg.noise.cauchy_clip == 50.0 and cfg.noise.kinds == NOISE_KINDS
    else:
        assert cfg.noise == dataclasses.replace(before.noise, clip=50.0)


def test_users_2026_01_06_toml() -> None:
    cfg = _load("causal-users-2026-01-06.toml")
    mc = cfg.mechanism
    assert mc.clip_term is None and mc.clip_parent is None and mc.clip_value == 100.0 and mc.weights == "one"
    assert dict(zip(mc.functions, mc.function_weights))["linear"] == 3.0 and sum(mc.function_weights) == 16
    assert cfg.interventions.coeffs == (-2.0, -1.0, 1.0, 2.0) and cfg.samples.standardize == "none"
    assert cfg.noise.kind == "normal" and cfg.interventions.sigma_ddof == 1


def test_rich_toml_is_the_previous_default() -> None:
    cfg = _load("causal-rich.toml")
    mc = cfg.mechanism
    assert mc.weights == "signed_uniform" and (mc.clip_parent, mc.clip_term, mc.clip_value) == (10.0, 10.0, 100.0)
    assert mc.functions[0] == "linear" and mc.function_weights[0] == 2.0 and len(mc.functions) == 16
    assert cfg.noise.convention == "unit_variance" and cfg.samples.standardize == "none"
    assert cfg.interventions.sigma_ddof == 0 and cfg.interventions.sigma_min == 0.0


def test_linear_toml_is_linear_gaussian() -> None:
    cfg = _load("causal-linear.toml")
    assert cfg.mechanism.kind == "linear" and cfg.noise.kind == "normal"
    assert cfg.samples.standardize == "none" and cfg.mechanism.weights == "signed_uniform"


def test_old_boolean_standardize_still_parses() -> None:
    assert parse_causal_config({"samples": {"standardize": True}}).samples.standardize == "base"
    assert parse_causal_config({"samples": {"standardize": False}}).samples.standardize == "none"


def test_value_scale_number_or_range() -> None:
    assert parse_causal_config({"interventions": {"value_scale": 2.0}}).interventions.value_scale == (2.0, 2.0)
    cfg = parse_causal_config({"interventions": {"value_scale": [1, 50]}})
    assert cfg.interventions.value_scale == (1.0, 50.0)


def test_functions_without_weights_get_equal_weights() -> None:
    cfg = parse_causal_config({"mechanism": {"functions": ["sin", "abs"]}})
    assert cfg.mechanism.function_weights == (1.0, 1.0)


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
    assert cfg.max_interventions() == 5 * 2
    # mean over n = 5..10 of the payload bytes: about 30 KB for the defaults (K = 2 per target)
    assert 25_000 < cfg.estimated_record_bytes() < 35_000


@pytest.mark.parametrize(
    "graph, message",
    [
        ({"n_min": 12}, "config key 'graph.n_min' has invalid value 12: must be <= graph.n_max (10, the default)"),
        ({"n_max": 4}, "config key 'graph.n_max' has invalid value 4: must be >= graph.n_min (5, the default)"),
        ({"n_min": 6, "n_max": 5}, "config keys 'graph.n_min' (6) and 'graph.n_max' (5): n_min must be <= n_max"),
    ],
)
def test_size_order_blames_the_key_that_was_set(graph: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"graph": graph})
    assert str(info.value).startswith(message)


_bad = [
    ({"graph": {"n_min": 0}}, "graph.n_min"),
    ({"graph": {"n_min": 1}}, "graph.n_min"),
    ({"graph": {"n_min": 6, "n_max": 5}}, "graph.n_max"),
    ({"graph": {"n_min": 12}}, "graph.n_min"),
    ({"graph": {"n_max": 4}}, "graph.n_max"),
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
    ({"samples": {"standardize": "global"}}, "samples.standardize"),
    ({"mechanism": {"weights": "random"}}, "mechanism.weights"),
    ({"mechanism": {"w_hi": 500.0}}, "mechanism.w_hi"),
    ({"mechanism": {"clip_term": "off"}}, "mechanism.clip_term"),
    ({"mechanism": {"clip_parent": -1.0}}, "mechanism.clip_parent"),
    ({"mechanism": {"clip_value": "none"}}, "mechanism.clip_value"),
    ({"mechanism": {"function_weights": [1.0, 2.0]}}, "mechanism.function_weights"),
    ({"mechanism": {"functions": ["sin", "abs"], "function_weights": [1.0, 0.0]}}, "mechanism.function_weights"),
    ({"noise": {"convention": "scipy"}}, "noise.convention"),
    ({"noise": {"scale": 5000.0}}, "noise.scale"),
    ({"interventions": {"value_scale": [2.0, 1.0]}}, "interventions.value_scale"),
    ({"interventions": {"value_scale": [1.0, 2000.0]}}, "interventions.value_scale"),
    ({"interventions": {"value_scale": -1.0}}, "interventions.value_scale"),
    ({"interventions": {"sigma_ddof": 2}}, "interventions.sigma_ddof"),
    ({"interventions": {"sigma_min": -0.1}}, "interventions.sigma_min"),
    ({"samples": {"base": True}}, "samples.base"),
    ({"noise": {"clip": 0}}, "noise.clip"),
    ({"noise": {"clip": "off"}}, "noise.clip"),
    ({"interventions": {"value_clip": -30.0}}, "interventions.value_clip"),
    ({"mechanism": {"clip_interaction": 2e6}}, "mechanism.clip_interaction"),
    ({"mechanism": {"clip_rest": True}}, "mechanism.clip_rest"),
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
                "weights": st.sampled_from(["one", "signed_uniform"]),
                "clip_term": st.one_of(st.just("none"), st.floats(0.1, 100)),
            }
        ),
        "noise": st.fixed_dictionaries({"kind": st.sampled_from(NOISE_KINDS + ("mixed",)), "per_node": st.booleans(), "scale": st.floats(0.1, 5)}),
        "interventions": st.fixed_dictionaries(
            {
                "mode": st.sampled_from(["adaptive", "fixed", "sampled"]),
                "coeffs": st.lists(st.floats(-3, 3), min_size=1, max_size=5),
                "intervention_prob": st.floats(0, 1),
                "value_scale": st.one_of(st.floats(0, 10), st.tuples(st.floats(0, 1), st.floats(1, 10)).map(list)),
            }
        ),
        "samples": st.fixed_dictionaries({"twin": st.booleans(), "standardize": st.sampled_from(["none", "base", "pooled"])}),
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


def test_out_of_range_message_names_key_value_and_range() -> None:
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"mechanism": {"w_hi": 500.0}})
    msg = str(info.value)
    assert "'mechanism.w_hi'" in msg and "500.0" in msg and "[0.5, 100]" in msg
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"interventions": {"value_scale": [1.0, 2000.0]}})
    msg = str(info.value)
    assert "'interventions.value_scale'" in msg and "2000.0" in msg and "1000" in msg


def test_recipe_file_error_through_the_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cachebuild.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[mechanism]\nclip_value = 1e9\n")
    r = CliRunner().invoke(main, ["generate", "--config", str(bad), "--graphs", "5", "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 2
    assert "'mechanism.clip_value'" in r.output and "1000000000.0" in r.output and "(0, 1e+06]" in r.output


def test_samples_base_alone_is_enough_and_differing_pair_names_both_keys() -> None:
    assert parse_causal_config({"samples": {"base": 32}}).samples.per_intervention == 32
    assert parse_causal_config({"samples": {"base": 32, "per_intervention": 32}}).samples.per_intervention == 32
    assert SampleConfig(base=16).per_intervention == 16 and SampleConfig() == SampleConfig(64, 64)
    with pytest.raises(ConfigError) as info:
        parse_causal_config({"samples": {"base": 32, "per_intervention": 64}})
    assert "'samples.base' (32) and 'samples.per_intervention' (64) differ" in str(info.value)
