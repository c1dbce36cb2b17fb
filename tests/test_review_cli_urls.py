"""Found in review: the local-folder commands given a URL (the loader and the builders take URLs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main


@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["stage"], ["bench"], ["prune"]])
def test_a_remote_url_is_refused_naming_it_and_the_way_out(command: list[str]) -> None:
    res = CliRunner().invoke(main, [*command, "http://127.0.0.1:9/cache"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output  # was: "no cache manifest at http:/127.0.0.1:9/..." (exit 3)
    assert "http://127.0.0.1:9/cache" in lines[0] and "local folder" in lines[0], lines[0]


def test_a_file_url_reads_the_local_folder(tmp_path: Path) -> None:
    out = tmp_path / "c"
    assert CliRunner().invoke(main, ["generate", "--graphs", "20", "--out", f"file://{out}", "-q", "-j", "1"]).exit_code == 0
    for command in (["verify", "-q"], ["inspect"]):
        res = CliRunner().invoke(main, [command[0], f"file://{out}", *command[1:]])
        assert res.exit_code == 0, res.output


def test_stage_and_unstage_take_a_file_url_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``stage SRC file:///x`` made a folder named ``file:`` in the current folder (click.Path)."""
    monkeypatch.chdir(tmp_path)
    src, dst = tmp_path / "c", tmp_path / "staged"
    assert CliRunner().invoke(main, ["generate", "--graphs", "20", "--out", str(src), "-q", "-j", "1"]).exit_code == 0
    res = CliRunner().invoke(main, ["stage", str(src), f"file://{dst}", "-q"])
    assert res.exit_code == 0 and (dst / "manifest.json").is_file() and not (tmp_path / "file:").exists(), res.output
    assert CliRunner().invoke(main, ["unstage", f"file://{dst}"]).exit_code == 0 and not dst.exists()
    res = CliRunner().invoke(main, ["stage", str(src), "s3://bucket/x"])
    assert res.exit_code == 2 and "s3://bucket/x is a URL" in res.output, res.output


def test_an_unknown_top_level_key_lists_the_build_table_too(tmp_path: Path) -> None:
    """``--set shard_mb=4`` should point at ``build.shard_mb``: the list of known keys left ``build`` out."""
    res = CliRunner().invoke(main, ["generate", "--graphs", "10", "--out", str(tmp_path / "c"), "--set", "shard_mb=4", "-q"])
    assert res.exit_code == 2 and "unknown config key 'shard_mb'" in res.output and "build" in res.output.split("(known")[1], res.output
