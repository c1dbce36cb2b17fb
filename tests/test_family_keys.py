"""A graph family's size key given on the command line for a recipe of another family would be ignored
(`--family er --edge-prob 0.9` built ER graphs at the default degree, without a word): one line, exit 2,
nothing built. A recipe file may still spell out every key (the shipped ones do)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main


@pytest.mark.parametrize(
    "args, key, family",
    [
        (["--family", "er", "--edge-prob", "0.9"], "graph.edge_prob", "er"),
        (["--family", "scale_free", "--set", "graph.edge_prob=0.5"], "graph.edge_prob", "scale_free"),
        (["--set", "graph.m=3"], "graph.m", "topo"),
        (["--family", "topo", "--set", "graph.expected_degree=1.5"], "graph.expected_degree", "topo"),
    ],
)
def test_a_key_of_another_family_is_refused(tmp_path: Path, args: list[str], key: str, family: str) -> None:
    r = CliRunner().invoke(main, ["generate", "--graphs", "10", "-o", str(tmp_path / "c"), "-q", *args])
    assert r.exit_code == 2, r.output
    assert f"config key '{key}' applies to graph.family" in r.output and f"this recipe's family is '{family}'" in r.output
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args", [["--family", "topo", "--edge-prob", "0.9"], ["--family", "er", "--set", "graph.expected_degree=1.5"], ["--family", "scale_free", "--set", "graph.m=2"]])
def test_a_key_of_the_recipes_family_builds(tmp_path: Path, args: list[str]) -> None:
    r = CliRunner().invoke(main, ["generate", "--graphs", "10", "-o", str(tmp_path / "c"), "-q", *args])
    assert r.exit_code == 0, r.output


def test_a_recipe_file_may_name_every_family_key(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('graphs = 10\n[graph]\nfamily = "er"\nedge_prob = 0.3\nexpected_degree = 1.5\nm = 2\n')
    r = CliRunner().invoke(main, ["generate", "--config", str(recipe), "-o", str(tmp_path / "c"), "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args", [["--set", "graph.m=3"], ["--set", " graph.edge_prob = 0.5"]])
def test_cachebuild_build_of_a_causal_recipe_refuses_them_too(tmp_path: Path, args: list[str]) -> None:
    """`cachebuild build -c causal.toml --set graph.m=3` (family er) ignored the key without a word, as
    `generate` did before it checked (review of the thirteenth session)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('kind = "causal"\ngraphs = 10\n[graph]\nfamily = "er"\n')
    r = CliRunner().invoke(main, ["build", "-c", str(recipe), "-o", str(tmp_path / "c"), "-q", *args])
    assert r.exit_code == 2, r.output
    assert "applies to graph.family" in r.output and "this recipe's family is 'er'" in r.output
    assert not (tmp_path / "c").exists()


def test_the_api_refuses_them_in_overrides(tmp_path: Path) -> None:
    from cachebuild import build
    from cachebuild.errors import ConfigError

    with pytest.raises(ConfigError, match="graph.expected_degree"):
        build({"kind": "causal", "graphs": 10}, tmp_path / "c", overrides=(o for o in ["graph.expected_degree=2"]), progress=False)
    assert not (tmp_path / "c").exists()
    build({"kind": "causal", "graphs": 10, "graph": {"family": "er"}}, tmp_path / "c", overrides=["graph.expected_degree=2"], progress=False, workers=1)


@pytest.mark.parametrize("family", ["topo", "er"])
def test_inspects_recipe_lines_given_back_as_set_rebuild_the_cache(tmp_path: Path, family: str) -> None:
    """README: `inspect` prints "the recipe (as --set keys)"; every line given back as --set is that cache (nothing to do),
    so another family's size key, which --set refuses, is printed as a TOML comment, not as a key."""
    out = str(tmp_path / "c")
    assert CliRunner().invoke(main, ["generate", "--graphs", "10", "-o", out, "-q", "--family", family]).exit_code == 0
    shown = CliRunner().invoke(main, ["inspect", out]).output
    recipe = shown.split("recipe:\n", 1)[1].split("fields:\n", 1)[0].splitlines()
    keys = [line.strip().replace(" = ", "=", 1) for line in recipe if not line.strip().startswith("#")]
    assert len(keys) > 30 and any(line.strip().startswith("# graph.") for line in recipe)
    again = CliRunner().invoke(main, ["generate", "--graphs", "10", "-o", out, *[a for k in keys for a in ("--set", k)]])
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output
