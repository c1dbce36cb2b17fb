"""Review of "beyond one machine" as a new user: a Dask cluster started elsewhere, without the user's module."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from cachebuild.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

USER_CODE = """
import numpy as np
from cachebuild import FunctionSource

def seq(rng, index):
    return {"x": rng.standard_normal(4).astype(np.float32), "i": np.int64(index)}

def make():
    return FunctionSource.per_record(seq, {"x": "float32", "i": "int64"})
"""

CLUSTER = """
import os, sys, time
from distributed import LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=int(sys.argv[2]), threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as c:
        open(sys.argv[1] + ".tmp", "w").write(c.scheduler_address)
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(600)
"""

pytestmark = pytest.mark.dist


@pytest.fixture(params=[2])
def remote_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A Dask cluster (``param`` workers) started in another folder and process, without the user's folder on its path (as on real nodes)."""
    pytest.importorskip("distributed")
    home = tmp_path / "cluster"
    home.mkdir()
    (home / "cluster.py").write_text(CLUSTER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = home / "cluster.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "cluster.py", str(home / "addr"), str(request.param)], cwd=home, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if (home / "addr").exists():
                break
            assert proc.poll() is None, f"the Dask cluster did not start (exit code {proc.returncode}):\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        else:
            pytest.fail(f"the Dask cluster did not start within 60 s:\n{log.read_text()[-3000:]}")
        yield (home / "addr").read_text()
    finally:
        proc.kill()
        proc.wait()


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{cwd}"}
    try:
        return subprocess.run([sys.executable, "-m", "cachebuild.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`cachebuild {' '.join(args)}` hung; its stderr so far:\n{(exc.stderr or b'')[-3000:]!r}")


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file() and not p.name.startswith(".")}


@pytest.mark.timeout(300)
def test_a_users_module_builds_on_a_dask_cluster_that_cannot_import_it(tmp_path: Path, remote_cluster: str) -> None:
    """Dask pickled the job by reference: the scheduler dropped the task graph and the build waited forever."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "mysource_rv.py").write_text(USER_CODE)
    (user / "recipe.toml").write_text('kind = "mysource_rv:make"\nrecords = 600\n[build]\nshard_mb = 0.01\n')
    res = _cli(["build", "-c", "recipe.toml", "-o", str(tmp_path / "dask"), "-q", "--backend", "dask", "--scheduler", remote_cluster], user)
    assert res.returncode == 0, res.stderr
    res = _cli(["build", "-c", "recipe.toml", "-o", str(tmp_path / "loky"), "-q", "-j", "2"], user)
    assert res.returncode == 0, res.stderr
    assert _hashes(tmp_path / "dask") == _hashes(tmp_path / "loky")


@pytest.mark.timeout(300)
def test_workers_that_cannot_load_the_job_are_one_error_naming_the_module(tmp_path: Path, remote_cluster: str) -> None:
    """A module pickled by name (an installed package missing on the workers) is named at once, not waited on."""
    from distributed import Client

    from cachebuild.builder.backends import _probe_dask_workers

    (tmp_path / "installed_rv.py").write_text("def job(item):\n    return item\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import installed_rv

        blob = pickle.dumps((installed_rv.job, 0, ()))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("installed_rv", None)
    with Client(remote_cluster, set_as_default=False) as client:
        with pytest.raises(ConfigError, match=r"cannot load the build's job: ModuleNotFoundError: No module named 'installed_rv'") as info:
            _probe_dask_workers(client, blob, remote_cluster)
    assert remote_cluster in str(info.value) and "\n" not in str(info.value)


@pytest.mark.timeout(240)
def test_a_local_dask_build_beside_another_cluster_says_nothing_of_its_port(tmp_path: Path) -> None:
    """Port 8787 held by another program (a notebook's cluster): the build warned, and the suite failed on it."""
    import socket
    import warnings

    pytest.importorskip("distributed")
    from conftest import build_toy

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:
        pass  # already held by someone else: the same situation
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = build_toy(tmp_path / "d", workers=2, backend="dask")
    finally:
        holder.close()
    assert summary.built == summary.shards
    assert not [w for w in caught if "8787" in str(w.message)], [str(w.message) for w in caught]


def _pid_record(rng: object, index: int) -> dict:
    import numpy as np

    return {"pid": np.int64(os.getpid())}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("remote_cluster", [1], indirect=True)
def test_a_one_worker_cluster_builds_on_the_cluster_not_in_the_caller(tmp_path: Path, remote_cluster: str) -> None:
    """joblib's Dask backend ran every job in the calling process when the cluster had one worker thread."""
    from cachebuild import FunctionSource, build
    from cachebuild.format import open_cache, read_record

    import cloudpickle
    from distributed import Client

    source = FunctionSource.per_record(_pid_record, {"pid": "int64"})
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as `cachebuild build` does for a user's module
    try:
        summary = build(source, tmp_path / "c", records=600, shard_mb=0.002, backend="dask", address=remote_cluster, progress=False)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert summary.shards > 1
    with open_cache(tmp_path / "c") as shards:
        pids = {int(read_record(shards, i)["pid"]) for i in range(0, 600, 50)}
    with Client(remote_cluster, set_as_default=False) as client:
        workers = set(client.run(os.getpid).values())
    assert os.getpid() not in pids and pids == workers, (pids, workers)


def _dask_build_of(tmp_path: Path, module: str, code: str, recipe: str) -> subprocess.CompletedProcess:
    """``cachebuild build`` of ``recipe`` on the build's own 2-worker Dask cluster, from a user folder holding
    ``module`` (``USER_CODE`` + ``code``); the output goes to ``tmp_path / "out"``."""
    pytest.importorskip("distributed")
    user = tmp_path / "user"
    user.mkdir()
    (user / f"{module}.py").write_text(USER_CODE + code)
    (user / "recipe.toml").write_text(recipe)
    return _cli(["build", "-c", "recipe.toml", "-o", str(tmp_path / "out"), "-q", "--backend", "dask", "-j", "2"], user)


@pytest.mark.timeout(240)
def test_a_failing_source_on_dask_is_its_one_line(tmp_path: Path) -> None:
    """The source's own error, once, with no worker traceback logged on the way."""
    code = "\ndef bad():\n    return FunctionSource.per_record(_boom, {'x': 'float32'})\n\ndef _boom(rng, index):\n    if index >= 300:\n        raise ValueError(f'no data for {index}')\n    return {'x': np.zeros(2, np.float32)}\n"
    res = _dask_build_of(tmp_path, "mysource_rv", code, 'kind = "mysource_rv:bad"\nrecords = 600\n[build]\nshard_mb = 0.001\n')
    assert res.returncode == 6, res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "raised ValueError: no data for" in res.stderr, res.stderr


@pytest.mark.timeout(240)
def test_the_builds_own_dask_workers_keep_asyncio_quiet(tmp_path: Path) -> None:
    """A local Dask worker closing on a loaded machine can time out and print asyncio's "Future exception was
    never retrieved" beside the build's one line (seen in CI): the build's own workers start with asyncio's
    logger at CRITICAL (each record here stores the level its worker had)."""
    code = "\nimport logging\n\ndef lv():\n    return FunctionSource.per_record(_level, {'level': 'int32'})\n\n"
    code += "def _level(rng, index):\n    return {'level': np.array([logging.getLogger('asyncio').getEffectiveLevel()], np.int32)}\n"
    res = _dask_build_of(tmp_path, "mysource_lv", code, 'kind = "mysource_lv:lv"\nrecords = 40\n[build]\nshard_mb = 0.0001\n')
    assert res.returncode == 0, res.stderr
    from loaders import ShardStream

    levels = {int(v) for b in ShardStream(tmp_path / "out", view="records", batch_size=8, shuffle=False) for v in b["level"].flatten().tolist()}
    assert levels == {logging.CRITICAL}, levels
    assert "DASK_LOGGING__ASYNCIO" not in os.environ


@pytest.mark.timeout(120)
def test_an_unreachable_scheduler_is_one_line(tmp_path: Path) -> None:
    """It was distributed's OSError traceback after 30 s."""
    pytest.importorskip("distributed")
    from ports import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    args = [sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", "20", "-o", str(tmp_path / "out"), "-q", "--backend", "dask", "--scheduler", address]
    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=100)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == res.stderr.strip().splitlines()[0], res.stderr
    assert res.stderr.startswith(f"error: cannot reach the Dask scheduler at {address}"), res.stderr
