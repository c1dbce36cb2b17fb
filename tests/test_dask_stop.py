"""A Dask build that stops (a shard fails, or Ctrl-C) on a real external ``LocalCluster``: the tasks it
submitted are cancelled or waited for, and nothing appears in the output after the build returns. And a
terminal's Ctrl-C on the CLI with the build's own cluster: its workers ignore it, the build says it waits."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.builder.markers import file_sha256
from cachebuild.errors import SourceError
from cachebuild.format.atomic import is_tmp_name

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.dist

RECORDS = 1200
FAIL_AT = 150  # in shard 1, half-way: shard 0 is being written on the other worker then


def _slow(rng: np.random.Generator, index: int, flag: str = "") -> dict:
    if index == FAIL_AT and Path(flag).exists():
        raise ValueError(f"record {index} is bad")
    time.sleep(0.005)
    return {"x": rng.standard_normal(8).astype(np.float32)}


def _source(flag: Path) -> FunctionSource:
    return FunctionSource.per_record(_slow, {"x": "float32"}, params={"flag": str(flag)}, block_records=10)


def _build(src: FunctionSource, out: Path, **kw) -> object:
    return build(src, out, records=RECORDS, workers=2, shard_mb=0.0016, progress=False, **kw)


@pytest.fixture
def cluster():
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=":0", silence_logs=logging.ERROR) as c,
        distributed.Client(c, set_as_default=False) as client,
    ):
        yield c.scheduler_address, client


def _files(out: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file()}


def _nothing_after_return(out: Path, client) -> None:
    """Right after the build returned: no task handed to a worker, and the folder does not change (a shard takes ~1 s)."""
    assert not any(client.processing().values()), client.processing()
    files = _files(out)
    assert not [n for n in files if is_tmp_name(Path(n))], files
    time.sleep(1.5)
    assert _files(out) == files


def _same_as_a_clean_build(src: FunctionSource, out: Path, address: str, tmp_path: Path) -> None:
    """The rerun finishes the cache; every byte equals a build that never stopped."""
    summary = _build(src, out, backend="dask", address=address)
    assert summary.shards > 4 and summary.built < summary.shards  # it resumed what the stopped build published
    _build(src, tmp_path / "clean", backend="threading")
    assert _files(out) == _files(tmp_path / "clean")


@pytest.mark.timeout(240)
def test_a_failed_shard_stops_the_tasks_on_the_cluster(cluster, tmp_path):
    address, client = cluster
    flag = tmp_path / "fail"
    flag.touch()
    out = tmp_path / "c"
    src = _source(flag)
    with pytest.raises(SourceError, match=f"record {FAIL_AT} raised ValueError"):
        _build(src, out, backend="dask", address=address)
    _nothing_after_return(out, client)
    flag.unlink()
    _same_as_a_clean_build(src, out, address, tmp_path)


@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_tasks_on_the_cluster(cluster, tmp_path):
    address, client = cluster
    out = tmp_path / "c"
    src = _source(tmp_path / "never")
    stop = threading.Event()

    def interrupt() -> None:  # Ctrl-C once a shard is complete (however loaded the machine), mid-build
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            if out.is_dir() and any(p.name.endswith(".done.json") for p in out.iterdir()):  # (what a rerun keeps)
                break
            time.sleep(0.02)
        if not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt, daemon=True)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            _build(src, out, backend="dask", address=address)
            time.sleep(30)  # (a build that finished first is still interrupted, here)
    finally:
        stop.set()
        timer.join()
    _nothing_after_return(out, client)
    _same_as_a_clean_build(src, out, address, tmp_path)


CLI_USER_CODE = """
import time
from pathlib import Path

import numpy as np
from cachebuild import FunctionSource


def _held(rng, index, hold=""):
    while index and hold and Path(hold).exists():  # the test holds every running shard here, mid-block (record 0: the build sizes it first)
        time.sleep(0.02)
    time.sleep(0.005)
    return {"x": rng.standard_normal(8).astype(np.float32)}


def make(hold=""):
    return FunctionSource.per_record(_held, {"x": "float32"}, params={"hold": hold}, block_records=10)
"""


def _cli(out: Path, backend: str) -> list[str]:
    return [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-o", str(out), "-q", "--backend", backend, "-j", "2"]


CLI_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


@pytest.mark.timeout(240)
def test_ctrl_c_in_a_terminal_stops_the_builds_own_cluster_promptly(tmp_path):
    """Ctrl-C in a terminal reaches every process of the build's process group, the build's own Dask workers
    included: they died with two tracebacks, their tasks never ended, and the build waited 120 s in silence.
    Now they ignore it, the build says that it waits for its running shards, which stop at their next block
    without publishing, and it leaves, its cluster's scratch folder removed; the rerun equals a clean build."""
    user, hold = tmp_path / "user", tmp_path / "hold"
    user.mkdir()
    (user / "daskuser.py").write_text(CLI_USER_CODE)
    (user / "recipe.toml").write_text(f'kind = "daskuser:make"\nrecords = {RECORDS}\n[params]\nhold = "{hold}"\n[build]\nshard_mb = 0.0016\n')
    out, own_tmp = tmp_path / "out", tmp_path / "tmp"  # (a TMPDIR of its own: the cluster's scratch folder goes too)
    own_tmp.mkdir()
    hold.touch()
    proc = subprocess.Popen(_cli(out, "dask"), cwd=user, env={**CLI_ENV, "TMPDIR": str(own_tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # both workers' shards being written (held mid-block): the first one alone left a race with the second's start
        while proc.poll() is None and not (out.is_dir() and sum(p.name.startswith("shard-") and is_tmp_name(p) for p in out.iterdir()) >= 2):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it
        line = proc.stderr.readline()
        if not line.startswith("stopping: waiting for 2 running shards to stop at their next block on the Dask cluster (they publish nothing); press Ctrl-C to leave now"):
            hold.unlink()
            rest = proc.communicate(timeout=60)[1]
            pytest.fail(f"no stop line; stderr: {line + rest!r}; files: {sorted(p.name for p in out.iterdir())}")
        hold.unlink()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()  # (its pipes closed)
    assert proc.returncode == 130 and err == "interrupted: rerun the same command to resume\n", err[-4000:]
    assert took < 30, took
    assert list(own_tmp.iterdir()) == []
    assert not [p.name for p in out.iterdir() if p.name.startswith("shard-")], sorted(out.iterdir())  # nothing published, temporary files removed
    for target in (tmp_path / "clean", out):
        res = subprocess.run(_cli(target, "threading"), cwd=user, env=CLI_ENV, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-4000:]
    assert _files(out) == _files(tmp_path / "clean")
