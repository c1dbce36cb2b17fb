"""Review of the builder's safety promises (2026-11-24): the defects found by breaking them as users would.

Full disks are real tmpfs mounts (skipped with the reason when this process may not mount) or a file
size limit (``RLIMIT_FSIZE``, any Linux); every other case runs on the test's own folders.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.builder.markers import STAGING_DIR, file_sha256
from cachebuild.builder.output import LocalOutput
from cachebuild.builder.overwrite import swap_steps
from cachebuild.builder.prune import prune_cache
from cachebuild.errors import ManifestError, OutputError
from cachebuild.tools.stage import STAMP_NAME, stage_cache
from cachebuild.tools.verify import verify_cache
from conftest import build_toy

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "cachebuild.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
OLD, NEW = {"seed": 0, "records": 300}, {"seed": 1, "records": 200}


def _files(root: Path) -> dict[str, str]:
    """Every file of the cache folder by sha256 (the build lock aside)."""
    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file() and p.name != LOCK_NAME}


def _mount(tmp_path: Path, options: str) -> Iterator[Path]:
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs."""
    yield from _mount(tmp_path, "size=4m")


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs that holds at most 12 files and folders (then ENOSPC), remounted larger by the test."""
    yield from _mount(tmp_path, "size=16m,nr_inodes=12")


def _fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    with open(disk / "ballast", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


# -- the build lock on a full disk: prune (what frees space) and a rerun used to die with a traceback
def test_prune_and_a_rerun_run_on_a_full_disk(small_disk: Path) -> None:
    root = small_disk / "c"
    build_toy(root, **OLD)
    before = _files(root)
    _fill(small_disk)
    assert prune_cache(root).removed == []  # was: OSError ENOSPC from writing the lock's holder record
    assert build_toy(root, **OLD).already_complete
    assert _files(root) == before and verify_cache(root).ok


def _no_file_growth() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))  # any write past 0 bytes: EFBIG


def test_cli_prune_needs_no_space_for_the_build_lock(tmp_path: Path) -> None:
    root = tmp_path / "c"
    build_toy(root, **OLD)
    r = subprocess.run([*CLI, "prune", str(root)], capture_output=True, text=True, env=ENV, preexec_fn=_no_file_growth, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert verify_cache(root).ok


# -- a stream starting a pass while an --overwrite is swapped in: the reader's line, not a bare FileNotFoundError
def test_a_stream_starting_a_pass_mid_swap_says_so(tmp_path: Path) -> None:
    from loaders import ShardStream

    old, new, root = tmp_path / "old", tmp_path / "new", tmp_path / "c"
    build_toy(old, **OLD)
    build_toy(new, **NEW)
    shutil.copytree(old, root)
    shutil.copytree(new, root / STAGING_DIR)  # the new cache, complete in the staging folder
    stream = ShardStream(root, view="records", batch_size=32, seed=1)
    assert sum(1 for _ in stream) > 0
    steps = swap_steps(LocalOutput(root))
    next(steps), next(steps)  # swap started, old manifest removed: a crash (or the swap running) here
    steps.close()
    with pytest.raises(ManifestError, match="was being swapped in: rerun that build command"):
        next(iter(stream))


# -- `mel --from-wav DIR --out DIR/cache`: the cache folder was read as a label folder on the rerun
def _wav_folder(root: Path) -> None:
    for label in ("LEAK", "NOLEAK"):
        (root / label).mkdir(parents=True)
        x = (np.random.default_rng(len(label)).standard_normal(4096 * 30) * 3000).astype("<i2")
        with wave.open(str(root / label / "a.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(4096)
            w.writeframes(x.tobytes())


def test_a_mel_cache_inside_its_wav_folder_is_not_read_as_a_label(tmp_path: Path) -> None:
    wav = tmp_path / "wav"
    _wav_folder(wav)
    cmd = [*CLI, "mel", "--from-wav", str(wav), "--out", str(wav / "cache"), "-j", "1", "-q"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert first.returncode == 0, first.stderr
    before = _files(wav / "cache")
    again = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr  # was: exit 4, label2id.cache differs
    assert _files(wav / "cache") == before


# -- a symlink in the cache folder: the swap removes the link, never what it points to
def test_overwrite_removes_a_linked_folder_of_the_old_cache_not_its_target(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    build_toy(root, **OLD)
    elsewhere.mkdir()
    (elsewhere / "keep.json").write_text("{}")
    (root / "generations").symlink_to(elsewhere)  # a name of the cache's own, linked out of it
    build_toy(tmp_path / "new", **NEW)
    summary = build_toy(root, **NEW, overwrite=True)  # was: "Cannot call rmtree on a symbolic link", mid-swap
    assert summary.built == summary.shards and verify_cache(root).ok
    assert _files(root) == _files(tmp_path / "new") and not (root / "generations").exists()
    assert (elsewhere / "keep.json").read_text() == "{}"


def test_an_output_that_is_a_dangling_symlink_is_named_as_such(tmp_path: Path) -> None:
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(OutputError, match=r"is a symbolic link to .*gone, which does not exist"):  # was: "File exists"
        build_toy(link, **OLD)
    assert not (tmp_path / "gone").exists()


# -- stage onto a disk that fills during the copy: the copy's error, not the stamp's, and a clean rerun
def test_stage_onto_a_disk_that_fills_names_the_file_that_failed(tmp_path: Path, few_inodes: Path) -> None:
    src = tmp_path / "c"
    build_toy(src, **OLD)
    dst = few_inodes / "staged"
    with pytest.raises(OutputError, match="disk full") as err:
        stage_cache(src, dst, progress=False, workers=1)
    assert "shard-" in str(err.value) and STAMP_NAME not in str(err.value)  # was: the stamp, written after the failure
    assert not (dst / "manifest.json").exists()
    subprocess.run(["mount", "-o", "remount,nr_inodes=400", str(few_inodes)], check=True)
    assert not stage_cache(src, dst, progress=False).already_staged
    copied = {k: v for k, v in _files(src).items() if not k.endswith(".done.json")}  # (done markers are the builder's, not staged)
    assert verify_cache(dst).ok and copied.items() <= _files(dst).items()


# -- N ranks staging one cache into one folder at start-up: they deleted each other's files and manifest
def test_concurrent_stages_into_one_folder_copy_once_and_all_succeed(tmp_path: Path) -> None:
    src, dst = tmp_path / "c", tmp_path / "shm" / "c"
    build_toy(src, records=1200)
    with ThreadPoolExecutor(4) as pool:  # (flock locks per open folder, so threads contend as processes do)
        results = list(pool.map(lambda _: stage_cache(src, dst, progress=False, workers=2), range(4)))
    assert sum(not r.already_staged for r in results) == 1  # one copied; the others waited and found it current
    assert verify_cache(dst).ok and not [p for p in dst.iterdir() if ".tmp-" in p.name]


# -- a reader on a full disk: the lease file it could not create stopped it reading an intact cache
def test_a_stream_reads_a_cache_on_a_disk_with_no_room_for_its_lease(tmp_path: Path, few_inodes: Path) -> None:
    from loaders import ShardStream

    subprocess.run(["mount", "-o", "remount,nr_inodes=400", str(few_inodes)], check=True)
    root = few_inodes / "c"
    build_toy(root, **OLD)
    shutil.rmtree(root / "generations", ignore_errors=True)  # (never read before: no lease folder yet)
    for i in range(400):  # take every free inode
        try:
            (few_inodes / f"f{i}").touch()
        except OSError:
            break
    stream = ShardStream(root, view="records", batch_size=32, seed=1)  # was: ManifestError "cannot create the lease"
    assert sum(len(b["ident"]) for b in stream) >= OLD["records"]


# -- --append onto a manifest whose numbering points back into its own shards: it replaced them
@pytest.mark.parametrize("key, value", [("next_shard", 0), ("next_record", 0), ("next_shard", "9")])
def test_append_refuses_numbering_that_would_replace_listed_shards(tmp_path: Path, key: str, value: object) -> None:
    from cachebuild import build
    from cachebuild.testing import ToySource

    def grow(root: Path) -> object:
        return build(ToySource(), root, records=100, seed=0, shard_mb=0.02, progress=False, workers=1, append=True)

    root = tmp_path / "c"
    build_toy(root, **OLD)
    grow(root)
    doc = json.loads((root / "manifest.json").read_text())
    doc["build"][key] = value  # (a damaged or foreign manifest: verify reads it fine, it is only the builder's)
    (root / "manifest.json").write_text(json.dumps(doc))
    before = _files(root)
    with pytest.raises(ManifestError, match=rf"manifest.json: build.{key} = {value!r}, .*nothing was changed"):
        grow(root)
    assert _files(root) == before and verify_cache(root).ok


# -- a stranger's cache whose lock or lease file is a symbolic link out of it: followed, it was written
def test_a_build_lock_that_is_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    root, victim = tmp_path / "c", tmp_path / "victim.txt"
    build_toy(root, **OLD)
    victim.write_text("the user's own file")
    (root / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OutputError, match="is a symbolic link, not cachebuild's build lock"):
        prune_cache(root)  # was: the victim truncated and overwritten with the holder's pid and host
    assert victim.read_text() == "the user's own file"


def test_a_lease_that_is_a_dangling_link_creates_nothing_outside_the_cache(tmp_path: Path) -> None:
    from loaders import ShardStream

    root, outside = tmp_path / "c", tmp_path / "outside.lock"
    build_toy(root, **OLD)
    (root / "generations").mkdir(exist_ok=True)
    (root / "generations" / "gen-00000.lock").unlink(missing_ok=True)
    (root / "generations" / "gen-00000.lock").symlink_to(outside)
    with pytest.raises(ManifestError, match="is a symbolic link, not a lease file"):
        ShardStream(root, view="records", batch_size=32)  # was: created the link's target, outside the cache
    assert not outside.exists()


def test_a_link_at_a_temporary_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    root, victim = tmp_path / "c", tmp_path / "victim.txt"
    build_toy(root, **OLD)  # (workers=1: shards are written by this process, under its pid)
    before = _files(root)
    (root / "shard-00001.tar").unlink()  # a cache that lost a file: the rerun rebuilds it
    victim.write_text("the user's own file")
    for name in ("shard-00001.tar", "shard-00001.idx.npy", "build.json"):
        (root / f"{name}.tmp-{os.getpid()}").symlink_to(victim)  # planted where the writers put their temporaries
    summary = build_toy(root, **OLD)
    assert summary.built == 1 and victim.read_text() == "the user's own file"  # was: the shard's bytes written into it
    assert not (root / "shard-00001.tar").is_symlink() and _files(root) == before and verify_cache(root).ok


@pytest.mark.parametrize("folder", ["generations", STAGING_DIR])
def test_a_cache_folder_that_is_a_link_out_of_the_cache_is_refused(tmp_path: Path, folder: str) -> None:
    from loaders import ShardStream

    root, outside = tmp_path / "c", tmp_path / "outside"
    build_toy(root, **OLD)
    shutil.rmtree(root / folder, ignore_errors=True)
    outside.mkdir()
    (root / folder).symlink_to(outside)
    if folder == "generations":  # was: the reader made its lease file in the link's target
        with pytest.raises(ManifestError, match="generations is a symbolic link"):
            ShardStream(root, view="records", batch_size=32)
        with pytest.raises(ManifestError, match="generations is a symbolic link"):
            build(root, append=True)
    else:  # was: the staged build written into the link's target
        with pytest.raises(OutputError, match="overwrite is a symbolic link"):
            build_toy(root, **NEW, overwrite=True)
    assert list(outside.iterdir()) == [] and verify_cache(root).ok


def build(root: Path, **kw: object) -> object:
    from cachebuild import build as build_api
    from cachebuild.testing import ToySource

    return build_api(ToySource(), root, records=100, seed=0, shard_mb=0.02, progress=False, workers=1, **kw)


# -- a folder of the user's named shard-* in the cache folder: prune died on it, the swap deleted it
def test_prune_and_the_swap_keep_a_users_folder_named_like_a_shard(tmp_path: Path) -> None:
    root = tmp_path / "c"
    build_toy(root, **OLD)
    (root / "shard-notes").mkdir()
    (root / "shard-notes" / "readme.txt").write_text("mine")
    prune_cache(root)  # was: IsADirectoryError (a traceback from `cachebuild prune`)
    build_toy(root, **NEW, overwrite=True)  # was: the swap's rmtree of every shard-* name not in the new cache
    assert (root / "shard-notes" / "readme.txt").read_text() == "mine" and verify_cache(root).ok
