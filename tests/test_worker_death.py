"""A build worker process that dies (the OS killing it for memory, a crash in native code) ends the build in
one line naming what died, exit 1, no traceback, on loky (the default) and on the build's own Dask cluster
(Ray: ``tests/test_ray_build.py``). It was joblib's ``TerminatedWorkerError`` and distributed's
``KilledWorker`` tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
