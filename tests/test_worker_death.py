"""A build worker process that dies (the OS killing it for memory, a crash in native code) ends the build in
one line naming what died, exit 1, no traceback, on loky (the default) and on the build's own Dask cluster
(Ray: ``tests/test_ray_build.py``). It was joblib's ``TerminatedWorkerError`` and distributed's
``KilledWorker`` tracebacks. And the loky workers of a build that was killed exit at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachebuild.builder.markers import file_sha256
from cachebuild.format.atomic import is_tmp_name

REPO = Path(__file__).resolve().parent.parent

USER_CODE = """
import os

import numpy as np
from cachebuild import FunctionSource


def _dies(rng, index):
    if index == 300:
        os._exit(3)  # the worker process dies
    return {"x": np.zeros(2, np.float32)}


def dies():
    return FunctionSource.per_record(_dies, {"x": "float32"})
"""


def _build(tmp_path: Path, backend: str) -> subprocess.CompletedProcess:
    user = tmp_path / "user"
    user.mkdir()
    (user / "deathuser.py").write_text(USER_CODE)
    (user / "recipe.toml").write_text('kind = "deathuser:dies"\nrecords = 600\n[build]\nshard_mb = 0.001\n')
    args = [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-o", str(tmp_path / "out"), "-q", "--backend", backend, "-j", "2"]
    return subprocess.run(args, cwd=user, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=200)


@pytest.mark.timeout(240)
def test_a_loky_worker_that_dies_is_one_line(tmp_path: Path) -> None:
    res = _build(tmp_path, "loky")
    assert res.returncode == 1, res.stderr[-4000:]
    lines = res.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("error: a build worker process died while writing shards (exit codes {EXIT(3)})"), res.stderr[-4000:]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_a_dask_task_that_kills_its_workers_is_one_line_naming_the_shard(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    res = _build(tmp_path, "dask")
    assert res.returncode == 1, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the Dask task building shard-00002.tar killed every worker that ran it"), res.stderr[-4000:]
    assert "Traceback" not in res.stderr and "rerun the same command to resume" in last, res.stderr[-4000:]


HELD_CODE = """
import time
from pathlib import Path

import numpy as np
from cachebuild import FunctionSource


def _held(rng, index, hold=""):
    while index and hold and Path(hold).exists():  # the test holds every running shard here (record 0: the build sizes it first)
        time.sleep(0.02)
    return {"x": rng.standard_normal(8).astype(np.float32)}


def make(hold=""):
    return FunctionSource.per_record(_held, {"x": "float32"}, params={"hold": hold}, block_records=10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree (psutil), Linux here")
@pytest.mark.timeout(240)
def test_loky_workers_of_a_killed_build_exit(tmp_path: Path) -> None:
    """``kill -9`` of a build: its loky workers went on writing their shards (published after the build had
    died, its lock gone) and then idled for 5 minutes. Now they exit within a second or two, mid-shard, leaving
    only temporary files; the rerun equals a clean build."""
    import psutil

    user, hold, out = tmp_path / "user", tmp_path / "hold", tmp_path / "out"
    user.mkdir()
    (user / "helduser.py").write_text(HELD_CODE)
    (user / "recipe.toml").write_text(f'kind = "helduser:make"\nrecords = 600\n[params]\nhold = "{hold}"\n[build]\nshard_mb = 0.001\n')
    args = [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-q", "--backend", "loky", "-j", "2", "-o"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    hold.touch()
    build = subprocess.Popen([*args, str(out)], cwd=user, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while build.poll() is None and len([p for p in out.iterdir() if p.name.startswith("shard-")] if out.is_dir() else []) < 2:  # both workers mid-shard
            assert time.monotonic() < deadline
            time.sleep(0.02)
        workers = psutil.Process(build.pid).children(recursive=True)
        assert len(workers) >= 2, workers  # (the two workers, and loky's resource trackers)
        build.kill()
        build.wait()
        t0 = time.monotonic()
        gone, alive = psutil.wait_procs(workers, timeout=15)  # (held mid-shard: before, they waited here for good)
        took = time.monotonic() - t0
    finally:
        hold.unlink(missing_ok=True)
        for p in psutil.Process(build.pid).children(recursive=True) if build.poll() is None else []:
            p.kill()
        if build.poll() is None:
            build.kill()
    assert not alive and took < 10, (alive, took)
    time.sleep(0.5)  # (a worker still writing would publish its shard now)
    left = sorted(p.name for p in out.iterdir() if p.name.startswith("shard-"))
    assert left and all(is_tmp_name(Path(n)) for n in left), left  # nothing published after the build died
    for target in (tmp_path / "clean", out):
        res = subprocess.run([*args, str(target)], cwd=user, env=env, capture_output=True, text=True, timeout=200)
        assert res.returncode == 0, res.stderr[-4000:]
    assert _files(out) == _files(tmp_path / "clean")


def _files(out: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != ".cachebuild-build.lock"}
