"""A build's own Dask cluster keeps its local directory (scheduler and workers) in a temporary folder of the
build's, removed when the build ends, also when a shard failed; Dask's default ``$TMPDIR/dask-scratch-space``
stayed behind after every build. A user's running cluster's folders are not the build's to touch. Each test
gives the build a ``TMPDIR`` of its own (other builds on the machine share ``/tmp/dask-scratch-space``).
Ctrl-C: ``test_dask_stop.py::test_ctrl_c_in_a_terminal_stops_the_builds_own_cluster_promptly``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import SourceError

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")
pytestmark = pytest.mark.dist

FAIL_AT = 150


def _noted(rng: np.random.Generator, index: int, note: str = "", fail: bool = False) -> dict:
    """A record; record 0 on a worker writes where its's local directory is to ``note``; ``fail``: record FAIL_AT raises."""
    if index == 0 and note:
        try:
            Path(note).write_text(distributed.get_worker().local_directory)
        except ValueError:  # (the build sizes record 0 in its own process first: no worker there)
            pass
    if fail and index == FAIL_AT:
        raise ValueError(f"record {index} is bad")
    return {"x": rng.standard_normal(4).astype(np.float32)}


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``TMPDIR`` for this test alone (the build's process and the cluster's worker processes), Dask's
    ``temporary-directory`` unset."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (gettempdir() reads TMPDIR again)
    with dask.config.set({"temporary-directory": None}):
        yield tmp


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail", [False, True], ids=["finished", "failed"])
def test_the_builds_own_cluster_leaves_no_scratch_folder(own_tmp: Path, tmp_path: Path, fail: bool) -> None:
    note = tmp_path / "local_directory"
    src = FunctionSource.per_record(_noted, {"x": "float32"}, params={"note": str(note), "fail": fail}, block_records=10)
    if fail:
        with pytest.raises(SourceError, match="record 150 is bad"):
            build(src, tmp_path / "out", records=400, workers=2, shard_mb=0.0016, progress=False, backend="dask")
    else:
        build(src, tmp_path / "out", records=400, workers=2, shard_mb=0.0016, progress=False, backend="dask")
    assert list(own_tmp.iterdir()) == []  # (was: dask-scratch-space, with its lock files)
    used = Path(note.read_text())  # <tmp>/cachebuild-dask-*/dask-scratch-space/worker-*
    assert used.parent.parent.parent == own_tmp and used.parent.parent.name.startswith("cachebuild-dask-"), used


@pytest.mark.timeout(180)
def test_a_users_cluster_keeps_its_folders(own_tmp: Path, tmp_path: Path) -> None:
    """With an address the build makes no folder of its own, and the cluster's own stay as they are."""
    theirs = tmp_path / "theirs"
    note = tmp_path / "local_directory"
    src = FunctionSource.per_record(_noted, {"x": "float32"}, params={"note": str(note)}, block_records=10)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=":0", silence_logs=logging.ERROR, local_directory=str(theirs)
    ) as cluster:
        before = sorted(p.name for p in (theirs / "dask-scratch-space").iterdir())
        build(src, tmp_path / "out", records=400, workers=2, shard_mb=0.0016, progress=False, backend="dask", address=cluster.scheduler_address)
        assert sorted(p.name for p in (theirs / "dask-scratch-space").iterdir()) == before
    assert Path(note.read_text()).parent == theirs / "dask-scratch-space"
    assert not [p for p in own_tmp.iterdir() if p.name.startswith("cachebuild-dask-")]
