"""The command line as a user meets it: builds, reruns, refusals, bad input, kill -9 and resume."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from killed_group import kill_group

from cachebuild.builder.markers import file_sha256
from cachebuild.cli import main
from cachebuild.format import read_manifest
from cachebuild.tools.verify import verify_cache

CLI = [sys.executable, "-m", "cachebuild.cli"]


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir())}


def _run(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "c"
    r = _run(["generate", "--graphs", "600", "--out", str(out), "--shard-mb", "4", "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    return out


def test_generate_prints_summary_and_verifies(small_cache):
    m = read_manifest(small_cache)
    assert m.records == 600 and len(m.shards) >= 2 and m.kind == "causal"
    r = _run(["verify", str(small_cache), "-q"])
    assert r.exit_code == 0 and "600 records decoded" in r.output
    r = _run(["inspect", str(small_cache)])
    assert r.exit_code == 0 and "delta" in r.output and "ratio" in r.output
    assert "recipe:" in r.output and 'graph.family = "' in r.output and "samples.base = 64" in r.output


def test_same_bytes_with_two_workers(small_cache, tmp_path):
    r = _run(["generate", "--graphs", "600", "--out", str(tmp_path / "w2"), "--shard-mb", "4", "--workers", "2", "-q"])
    assert r.exit_code == 0, r.output
    assert _hashes(tmp_path / "w2") == _hashes(small_cache)


def test_rerun_and_refusal(small_cache):
    r = _run(["generate", "--graphs", "600", "--out", str(small_cache), "--shard-mb", "4", "-q"])
    assert r.exit_code == 0 and "nothing to do" in r.output
    r = CliRunner().invoke(main, ["generate", "--graphs", "600", "--out", str(small_cache), "--shard-mb", "4", "--seed", "9", "-q"])
    assert r.exit_code == 4 and "--overwrite" in r.output and "Traceback" not in r.output
    assert "seed: cache 0, this build 9" in r.output and len(r.output.strip().splitlines()) == 1
    assert verify_cache(small_cache).ok


def test_refusal_names_the_differing_config_key_and_codec(small_cache):
    args = ["generate", "--graphs", "600", "--out", str(small_cache), "--shard-mb", "4", "-q"]
    r = CliRunner().invoke(main, [*args, "--set", "graph.n_max=12"])
    assert r.exit_code == 4 and "config.graph.n_max: cache 10, this build 12" in r.output
    assert "seed" not in r.output.split("(")[1]  # only what differs
    r = CliRunner().invoke(main, [*args, "--codec", "none"])
    assert r.exit_code == 4 and "codec.name: cache 'zstd', this build 'none'" in r.output
    r = CliRunner().invoke(main, [*args, "--pack", "256"])  # a manifest leaves pack 1 out: not "(not set)" (found in review)
    assert r.exit_code == 4 and "codec.pack: cache 1, this build 256" in r.output, r.output
    assert verify_cache(small_cache).ok


@pytest.mark.parametrize(
    "args, needle, code",
    [
        (["--graphs", "0"], "graphs", 2),
        (["--graphs", "-5"], "graphs", 2),
        (["--edge-prob", "1.5"], "graph.edge_prob", 2),
        (["--set", "mechanism.kind=quantum"], "mechanism.kind", 2),
        (["--set", "noise.kind=pink"], "noise.kind", 2),
        (["--n-min", "12"], "config key 'graph.n_min' has invalid value 12: must be <= graph.n_max (10, the default)", 2),
        (["--n-max", "4"], "config key 'graph.n_max' has invalid value 4: must be >= graph.n_min (5, the default)", 2),
        (["--n-min", "12", "--n-max", "11"], "config keys 'graph.n_min' (12) and 'graph.n_max' (11)", 2),
        (["--set", "graph.n_min=0"], "graph.n_min", 2),
        (["--set", "graph.colour=3"], "graph.colour", 2),
        (["--config", "/nonexistent/recipe.toml"], "does not exist", 2),
        (["--level", "50"], "config key 'build.level' has invalid value 50", 2),  # the recipe's key, as --set writes it
        (["--set", "build.codec=lz4"], "config key 'build.codec' has invalid value 'lz4'", 2),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path, args, needle, code):
    r = CliRunner().invoke(main, ["generate", "--out", str(tmp_path / "c"), "-q", *args])
    assert r.exit_code == code, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert len([line for line in r.output.splitlines() if line.startswith("error:")]) == 1


def test_malformed_config_and_file_as_out(tmp_path, small_cache):
    bad = tmp_path / "bad.toml"
    bad.write_text("[graph\nn_min = 3")
    r = CliRunner().invoke(main, ["generate", "--config", str(bad), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "not valid TOML" in r.output and str(bad) in r.output
    f = tmp_path / "afile"
    f.write_text("x")
    r = CliRunner().invoke(main, ["generate", "--graphs", "10", "--out", str(f), "-q"])
    assert r.exit_code == 5 and "not a folder" in r.output


def test_config_file_and_flags(tmp_path):
    r = _run(["generate", "--config", "configs/causal-linear.toml", "--graphs", "50", "--out", str(tmp_path / "lin"), "--seed", "4", "-q"])
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "lin")
    assert m.seed == 4 and m.config["mechanism"]["kind"] == "linear" and m.records == 50


def test_default_recipe_file_equals_builtin_defaults():
    from cachebuild.causal import parse_causal_config
    from cachebuild.recipes import load_recipe

    recipe = load_recipe("configs/causal-users-2026-01-15.toml")
    assert parse_causal_config(recipe.table) == parse_causal_config({})


def test_generate_help_names_the_default_recipe():
    r = _run(["generate", "--help"])
    assert r.exit_code == 0 and "causal-users-2026-01-15.toml" in r.output


def test_generate_without_config_uses_the_users_2026_01_15_recipe(tmp_path):
    from cachebuild.causal import parse_causal_config
    from cachebuild.recipes import load_recipe

    r = _run(["generate", "--graphs", "20", "--out", str(tmp_path / "d"), "-q"])
    assert r.exit_code == 0, r.output
    want = parse_causal_config(load_recipe("configs/causal-users-2026-01-15.toml").table)
    assert read_manifest(tmp_path / "d").config == want.to_dict()


def test_generate_with_causal_default_toml_builds_the_default_cache(tmp_path):
    """Issue 2's `--config configs/causal-default.toml` gives the bytes of a build without --config."""
    recipe = str(Path(__file__).resolve().parent.parent / "configs" / "causal-default.toml")
    plain, named = tmp_path / "plain", tmp_path / "named"
    for out, extra in ((plain, []), (named, ["--config", recipe])):
        r = _run(["generate", "--graphs", "30", "--seed", "2", "--out", str(out), "-q", "-j", "1", *extra])
        assert r.exit_code == 0, r.output
    assert _hashes(named) == _hashes(plain)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_mid_build_then_resume_is_byte_identical(tmp_path):
    args = ["generate", "--graphs", "12000", "--shard-mb", "24", "--workers", "2", "-q"]
    ref = tmp_path / "ref"
    subprocess.run([*CLI, *args, "--out", str(ref)], check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen([*CLI, *args, "--out", str(out)], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and not list(out.glob("*.done.json")):
            time.sleep(0.02)
    finally:  # the CLI and its worker processes, mid-build; and what loky's resource tracker, killed too, leaves in /dev/shm
        kill_group(proc)
    done_before = len(list(out.glob("*.done.json")))
    assert not (out / "manifest.json").exists() and done_before < len(list(ref.glob("*.tar")))
    r = subprocess.run([*CLI, *args, "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"{done_before} already done" in r.stdout or done_before == 0
    assert _hashes(out) == _hashes(ref)


def test_one_shard_is_singular_and_a_raw_ratio_says_why(tmp_path):
    out = tmp_path / "raw"
    r = _run(["generate", "--graphs", "5", "--out", str(out), "--codec", "none", "--pack", "1", "--workers", "1", "-q"])  # one member per record and field
    assert r.exit_code == 0, r.output
    r = _run(["generate", "--graphs", "5", "--out", str(out), "--codec", "none", "--pack", "1", "--workers", "1"])  # a rerun: nothing to do
    assert "1 shard)" in r.output and "1 shards" not in r.output
    r = _run(["verify", str(out), "-q"])
    assert "1 shard verified" in r.output
    r = _run(["inspect", str(out)])
    assert "in 1 shard (" in r.output and "tar headers and padding" in r.output


@pytest.mark.parametrize("flag, typo, valid", [("--noise", "gausian", "NOISE_CHOICES"), ("--mechanism", "nonlin", "MECHANISMS"), ("--family", "erdos", "FAMILIES")])
def test_choice_flags_come_from_the_library_constants(tmp_path, flag, typo, valid):
    from cachebuild.causal import config

    choices = getattr(config, valid)
    r = CliRunner().invoke(main, ["generate", "--graphs", "10", "--out", str(tmp_path / "c"), flag, typo, "-q"])
    assert r.exit_code == 2 and f"Invalid value for '{flag}': '{typo}' is not one of" in r.output
    assert ", ".join(f"'{c}'" for c in choices) in r.output and not (tmp_path / "c").exists()
    param = next(p for p in main.commands["generate"].params if p.opts[0] == flag)
    assert tuple(param.type.choices) == choices


def test_samples_base_alone_builds_and_a_differing_pair_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["generate", "--graphs", "20", "--out", str(tmp_path / "c"), "-j", "1", "-q", "--set", "samples.base=8"])
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "c")
    assert m.config["samples"]["base"] == m.config["samples"]["per_intervention"] == 8
    r = CliRunner().invoke(main, ["generate", "--graphs", "20", "--out", str(tmp_path / "d"), "-q", "--set", "samples.base=8", "--set", "samples.per_intervention=16"])
    assert r.exit_code == 2 and "error: config keys 'samples.base' (8) and 'samples.per_intervention' (16) differ" in r.output


def test_python_m_cachebuild_is_the_cli():
    """``python -m cachebuild`` runs the same command group as the console script (it said
    "No module named cachebuild.__main__"; found in review)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "cachebuild", "--help"], capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert "generate" in r.stdout and "verify" in r.stdout


def test_generate_into_a_folder_with_another_tools_manifest_is_one_line_exit_3(tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "manifest.json").write_text('{"tool": "something else"}\n')
    for extra in ([], ["--overwrite"]):
        r = CliRunner().invoke(main, ["generate", "--graphs", "20", "--out", str(out), "-q", *extra])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 3 and len(lines) == 1 and f"{out}/manifest.json: not a cachebuild manifest" in lines[0], r.output
    assert [p.name for p in out.iterdir()] == ["manifest.json"]
