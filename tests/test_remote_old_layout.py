"""The remote cache's old per-URL local folders (``<cache_dir>/<16 hex>/``) are removed when a stream
opens its local cache, and nothing that merely looks like one is touched (real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from cachebuild.format import read_manifest
from loader_fixtures import build_causal
from loaders import ShardStream
from loaders.old_layout import IDLE_S, OldLayoutWarning
from loaders.remote import RemoteOptions
from remote_fixtures import serve_folder

OLD = time.time() - 2 * IDLE_S


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory) -> Path:
    return build_causal(tmp_path_factory.mktemp("oldlayout") / "cache", graphs=60, shard_mb=0.5)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _plant(folder: Path, files: dict[str, bytes], age: float = OLD) -> Path:
    """A folder holding ``files`` (name -> bytes), every mtime set to ``age``."""
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (age, age))
    os.utime(folder, (age, age))
    return folder


def _old_files(cache: Path, first_layout: bool = False) -> dict[str, bytes]:
    """What the old fetcher left in its per-URL folder: ``.lock``, a shard and its index under their
    local names, and the temp of a download whose process was killed."""
    e = read_manifest(cache).shards[0]
    local = (lambda name, sha: name) if first_layout else (lambda name, sha: f"{sha[:16]}-{name}")
    return {
        ".lock": b"",
        local(e.name, e.sha256): (cache / e.name).read_bytes(),
        local(e.index, e.index_sha256): (cache / e.index).read_bytes(),
        f".part-{e.bytes}-{_dead_pid()}-140000000000-{local(e.name, e.sha256)}": b"\0" * 1000,
    }


def _tree(folder: Path) -> dict[str, tuple[str, bytes | str]]:
    """Everything under ``folder`` (links not followed): kind and content or target."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else ("dir", b"") if p.is_dir() else ("file", p.read_bytes())
    return out


def test_old_folders_are_removed_and_look_alikes_survive(small_cache, tmp_path):
    base = tmp_path / "local"
    base.mkdir()
    outside = tmp_path / "outside"
    with serve_folder(small_cache) as (url, _server):
        old_name = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]  # the old code's folder for this URL
        old = [
            _plant(base / old_name, _old_files(small_cache)),
            _plant(base / "fedcba9876543210", _old_files(small_cache, first_layout=True)),  # the first layout: bare names
            _plant(base / "00000000000000aa", {}),  # made, never fetched into
        ]
        files = _old_files(small_cache)
        _plant(outside, files)
        survivors = [
            base / "0123456789ABCDEF",  # not lowercase hex
            base / "0123456789abcde",  # 15 digits
            base / "0123456789abcdef0",  # 17 digits
            base / "1111111111111111",  # one file the old code never wrote
            base / "2222222222222222",  # a subfolder
            base / "3333333333333333",  # a link among the files
            base / "4444444444444444",  # used recently
            base / "5555555555555555",  # a download in flight (this process)
            base / "6666666666666666",  # a .lock with something in it
        ]
        for folder in survivors[:3]:
            _plant(folder, files)
        _plant(survivors[3], {**files, "notes.txt": b"mine"})
        _plant(survivors[4], files)
        (survivors[4] / "sub").mkdir()
        _plant(survivors[5], files)
        (survivors[5] / next(n for n in files if n.endswith(".tar") and not n.startswith("."))).unlink()
        os.symlink(outside / next(n for n in files if n.endswith(".tar") and not n.startswith(".")), survivors[5] / "aaaaaaaaaaaaaaaa-shard-00009.tar")
        _plant(survivors[6], files, age=time.time())
        _plant(survivors[7], {**files, f".part-10-{os.getpid()}-1-aaaaaaaaaaaaaaaa-shard-00001.tar": b"x"})
        _plant(survivors[8], {**files, ".lock": b"{}"})
        (base / "7777777777777777").symlink_to(outside, target_is_directory=True)  # a link to an old-looking folder
        (base / "8888888888888888").write_bytes(b"a file, not a folder")
        survivors += [base / "7777777777777777", base / "8888888888888888"]
        for folder in survivors[4:6]:
            os.utime(folder, (OLD, OLD))
        before = {p.name: _tree(p) if p.is_dir() and not p.is_symlink() else None for p in survivors}
        outside_before = _tree(outside)

        opts = RemoteOptions(cache_dir=str(base), timeout_s=5.0)
        with pytest.warns(OldLayoutWarning) as said:
            first = next(iter(ShardStream(url, view="graphs", batch_size=8, seed=0, remote=opts)))
        assert len(said) == 1
        text = str(said[0].message)
        assert "removed 3 local folder(s) of the old per-URL layout" in text and all(p.name in text for p in old), text
        assert first["adj"].shape[0] == 8  # the stream reads on, from <cache_dir>/shards
        assert not any(p.exists() for p in old)
        assert all(p.exists() or p.is_symlink() for p in survivors)
        assert {p.name: _tree(p) if p.is_dir() and not p.is_symlink() else None for p in survivors} == before
        assert _tree(outside) == outside_before and (base / "7777777777777777").is_symlink()
        assert sorted(p.name for p in base.iterdir()) == sorted(["shards", *(p.name for p in survivors)])

        again = ShardStream(url, view="graphs", batch_size=8, seed=0, remote=opts)
        next(iter(again))  # said once: no second warning (pytest's filterwarnings=error would raise it)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_another_users_old_folder_is_left(small_cache, tmp_path):
    base = tmp_path / "local"
    base.mkdir()
    theirs = _plant(base / "9999999999999999", _old_files(small_cache))
    os.chown(theirs, 65534, 65534)
    mine = _plant(base / "aaaaaaaaaaaaaaab", _old_files(small_cache))
    os.chown(mine / ".lock", 65534, 65534)  # one file of another user: not certainly ours either
    os.utime(mine, (OLD, OLD))
    with serve_folder(small_cache) as (url, _server):
        next(iter(ShardStream(url, view="graphs", batch_size=8, seed=0, remote=RemoteOptions(cache_dir=str(base), timeout_s=5.0))))
    assert len(list(theirs.iterdir())) == 4 and len(list(mine.iterdir())) == 4
