"""`cachebuild build --shard-mb/--codec/--level` (a flag overrides the recipe's [build] key, as in
`generate`), the same arguments of `cachebuild.build(recipe, ...)` (they were silently ignored for a
recipe), and an append that leaves seed or codec out taking the cache's own (it was refused: a cache
built with `--seed 7` or `--codec none` could not be appended to without repeating the flag)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import cachebuild
from cachebuild.cli import main
from cachebuild.format.manifest import read_manifest

REPO = Path(__file__).resolve().parents[1]
RECIPE = """kind = "causal"
seed = 4
graphs = 300
[graph]
n_min = 5
n_max = 6
[build]
codec = "zstd"
shard_mb = 256
"""


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(RECIPE)
    return path


def _cli(*args: str):
    return CliRunner().invoke(main, [*args, "-q", "-j", "1"])


def test_build_flags_override_the_recipes_build_table(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    res = _cli("build", "-c", str(recipe), "-o", str(tmp_path / "default"))
    assert res.exit_code == 0, res.output
    m = read_manifest(tmp_path / "default")
    assert (m.codec.name, m.codec.level) == ("zstd", 1)
    shards = len(m.shards)
    # the flags win over the recipe and over --set, as generate's do
    res = _cli("build", "-c", str(recipe), "-o", str(tmp_path / "raw"), "--codec", "none", "--shard-mb", "1", "--set", "build.codec=zstd")
    assert res.exit_code == 0, res.output
    m = read_manifest(tmp_path / "raw")
    assert m.codec.name == "none" and len(m.shards) > shards
    res = _cli("build", "-c", str(recipe), "-o", str(tmp_path / "lvl"), "--level", "5")
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "lvl").codec.level == 5


def test_build_flags_equal_generate_flags(tmp_path: Path) -> None:
    """`build` of the default recipe with the same flags as `generate` writes the same manifest."""
    causal = str(REPO / "configs" / "causal-users-2026-01-15.toml")
    flags = ["--codec", "none", "--shard-mb", "0.5"]
    a = _cli("generate", "-c", causal, "--graphs", "200", "-o", str(tmp_path / "g"), *flags)
    b = _cli("build", "-c", causal, "--records", "200", "-o", str(tmp_path / "b"), *flags)
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert (tmp_path / "g" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert len(read_manifest(tmp_path / "b").shards) > 1


def test_build_flags_are_checked_and_in_help(tmp_path: Path) -> None:
    res = _cli("build", "-c", str(_recipe(tmp_path)), "-o", str(tmp_path / "x"), "--shard-mb", "-1")
    assert res.exit_code == 2 and "build.shard_mb" in res.output and "-1" in res.output
    res = _cli("build", "-c", str(_recipe(tmp_path)), "-o", str(tmp_path / "x"), "--codec", "lz4")
    assert res.exit_code == 2 and "lz4" in res.output
    assert not (tmp_path / "x").exists()
    text = CliRunner().invoke(main, ["build", "--help"]).output
    assert "--shard-mb" in text and "--codec" in text and "--level" in text


def test_python_build_of_a_recipe_takes_codec_and_shard_mb(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    cachebuild.build(recipe, tmp_path / "py", codec="none", shard_mb=1, workers=1, progress=False)
    cachebuild.build(recipe, tmp_path / "plain", workers=1, progress=False)  # left out: the recipe's
    plain = read_manifest(tmp_path / "plain")
    assert (plain.codec.name, plain.codec.level) == ("zstd", 1)
    m = read_manifest(tmp_path / "py")
    assert m.codec.name == "none" and len(m.shards) > len(plain.shards)


@pytest.mark.parametrize("first", [["--seed", "7"], ["--codec", "none"], ["--level", "4"]])
def test_append_without_seed_or_codec_takes_the_caches(tmp_path: Path, first: list[str]) -> None:
    out = str(tmp_path / "c")
    res = _cli("generate", "--graphs", "100", "-o", out, *first)
    assert res.exit_code == 0, res.output
    before = json.loads((tmp_path / "c" / "manifest.json").read_text())
    res = _cli("generate", "--graphs", "50", "-o", out, "--append")
    assert res.exit_code == 0, res.output
    after = read_manifest(tmp_path / "c")
    assert after.records == 150 and after.seed == before["seed"] and after.codec.to_dict() == before["codec"]
    bare = tmp_path / "bare.toml"  # no seed, no [build]: `build --append` takes the cache's too
    bare.write_text('kind = "causal"\n')
    res = _cli("build", "-c", str(bare), "--records", "50", "-o", out, "--append")
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "c").records == 200


def test_append_with_another_seed_or_codec_given_is_refused(tmp_path: Path) -> None:
    out = str(tmp_path / "c")
    assert _cli("generate", "--graphs", "100", "-o", out, "--seed", "7", "--codec", "none").exit_code == 0
    for flags, named in ((["--seed", "0"], "seed: cache 7, this build 0"), (["--codec", "zstd"], "codec.name: cache 'none', this build 'zstd'")):
        res = _cli("generate", "--graphs", "50", "-o", out, "--append", *flags)
        assert res.exit_code == 4 and named in res.output, res.output
    assert read_manifest(tmp_path / "c").records == 100


def test_python_append_takes_the_caches_seed_and_codec(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    cachebuild.build(recipe, tmp_path / "c", codec="none", seed=9, workers=1, progress=False)
    doc = tmp_path / "bare.toml"
    doc.write_text(RECIPE.replace("seed = 4\n", "").split("[build]")[0])  # no seed, no [build]: the cache's
    cachebuild.build(doc, tmp_path / "c", records=30, append=True, workers=1, progress=False)
    m = read_manifest(tmp_path / "c")
    assert (m.records, m.seed, m.codec.name) == (330, 9, "none")
