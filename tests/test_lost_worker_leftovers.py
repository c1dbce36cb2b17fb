"""A build worker lost mid-shard (killed, its node gone) leaves no temporary file in the finished cache.

Found by the acceptance audit of issue 6: a Dask worker (and a Ray worker) killed while writing
``shard-00017.tar`` left ``shard-00017.tar.tmp-<pid>`` (2.9 MB) in the cache; the cluster ran the
shard again elsewhere, the build ended "91 built", and neither it nor a rerun ("nothing to do")
removed the file. Real processes: the build's own Dask ``LocalCluster`` and a local Ray, a worker that dies once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachebuild.builder.markers import file_sha256
from cachebuild.format.atomic import is_tmp_name

REPO = Path(__file__).resolve().parent.parent

USER_CODE = """
import os
from pathlib import Path

import numpy as np
from cachebuild import FunctionSource


def _dies_once(rng, index, mark=""):
    if index == 330 and mark and not Path(mark).exists():  # mid-shard (blocks of 10): the shard's temp file is open
        Path(mark).touch()
        os._exit(3)  # the worker process dies once; the cluster runs the shard again
    return {"x": rng.standard_normal(8).astype(np.float32)}


def make(mark=""):
    return FunctionSource.per_record(_dies_once, {"x": "float32"}, params={"mark": mark}, block_records=10)
"""


def _build(user: Path, out: Path, backend: str, mark: Path) -> subprocess.CompletedProcess:
    (user / "recipe.toml").write_text(f'kind = "lostuser:make"\nrecords = 600\n[params]\nmark = "{mark}"\n[build]\nshard_mb = 0.001\n')
    args = [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-o", str(out), "-q", "--backend", backend, "-j", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}  # (Ray: a local Ray of its own)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(args, cwd=user, env=env, capture_output=True, text=True, timeout=200)


def _files(out: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != ".cachebuild-build.lock"}


@pytest.fixture
def user(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "lostuser.py").write_text(USER_CODE)
    return folder


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["dask", "ray"])
def test_a_worker_lost_mid_shard_leaves_no_temp_file(tmp_path: Path, user: Path, backend: str) -> None:
    pytest.importorskip({"dask": "distributed", "ray": "ray"}[backend])
    mark = tmp_path / "died"
    res = _build(user, tmp_path / "out", backend, mark)
    assert res.returncode == 0 and mark.exists(), res.stderr[-4000:]  # a worker died, and the build went on
    left = [p.name for p in (tmp_path / "out").iterdir() if is_tmp_name(p)]
    assert not left, left
    clean = _build(user, tmp_path / "clean", "loky", mark)  # (mark exists: nothing dies)
    assert clean.returncode == 0, clean.stderr[-4000:]
    assert _files(tmp_path / "out") == _files(tmp_path / "clean")


@pytest.mark.timeout(240)
def test_a_rerun_of_a_complete_cache_removes_a_lost_workers_temp_file(tmp_path: Path, user: Path) -> None:
    """A cache finished before the fix keeps the file; the rerun that finds it complete removes it."""
    mark = tmp_path / "died"
    mark.touch()
    out = tmp_path / "out"
    assert _build(user, out, "loky", mark).returncode == 0
    before = _files(out)
    leftover = out / "shard-00002.tar.tmp-4242"
    leftover.write_bytes(b"\0" * 4096)  # what the lost worker left (as measured: the shard's first bytes)
    res = _build(user, out, "loky", mark)
    assert res.returncode == 0 and "nothing to do" in res.stdout + res.stderr, res.stderr[-4000:]
    assert not leftover.exists() and _files(out) == before
