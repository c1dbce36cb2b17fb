"""The users' names of recipe keys: torchaudio's ``hop_length``/``f_min``/``f_max`` for mel
recipes and their ``CausalDataset``'s ``intervention_scale_range``, in a recipe file or with
``--set``, build the very bytes our names build; both spellings at once is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main
from cachebuild.config_file import apply_overrides
from cachebuild.errors import ConfigError
from cachebuild.format.manifest import read_manifest
from cachebuild.builder.markers import file_sha256


def _run(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    "command,ours,theirs",
    [
        (["mel", "--synthetic", "4"], "hop=256", "hop_length=256"),
        (["mel", "--synthetic", "4"], "fmin=20.0", "f_min=20.0"),
        (["generate", "--graphs", "12"], "interventions.value_scale=[1,50]", "interventions.intervention_scale_range=[1,50]"),
    ],
)
def test_the_users_key_names_build_the_same_bytes_as_ours(tmp_path: Path, command: list[str], ours: str, theirs: str) -> None:
    for name, setting in (("ours", ours), ("theirs", theirs)):
        r = _run([*command, "--out", str(tmp_path / name), "-q", "-j", "1", "--set", setting])
        assert r.exit_code == 0, r.output
    assert _hashes(tmp_path / "theirs") == _hashes(tmp_path / "ours")  # manifest.json too: stored under our name


def test_a_recipe_file_may_use_the_users_names_but_not_both(tmp_path: Path) -> None:
    recipe = tmp_path / "users.toml"
    recipe.write_text('kind = "causal"\ngraphs = 12\n[interventions]\nintervention_scale_range = [1, 50]\n')
    r = _run(["build", "--config", str(recipe), "--out", str(tmp_path / "a"), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    assert read_manifest(tmp_path / "a").config["interventions"]["value_scale"] == [1.0, 50.0]
    recipe.write_text('kind = "causal"\ngraphs = 12\n[interventions]\nintervention_scale_range = [1, 50]\nvalue_scale = 2\n')
    r = _run(["build", "--config", str(recipe), "--out", str(tmp_path / "b"), "-q", "-j", "1"])
    assert r.exit_code == 2 and "'interventions.intervention_scale_range' and 'interventions.value_scale' are one setting" in r.output
    assert len(r.output.strip().splitlines()) == 1
    # --set with the users' name overrides the file's own key (not "both given")
    assert apply_overrides({"hop": 128}, ["hop_length=256"]) == {"hop": 256}
    with pytest.raises(ConfigError, match="'hop_length' and 'hop' are one setting"):
        apply_overrides({"hop": 128, "hop_length": 256})
