"""Staging a cache into RAM: copy + verify, manifest last, idempotent, refusals, interruptions, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import build_toy

import cachebuild.tools.stage as stage_mod
import cachebuild.tools.stage_space as stage_space
from cachebuild.errors import ConfigError, ManifestError, OutputError, ShardCorruptError
from cachebuild.format.manifest import MANIFEST_NAME, read_manifest
from cachebuild.tools.stage import STAMP_NAME, default_dst, stage_cache, unstage_cache
from cachebuild.cli.stage import stage_command, unstage_command
from cachebuild.tools.verify import verify_cache


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """A toy cache the tests only read (14 shards)."""
    out = tmp_path_factory.mktemp("stage-src") / "causal"
    build_toy(out)
    return out


def _tmp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_stage_copies_verifies_and_writes_manifest_last(src, tmp_path):
    dst = tmp_path / "shm" / "causal"
    result = stage_cache(src, dst, progress=False)
    manifest = read_manifest(src)
    assert result.files == 2 * len(manifest.shards) and result.copied_files == result.files
    assert result.bytes_copied == result.bytes_total > 0 and result.manifest_written
    assert (dst / MANIFEST_NAME).read_bytes() == (src / MANIFEST_NAME).read_bytes()
    assert verify_cache(dst).ok
    assert not _tmp_files(dst) and not list(dst.glob("*.done.json"))
    assert f"pass to the loader: {dst}" in result.lines()


def test_restage_unchanged_copies_nothing(src, tmp_path):
    dst = tmp_path / "causal"
    stage_cache(src, dst, progress=False)
    again = stage_cache(src, dst, progress=False)
    assert again.bytes_copied == 0 and again.copied_files == 0 and again.already_staged
    assert again.lines()[0].startswith("already staged, nothing copied")


def test_restage_recopies_only_a_damaged_copy(src, tmp_path):
    dst = tmp_path / "causal"
    stage_cache(src, dst, progress=False)
    victim = dst / "shard-00002.tar"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    again = stage_cache(src, dst, progress=False)
    assert again.copied_files == 1 and again.bytes_copied == victim.stat().st_size
    assert verify_cache(dst, decode=False).ok


def test_default_dst_is_under_dev_shm(monkeypatch, src, tmp_path):
    assert default_dst("some/where/causal") == Path("/dev/shm/cachebuild/causal")
    monkeypatch.setattr(stage_mod, "DEFAULT_ROOT", tmp_path / "shm")
    result = stage_cache(src, progress=False)
    assert result.dst == tmp_path / "shm" / "causal" and (result.dst / MANIFEST_NAME).exists()
    unstage_cache(result.dst)
    assert not (tmp_path / "shm").exists()


def test_free_space_refusal_monkeypatched(monkeypatch, src, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(stage_space.shutil, "disk_usage", lambda p: usage(100_000, 90_000, 10_000))
    dst = tmp_path / "small" / "causal"
    with pytest.raises(OutputError) as info:
        stage_cache(src, dst, progress=False)
    msg = str(info.value)
    assert "need" in msg and "10000 bytes" in msg and "available" in msg
    assert "sudo mount -t tmpfs -o size=" in msg and "tmpfs /mnt/cache" in msg
    assert not dst.exists()


def test_free_space_counts_files_already_staged(monkeypatch, src, tmp_path):
    dst = tmp_path / "causal"
    stage_cache(src, dst, progress=False)
    (dst / MANIFEST_NAME).unlink()  # staged data present, manifest missing: only the manifest is left to write
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(stage_space.shutil, "disk_usage", lambda p: usage(100_000, 90_000, 10_000))
    result = stage_cache(src, dst, progress=False)
    assert result.bytes_copied == 0 and result.manifest_written and (dst / MANIFEST_NAME).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_free_space_refusal_real_tmpfs(src, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(OutputError, match=r"need \d+ bytes .* available"):
            stage_cache(src, mnt / "causal", progress=False)
        assert not (mnt / "causal").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_corrupt_source_shard_is_named_and_no_manifest(tmp_path):
    src = tmp_path / "src"
    build_toy(src)
    shard = src / "shard-00003.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    dst = tmp_path / "dst"
    # (the flipped bit lands in a tar header: the structure check names it before anything is copied)
    with pytest.raises(ShardCorruptError, match=r"shard shard-00003\.tar") as info:
        stage_cache(src, dst, progress=False)
    assert "shard-00002" not in str(info.value)
    assert not (dst / MANIFEST_NAME).exists() and not (dst / "shard-00003.tar").exists()
    assert not dst.exists() or not _tmp_files(dst)
    with pytest.raises(ManifestError):
        read_manifest(dst)
    result = CliRunner().invoke(stage_command, [str(src), str(dst), "-q"])
    assert result.exit_code == 3
    assert "error:" in result.output and "shard-00003.tar" in result.output


def test_interrupted_copy_is_never_complete_and_restage_finishes(monkeypatch, src, tmp_path):
    dst = tmp_path / "causal"
    real, calls = stage_mod._copy_file, []

    def failing(s, d, on_bytes, stop):
        calls.append(s.name)
        if len(calls) == 6:
            d.write_bytes(s.read_bytes()[:500])  # a partial temp file, then the "crash"
            raise KeyboardInterrupt
        real(s, d, on_bytes, stop)

    monkeypatch.setattr(stage_mod, "_copy_file", failing)
    with pytest.raises(KeyboardInterrupt):
        stage_cache(src, dst, progress=False, workers=1)
    assert not (dst / MANIFEST_NAME).exists() and not _tmp_files(dst)
    monkeypatch.setattr(stage_mod, "_copy_file", real)
    result = stage_cache(src, dst, progress=False)
    assert 1 <= result.copied_files <= result.files - 5  # verified copies (at least the first five) are kept
    assert verify_cache(dst).ok


_KILLED_STAGER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    import cachebuild.tools.stage as st
    real, calls, lock = st._copy_file, [], threading.Lock()
    def slow(s, d, on_bytes, stop):
        with lock:
            calls.append(s.name)
            n = len(calls)
        if n == 5:
            d.write_bytes(s.read_bytes()[:1000])   # mid-copy of the fifth file ...
            Path(sys.argv[3]).touch()
            time.sleep(120)                        # ... when SIGKILL arrives
        real(s, d, on_bytes, stop)
    st._copy_file = slow
    st.stage_cache(sys.argv[1], sys.argv[2], progress=False, workers=1)
    """
)


