"""Review: an error about a recipe names the recipe file (and the --set flags in play), not only the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild import build
from cachebuild.cli import main
from cachebuild.errors import ConfigError


@pytest.mark.parametrize(
    "command, text, sets, words",
    [
        ("build", 'kind = "causal"\ngraphs = 10\nbogus = 1\n', [], "unknown config key 'bogus'"),
        ("build", 'kind = "causal"\ngraphs = 10\n[build]\ncodec = "lz4"\n', [], "config key 'build.codec' has invalid value 'lz4'"),
        ("build", 'kind = "no_such_module_rv:make"\nrecords = 10\n', [], "cannot import module 'no_such_module_rv'"),
        ("generate", "graphs = 10\n[graph]\nnodes = [5, 2]\n", [], "unknown config key 'graph.nodes'"),
        ("generate", "graphs = 10\n", ["graph.edge_prob=2"], "config key 'graph.edge_prob' has invalid value 2"),
        ("mel", "n_mels = -1\n", [], "n_mels"),
    ],
)
def test_a_bad_recipe_is_named_with_its_key_and_value(tmp_path: Path, command: str, text: str, sets: list[str], words: str) -> None:
    recipe = tmp_path / "my-recipe.toml"
    recipe.write_text(text)
    args = [command, "-c", str(recipe), "-o", str(tmp_path / "out"), "-q"]
    for s in sets:
        args += ["--set", s]
    if command == "mel":
        args += ["--synthetic", "4"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and line.startswith(f"error: {recipe}"), line
    assert words in line, line
    for s in sets:
        assert f"--set {s}" in line, line
    assert not (tmp_path / "out").exists()


def test_the_python_api_names_the_recipe_file_too(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.toml"
    recipe.write_text('kind = "causal"\ngraphs = 10\n[build]\nshard_mb = 0\n')
    with pytest.raises(ConfigError, match=rf"^{recipe}: config key 'build.shard_mb' has invalid value 0"):
        build(recipe, tmp_path / "out", progress=False)
    with pytest.raises(ConfigError, match=r"^config key 'build.shard_mb' has invalid value 0"):  # a dict has no file to name
        build({"kind": "causal", "graphs": 10, "build": {"shard_mb": 0}}, tmp_path / "out", progress=False)
