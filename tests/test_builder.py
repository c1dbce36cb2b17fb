"""The builder: determinism across workers, resume, refusals, full disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from cachebuild.builder.markers import BUILD_RECORD, file_sha256
from cachebuild.builder.mismatch import fingerprint_doc_of_manifest
from cachebuild.errors import CacheMismatchError, ConfigError, ManifestError, OutputError
from cachebuild.format import read_manifest
from cachebuild.tools.verify import verify_cache
from conftest import build_toy


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir())}


def test_same_bytes_for_one_or_two_workers(tmp_path):
    build_toy(tmp_path / "a", workers=1)
    build_toy(tmp_path / "b", workers=2)
    a, b = _hashes(tmp_path / "a"), _hashes(tmp_path / "b")
    assert a == b and len(a) > 10


def test_threading_backend_same_bytes(tmp_path, toy_cache):
    build_toy(tmp_path / "t", workers=2, backend="threading")
    assert _hashes(tmp_path / "t") == _hashes(toy_cache)


def test_rerun_on_complete_cache_does_nothing(tmp_path):
    build_toy(tmp_path / "c")
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "c").iterdir()}
    summary = build_toy(tmp_path / "c")
    assert summary.already_complete and "nothing to do" in summary.lines()[0]
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "c").iterdir()}


def test_resume_rebuilds_only_broken_shards_same_bytes(tmp_path, toy_cache):
    root = tmp_path / "c"
    shutil.copytree(toy_cache, root)
    (root / "manifest.json").unlink()  # as if killed before the end
    (root / "shard-00003.tar").write_bytes(b"garbage")  # a shard cut short
    (root / "shard-00005.done.json").unlink()  # a shard finished but not marked
    (root / "shard-00006.tar.tmp-999").write_bytes(b"partial")  # leftover temp file
    summary = build_toy(root)
    assert summary.built == 2 and summary.skipped == summary.shards - 2
    assert _hashes(root) == _hashes(toy_cache)


def test_other_config_refused_then_overwritten(tmp_path):
    build_toy(tmp_path / "c", seed=0)
    with pytest.raises(CacheMismatchError, match="--overwrite") as refused:
        build_toy(tmp_path / "c", seed=1)
    assert "(seed: cache 0, this build 1)" in str(refused.value)
    assert verify_cache(tmp_path / "c").ok  # untouched
    summary = build_toy(tmp_path / "c", seed=1, overwrite=True)
    assert summary.built == summary.shards and read_manifest(tmp_path / "c").seed == 1


def test_unfinished_build_refusal_names_records_and_block_numpy_keys(tmp_path, toy_cache):
    root = tmp_path / "c"
    shutil.copytree(toy_cache, root)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").unlink()  # an unfinished build: only its build record says what it was
    doc = fingerprint_doc_of_manifest(manifest)
    doc.update(records=500, determinism={"block_records": 64, "numpy": "1.0"})
    (root / BUILD_RECORD).write_text(json.dumps({"fingerprint": "0" * 64, "doc": doc}))
    with pytest.raises(CacheMismatchError) as refused:
        build_toy(root)
    msg = str(refused.value)
    assert "records: cache 500, this build 600" in msg and "determinism.numpy: cache '1.0', this build" in msg
    assert "determinism.block_records: cache 64, this build" in msg


def test_bad_outputs(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        build_toy(f)
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    with pytest.raises(OutputError, match="not a cachebuild cache"):
        build_toy(foreign)
    assert (foreign / "thesis.tex").read_text() == "x"
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(OutputError, match="not writable"):
            build_toy(ro / "c")


def test_foreign_folder_is_not_written(tmp_path):
    """A stranger's folder is refused before anything is written there, not even the build lock (its mtime stays)."""
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    os.utime(foreign, ns=(10**18, 10**18))
    with pytest.raises(OutputError, match="not a cachebuild cache"):
        build_toy(foreign)
    assert os.stat(foreign).st_mtime_ns == 10**18 and sorted(os.listdir(foreign)) == ["thesis.tex"]


@pytest.mark.parametrize("bad", [0, -5])
def test_bad_counts(tmp_path, bad):
    with pytest.raises(ConfigError, match="records"):
        build_toy(tmp_path / "c", records=bad)


@pytest.fixture
def small_disk(tmp_path):
    """A real 192 KiB tmpfs when we may mount one (root), else skip."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_is_a_clear_error_and_keeps_existing_cache(small_disk):
    build_toy(small_disk / "small", records=40)
    assert verify_cache(small_disk / "small").ok
    with pytest.raises(OutputError, match="disk full"):
        build_toy(small_disk / "big", records=5000)
    assert verify_cache(small_disk / "small").ok
    assert not (small_disk / "big" / "manifest.json").exists()
    assert not [p for p in (small_disk / "big").iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "not valid JSON.*nothing was changed: if this folder is a cachebuild cache"),
        ('{"files": ["a.wav"]}\n', "not a cachebuild manifest.*nothing was changed: if this folder is a cachebuild cache"),
        ('{"format": "cachebuild-shards", "version": 99}\n', "format version 99 is not supported.*nothing was changed: it was written by another version of cachebuild"),
    ],
    ids=["not-json", "another-tool", "newer-version"],
)
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_unreadable_manifest_is_refused_not_overwritten(tmp_path, text, words, overwrite):
    """A folder is a cache by its manifest.json; one that does not parse is not taken for an empty folder."""
    out = tmp_path / "c"
    out.mkdir()
    (out / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match=words):
        build_toy(out, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["manifest.json"] and (out / "manifest.json").read_text() == text


def test_damaged_manifest_of_a_cache_keeps_its_shards_and_the_hint_rebuilds_it(tmp_path, toy_cache):
    """A truncated manifest is refused with every shard kept; deleting it and rerunning (the hint) gives the cache back."""
    out = tmp_path / "c"
    shutil.copytree(toy_cache, out)
    before = _hashes(out)
    (out / "manifest.json").write_bytes((toy_cache / "manifest.json").read_bytes()[:100])
    with pytest.raises(ManifestError, match="delete manifest.json and rerun the command that built it"):
        build_toy(out)
    assert {k: v for k, v in _hashes(out).items() if k != "manifest.json"} == {k: v for k, v in before.items() if k != "manifest.json"}
    (out / "manifest.json").unlink()
    build_toy(out)
    assert _hashes(out) == before


@pytest.mark.parametrize("command", [["generate", "--graphs", "10"], ["mel", "--synthetic", "4"]])
def test_an_empty_out_is_refused(tmp_path, monkeypatch, command):
    """``--out "$CACHE"`` with CACHE unset: one line, exit 2, nothing written in the working folder (it was taken as ``.``)."""
    from click.testing import CliRunner

    from cachebuild.cli import main

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, [*command, "--out", "", "-q"])
    assert r.exit_code == 2 and "--out is empty" in r.output, r.output
    assert os.listdir(tmp_path) == []
