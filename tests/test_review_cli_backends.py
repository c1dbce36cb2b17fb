"""Review: every build command offers the same backends (`build` had threading, `generate` and `mel` did not)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.builder.backends import BACKENDS
from cachebuild.cli import main


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file() and not p.name.startswith(".")}


@pytest.mark.parametrize("command", ["generate", "mel", "build"])
def test_every_build_command_lists_every_backend(command: str) -> None:
    res = CliRunner().invoke(main, [command, "--help"])
    assert res.exit_code == 0
    assert f"[{'|'.join(BACKENDS)}]" in res.output, res.output


@pytest.mark.parametrize("args", [["generate", "--graphs", "40", "--shard-mb", "0.3"], ["mel", "--synthetic", "6", "--shard-mb", "0.3"]])
def test_threading_builds_the_same_bytes_from_generate_and_mel(tmp_path: Path, args: list[str]) -> None:
    runner = CliRunner()
    for backend in ("loky", "threading"):
        res = runner.invoke(main, [*args, "-o", str(tmp_path / backend), "-q", "-j", "2", "--backend", backend])
        assert res.exit_code == 0, res.output
    assert _hashes(tmp_path / "loky") == _hashes(tmp_path / "threading")
    assert len(_hashes(tmp_path / "loky")) > 3


@pytest.mark.parametrize("command", ["generate", "mel", "build"])
def test_workers_help_says_what_it_means_on_a_cluster(command: str) -> None:
    """Audit of issue 6: `-j` said "parallel worker processes" only, but a build on a running Dask cluster
    (`--scheduler`) sends every shard to it and the cluster's threads decide; on Ray it caps the shards at a time."""
    res = CliRunner(env={"COLUMNS": "400"}).invoke(main, [command, "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "not used with --scheduler" in text and "--backend ray: shards at a time" in text, res.output
