"""A folder that holds no cache (a stranger's, or none at all) is exit 3, "missing manifest" (README's exit table),
for every command that needs a cache: ``prune`` and ``generate --append`` said exit 2 where ``verify``,
``inspect``, ``stage`` and ``bench`` say 3."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main


@pytest.mark.parametrize("what", ["stranger", "missing"])
@pytest.mark.parametrize("command", [["verify"], ["prune"], ["generate", "--graphs", "10", "--append", "-q", "--out"]])
def test_a_folder_without_a_cache_is_exit_3(tmp_path: Path, what: str, command: list[str]) -> None:
    folder = tmp_path / "home"
    if what == "stranger":
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, [*command, str(folder)])
    assert r.exit_code == 3, r.output
    assert r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["home", "notes.txt"] if what == "stranger" else [])
