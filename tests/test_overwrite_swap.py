"""``--overwrite`` builds the new cache in ``<cache>/.overwrite`` and swaps it in only when complete:
the old cache stays complete and readable through a failed, killed or disk-full build, and a rerun
after a crash at any step (staged build or swap) finishes with the bytes of an uninterrupted build."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.builder.markers import STAGING_DIR, file_sha256
from cachebuild.builder.output import LocalOutput
from cachebuild.builder.overwrite import SWAP_RECORD, swap_steps
from cachebuild.errors import CacheMismatchError, SourceError
from cachebuild.format import read_manifest
from cachebuild.testing import ToySource
from contract_sources import FailFrom
from cachebuild.tools.verify import verify_cache
from conftest import build_toy
from test_distributed_build import s3_server  # noqa: F401  (the moto S3 server fixture)

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "cachebuild.cli"]
OLD, NEW = {"seed": 0, "records": 900}, {"seed": 1, "records": 600}  # the old cache has more shards than the new one


def _files(root: Path) -> dict[str, str]:
    """Every file of the cache folder by sha256 (the staging folder aside, and the lock a killed build leaves)."""
    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file() and p.name != LOCK_NAME}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """The old cache, and the new one built into an empty folder (the reference bytes)."""
    base = tmp_path_factory.mktemp("swap")
    build_toy(base / "old", **OLD)
    build_toy(base / "new", **NEW)
    return {"old": base / "old", "new": base / "new"}


# `build(...)` is given pack=1: the layout of build_toy's Codec(), so both name the same build
def test_a_build_failing_at_a_later_shard_keeps_the_old_cache_and_its_staged_shards(tmp_path, made):
    from cachebuild import build

    root = tmp_path / "c"
    shutil.copytree(made["old"], root)
    before = _files(root)
    with pytest.raises(SourceError, match="shard 3"):
        build(FailFrom(ToySource(), 3), root, records=NEW["records"], seed=NEW["seed"], shard_mb=20_000 / 2**20, workers=1, overwrite=True, progress=False, pack=1)
    assert _files(root) == before and verify_cache(root).ok  # the old cache: complete, readable, not a byte changed
    staged = root / STAGING_DIR
    assert sorted(p.name for p in staged.glob("*.done.json")) == [f"shard-0000{i}.done.json" for i in range(3)]

    again = build_toy(root, **OLD)  # the old command: its cache is complete; the staged work is kept and named
    assert again.already_complete and staged.is_dir()
    assert any("unfinished --overwrite build is staged" in line and "(3 of 14 shards done)" in line for line in again.lines())
    with pytest.raises(CacheMismatchError, match=r"pass --overwrite .*unfinished --overwrite build is staged"):
        build_toy(root, **NEW)  # the new recipe without --overwrite: refused, pointing at its staged build

    resumed = build_toy(root, **NEW, overwrite=True)
    assert (resumed.skipped, resumed.built) == (3, 11)
    assert resumed.lines()[-1] == f"note: --overwrite: built in {staged}, then swapped in for the cache of another recipe"
    assert _files(root) == _files(made["new"]) and not staged.exists()
    assert verify_cache(root).ok and read_manifest(root).seed == NEW["seed"]


def test_a_source_failing_in_its_first_shard_leaves_no_staging_folder(tmp_path, made):
    from cachebuild import build

    root = tmp_path / "c"
    shutil.copytree(made["old"], root)
    before = _files(root)
    with pytest.raises(SourceError, match="shard 0"):
        build(FailFrom(ToySource(), 0), root, records=NEW["records"], seed=NEW["seed"], shard_mb=20_000 / 2**20, workers=1, overwrite=True, progress=False, pack=1)
    assert _files(root) == before and sorted(p.name for p in root.iterdir()) == sorted(before)


KILLED_BUILD = """
import signal, sys
# a Ctrl-C at a terminal: Python's own SIGINT handler, even where the test runs in a background job
# without job control (its shell sets SIGINT to ignored, and children inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
from cachebuild import build
from cachebuild.testing import ToySource
from contract_sources import Slow
build(Slow(ToySource(), pause=0.6), sys.argv[1], records=600, seed=1, shard_mb=20_000 / 2**20, workers=1, overwrite=True, progress=False, pack=1)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_a_killed_staged_build_keeps_the_old_cache_and_the_rerun_is_byte_identical(tmp_path, made, sig):
    root = tmp_path / "c"
    shutil.copytree(made["old"], root)
    before = _files(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(root)], env=env, start_new_session=True)
    staged = root / STAGING_DIR
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and len(list(staged.glob("*.done.json"))) < 2:
        time.sleep(0.02)
    assert verify_cache(root).ok  # while the new cache is being built, the old one reads as before
    # checked after verify, which must not outlast the build (0.6 s a shard leaves it ~7 s)
    assert proc.poll() is None, f"the build ended before it could be killed (rc {proc.returncode})"
    os.killpg(proc.pid, sig)
    assert proc.wait(timeout=60) != 0
    assert _files(root) == before and verify_cache(root).ok
    done = len(list(staged.glob("*.done.json")))
    assert 2 <= done < 14 and not (staged / "manifest.json").exists()

    resumed = build_toy(root, **NEW, overwrite=True)
    assert resumed.skipped == done and resumed.built == 14 - done
    assert _files(root) == _files(made["new"]) and not staged.exists() and verify_cache(root).ok


