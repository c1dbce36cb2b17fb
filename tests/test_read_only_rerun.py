"""A rerun on a complete cache in a folder the build may not write is "nothing to do", and writes nothing.

The folder is made read-only for real: ``chmod`` when not root (root ignores
permission bits), a read-only bind mount of the folder onto itself when root
(``EROFS`` binds root too); each variant skips where it cannot run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main

GENERATE = ["generate", "--graphs", "40", "--shard-mb", "0.05", "--seed", "3", "-j", "1", "-q"]


@contextlib.contextmanager
def _read_only(folder: Path, how: str):
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root ignores permission bits")
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) for p in sorted(folder.rglob("*"))}


def _run(args: list[str]):
    return CliRunner().invoke(main, args)


@pytest.fixture(params=["chmod", "mount"])
def how(request) -> str:
    return request.param


def test_rerun_on_a_complete_read_only_cache_is_nothing_to_do(tmp_path, how):
    out = tmp_path / "c"
    r = _run([*GENERATE, "--out", str(out)])
    assert r.exit_code == 0, r.output
    shards = len(list(out.glob("shard-*.tar")))
    assert shards > 1
    before = _snapshot(out)
    with _read_only(out, how):
        assert not os.access(out, os.W_OK)
        r = _run([*GENERATE, "--out", str(out)])
        assert r.exit_code == 0, r.output
        lines = r.output.strip().splitlines()
        assert lines == [f"cache at {out} is already complete (40 graphs, {shards} shards): nothing to do"], r.output
        assert _snapshot(out) == before  # nothing written: no lock file, no marker, no clean-up
        r = _run(["generate", "--graphs", "40", "--shard-mb", "0.05", "--seed", "4", "-q", "--out", str(out)])  # another recipe
        assert r.exit_code == 5 and r.output.strip() == f"error: cannot write {out}: not writable, and the cache in it is not this recipe's complete cache", r.output
        assert _snapshot(out) == before


def test_mel_rerun_on_a_complete_read_only_cache_is_nothing_to_do(tmp_path, how):
    out = tmp_path / "m"
    args = ["mel", "--synthetic", "4", "--out", str(out), "-q", "-j", "1"]
    assert _run(args).exit_code == 0
    before = _snapshot(out)
    with _read_only(out, how):
        r = _run(args)
        assert r.exit_code == 0 and "is already complete (4 files" in r.output and "nothing to do" in r.output, r.output
        assert _snapshot(out) == before


def test_incomplete_read_only_cache_is_one_line(tmp_path, how):
    """A cache that lost a shard (or an empty folder) needs writing: the same one-line refusal as before."""
    out = tmp_path / "c"
    assert _run([*GENERATE, "--out", str(out)]).exit_code == 0
    victim = sorted(out.glob("shard-*.tar"))[1]
    victim.write_bytes(victim.read_bytes()[:-512])  # one block short: the manifest's size check fails
    empty = tmp_path / "empty"
    empty.mkdir()
    before = _snapshot(out)
    with _read_only(out, how):
        r = _run([*GENERATE, "--out", str(out)])
        assert r.exit_code == 5 and r.output.strip() == f"error: cannot write {out}: not writable, and the cache in it is not this recipe's complete cache", r.output
        assert _snapshot(out) == before
    with _read_only(empty, how):
        r = _run([*GENERATE, "--out", str(empty)])
        assert r.exit_code == 5 and r.output.strip() == f"error: cannot write {empty}: not writable", r.output
        assert list(empty.iterdir()) == []
