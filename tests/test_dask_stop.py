"""A Dask build that stops (a shard fails, or Ctrl-C) on a real external ``LocalCluster``: the tasks it
submitted are cancelled or waited for, and nothing appears in the output after the build returns."""

from __future__ import annotations

import logging
import os
import signal
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