def _staged_complete(root: Path, made: dict[str, Path]) -> None:
    """``root``: the old cache, with the new one complete in its staging folder (what a staged build leaves
    when it is killed just after writing its manifest: the files of the new cache, build record removed)."""
    shutil.copytree(made["old"], root)
    shutil.copytree(made["new"], root / STAGING_DIR)


def _steps(made: dict[str, Path], tmp_path: Path) -> int:
    root = tmp_path / "count"
    _staged_complete(root, made)
    return sum(1 for _ in swap_steps(LocalOutput(root)))


def test_a_swap_interrupted_at_any_step_is_finished_by_the_rerun(tmp_path, made):
    total = _steps(made, tmp_path)
    moves = 3 * 14
    assert total == 1 + 1 + moves + (3 * 20 - 3 * 14) + 1 + 1  # start, old manifest, moves, old extra files, manifest, staging
    for k in sorted({0, 1, 2, 3, 2 + moves // 2, 2 + moves, 2 + moves + 1, total - 2, total - 1, total}):
        root = tmp_path / f"k{k}"
        _staged_complete(root, made)
        steps = swap_steps(LocalOutput(root))
        for _ in range(k):
            next(steps)
        steps.close()  # the process dies here: no code of the swap runs past this step
        if k <= 1:
            assert verify_cache(root).ok and read_manifest(root).seed == OLD["seed"]  # not yet started: the old cache is whole
        summary = build_toy(root, **NEW, overwrite=True)
        assert summary.built == 0, k
        assert _files(root) == _files(made["new"]), k
        assert not (root / STAGING_DIR).exists() and verify_cache(root).ok, k


def test_the_old_command_during_an_interrupted_swap_finishes_it_then_refuses(tmp_path, made):
    root = tmp_path / "c"
    _staged_complete(root, made)
    steps = swap_steps(LocalOutput(root))
    for _ in range(10):
        next(steps)
    steps.close()
    assert (root / STAGING_DIR / SWAP_RECORD).exists() and not (root / "manifest.json").exists()
    r = subprocess.run([*CLI, "verify", str(root)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 3 and "was being swapped in: rerun that build command" in r.stderr, r.stderr
    with pytest.raises(CacheMismatchError, match="seed: cache 1, this build 0"):
        build_toy(root, **OLD)  # the swap had begun: it goes forward, and the old recipe is now another one
    assert _files(root) == _files(made["new"]) and verify_cache(root).ok


def test_an_append_during_an_interrupted_swap_finishes_it_and_grows_the_new_cache(tmp_path, made):
    root = tmp_path / "c"
    _staged_complete(root, made)
    steps = swap_steps(LocalOutput(root))
    for _ in range(2 + 20):  # the old manifest removed, some files moved
        next(steps)
    steps.close()
    grown = build_toy(root, seed=NEW["seed"], records=100, append=True)
    m = read_manifest(root)
    assert grown.generation == 1 and m.records == NEW["records"] + 100 and not (root / STAGING_DIR).exists()
    assert verify_cache(root).ok


def test_overwriting_a_grown_cache_removes_its_generations(tmp_path, made):
    root = tmp_path / "c"
    shutil.copytree(made["old"], root)
    build_toy(root, seed=OLD["seed"], records=100, append=True)
    assert (root / "generations").is_dir()
    build_toy(root, **NEW, overwrite=True)
    assert _files(root) == _files(made["new"]) and sorted(p.name for p in root.iterdir() if p.is_dir()) == []


def test_a_complete_staged_build_waits_for_its_command_and_the_old_one_keeps_its_cache(tmp_path, made):
    root = tmp_path / "c"
    _staged_complete(root, made)
    again = build_toy(root, **OLD)
    assert again.already_complete and any("complete --overwrite build waits" in line for line in again.lines())
    other = build_toy(root, seed=2, records=300, overwrite=True)  # a third recipe replaces the staged one
    assert other.built == other.shards and read_manifest(root).seed == 2 and not (root / STAGING_DIR).exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real 6 MiB tmpfs when we may mount one (root), else skip."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def _generate(out: Path, graphs: int, seed: int, *extra: str) -> subprocess.CompletedProcess:
    args = ["generate", "--graphs", str(graphs), "--seed", str(seed), "--shard-mb", "0.5", "-j", "1", "--out", str(out), "-q", *extra]
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.timeout(180)
def test_a_full_disk_during_the_staged_build_keeps_the_old_cache_and_the_rerun_resumes(small_disk, tmp_path):
    ref = tmp_path / "ref"
    assert _generate(ref, 200, 1).returncode == 0  # the new cache (~4.6 MB), built elsewhere
    root = small_disk / "c"
    assert _generate(root, 10, 0).returncode == 0  # the old cache (~0.2 MB)
    before = _files(root)
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (2 << 20))  # leaves room for one cache, not for both
    r = _generate(root, 200, 1, "--overwrite")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 5 and len(lines) == 1 and "disk full" in lines[0], r.stderr
    assert _files(root) == before and verify_cache(root).ok
    done = len(list((root / STAGING_DIR).glob("*.done.json")))
    assert done >= 1 and not [p for p in (root / STAGING_DIR).iterdir() if ".tmp-" in p.name]

    ballast.unlink()  # space freed: the same command resumes the staged build, then swaps
    r = _generate(root, 200, 1, "--overwrite")
    assert r.returncode == 0 and f"({13 - done} built, {done} already done)" in r.stdout, r.stderr + r.stdout
    assert _files(root) == _files(ref) and not (root / STAGING_DIR).exists()
    assert subprocess.run([*CLI, "verify", str(root), "-q"], capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0


URL = "s3://cachebuild-test/ow"


def _s3_files(fs: Any, prefix: str, into: Path) -> dict[str, str]:
    """The objects directly under ``prefix`` (the staging prefix aside), downloaded, by sha256."""
    fs.invalidate_cache()
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for key in fs.ls(prefix, detail=False):
        name = key.rsplit("/", 1)[-1]
        if name != STAGING_DIR:
            fs.get_file(key, str(into / name))
            out[name] = file_sha256(into / name)
    return out


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_overwrite_into_s3_stages_keeps_the_old_cache_and_resumes(s3_server, tmp_path, made):
    from cachebuild.builder import BuildOptions, build_cache

    fs, opts = s3_server, s3_server.test_options
    build_toy(URL, **OLD, storage_options=opts)
    old = _s3_files(fs, URL, tmp_path / "old")
    assert old == _files(made["old"])
    failing = BuildOptions(out=URL, records=NEW["records"], seed=NEW["seed"], shard_bytes=20_000, workers=1, progress=False, sync=False, overwrite=True, storage_options=opts)
    with pytest.raises(SourceError, match="shard 3"):
        build_cache(FailFrom(ToySource(), 3), failing)
    assert _s3_files(fs, URL, tmp_path / "after") == old  # the old cache, untouched while the new one was staged
    assert sorted(k.rsplit("/", 1)[-1] for k in fs.ls(f"{URL}/{STAGING_DIR}") if k.endswith(".done.json")) == [f"shard-0000{i}.done.json" for i in range(3)]

    resumed = build_toy(URL, **NEW, overwrite=True, storage_options=opts)
    assert (resumed.skipped, resumed.built) == (3, 11)
    assert _s3_files(fs, URL, tmp_path / "new") == _files(made["new"]) and not fs.exists(f"{URL}/{STAGING_DIR}")


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_an_interrupted_swap_into_s3_is_finished_by_the_rerun(s3_server, tmp_path, made):
    from cachebuild.builder.output import RemoteOutput

    fs, opts = s3_server, s3_server.test_options
    for p in sorted(made["old"].iterdir()):
        fs.put_file(str(p), f"{URL}/{p.name}")
    for p in sorted(made["new"].iterdir()):  # the new cache complete in the staging prefix
        fs.put_file(str(p), f"{URL}/{STAGING_DIR}/{p.name}")
    steps = swap_steps(RemoteOutput(URL, opts))
    for _ in range(2 + 21):  # the old manifest removed, half the files moved
        next(steps)
    steps.close()
    fs.invalidate_cache()
    assert not fs.exists(f"{URL}/manifest.json") and fs.exists(f"{URL}/{STAGING_DIR}/{SWAP_RECORD}")
    summary = build_toy(URL, **NEW, overwrite=True, storage_options=opts)
    assert summary.built == 0 and summary.already_complete
    assert _s3_files(fs, URL, tmp_path / "new") == _files(made["new"]) and not fs.exists(f"{URL}/{STAGING_DIR}")