@pytest.mark.timeout(60)
def test_sigkill_mid_copy_leaves_no_manifest_and_restage_completes(src, tmp_path):
    dst, ready = tmp_path / "causal", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_STAGER, str(src), str(dst), str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the staging subprocess never reached the fifth file"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"exit code {proc.returncode} (its output: the test's captured stderr)"
    assert (dst / STAMP_NAME).exists() and not (dst / MANIFEST_NAME).exists() and _tmp_files(dst)
    with pytest.raises(ManifestError):
        read_manifest(dst)
    result = stage_cache(src, dst, progress=False)
    assert result.copied_files == result.files - 4 and result.manifest_written
    assert not _tmp_files(dst) and verify_cache(dst).ok


def test_refuses_to_stage_over_other_folders(src, tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a staged copy"):
        stage_cache(src, other, progress=False)
    built = tmp_path / "built"
    build_toy(built, records=50)
    with pytest.raises(OutputError, match="cache built there"):
        stage_cache(src, built, progress=False)
    with pytest.raises(OutputError, match="overlap"):
        stage_cache(src, src / "inner", progress=False)
    assert (other / "keep.txt").read_text() == "mine"


def test_unstage_removes_only_staged_copies(src, tmp_path):
    dst = tmp_path / "causal"
    stage_cache(src, dst, progress=False)
    gone = unstage_cache(dst)
    assert gone.files == 2 + 2 * len(read_manifest(src).shards) and gone.bytes > 0 and not dst.exists()
    assert not unstage_cache(dst).existed
    with pytest.raises(ConfigError, match="not a staged copy"):
        unstage_cache(src)
    assert (src / MANIFEST_NAME).exists()


def test_unstage_removes_the_lease_files_a_loader_made(src, tmp_path):
    """A loader reading the staged copy leaves generations/gen-NNNNN.lock there; unstage removes it (it left
    the folder behind before), and keeps anything else in generations/."""
    from loaders import ShardStream

    dst = tmp_path / "causal"
    stage_cache(src, dst, progress=False)
    stream = ShardStream(dst, view="records", batch_size=8)
    next(iter(stream))
    del stream
    assert [p.name for p in (dst / "generations").iterdir()] == ["gen-00000.lock"]
    assert unstage_cache(dst).files == 3 + 2 * len(read_manifest(src).shards) and not dst.exists()
    stage_cache(src, dst, progress=False)
    (dst / "generations").mkdir()
    (dst / "generations" / "notes.txt").write_text("mine")
    assert unstage_cache(dst).left == ("generations",) and (dst / "generations" / "notes.txt").read_text() == "mine"


def test_cli_stage_unstage_roundtrip(src, tmp_path):
    runner, dst = CliRunner(), tmp_path / "causal"
    first = runner.invoke(stage_command, [str(src), str(dst), "-q"])
    assert first.exit_code == 0, first.output
    assert "sha256 verified" in first.output and f"pass to the loader: {dst}" in first.output
    again = runner.invoke(stage_command, [str(src), str(dst), "-q"])
    assert again.exit_code == 0 and "already staged, nothing copied" in again.output
    gone = runner.invoke(unstage_command, [str(dst)])
    assert gone.exit_code == 0 and "unstaged" in gone.output and not dst.exists()
    assert runner.invoke(unstage_command, [str(dst)]).output.startswith("nothing staged")


def test_cli_errors_have_exit_codes(src, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(stage_command, [str(tmp_path / "nope"), str(tmp_path / "d"), "-q"])
    assert missing.exit_code == 3 and "no cache manifest" in missing.output
    refused = runner.invoke(unstage_command, [str(src)])
    assert refused.exit_code == 2 and "refusing to unstage" in refused.output
    assert "Traceback" not in missing.output + refused.output
