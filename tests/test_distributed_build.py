"""Builds on a real Dask LocalCluster and into a real S3-compatible server (moto) on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachebuild.format.manifest import read_manifest

from cachebuild.builder.markers import file_sha256
from conftest import build_toy
from ports import free_port

pytestmark = pytest.mark.dist


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir())}


@pytest.mark.timeout(240)
def test_dask_local_cluster_builds_same_bytes(tmp_path, toy_cache):
    pytest.importorskip("distributed")
    summary = build_toy(tmp_path / "d", workers=2, backend="dask")
    assert summary.built == summary.shards > 2
    assert _hashes(tmp_path / "d") == _hashes(toy_cache)


@pytest.mark.timeout(240)
def test_dask_external_scheduler_address(tmp_path, toy_cache):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as cluster:
        summary = build_toy(tmp_path / "d", workers=2, backend="dask", address=cluster.scheduler_address)
    assert summary.built == summary.shards
    assert _hashes(tmp_path / "d") == _hashes(toy_cache)


@pytest.fixture
def s3_server(monkeypatch):
    """A moto S3 server on 127.0.0.1 (skipped when moto[server] is not installed)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url}.items():
        monkeypatch.setenv(k, v)
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url})
    fs.mkdir("cachebuild-test")
    # explicit options: loky workers started by earlier tests do not see monkeypatched variables
    fs.test_options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"}}
    yield fs
    proc.terminate()
    proc.wait(10)


@pytest.mark.timeout(240)
def test_build_into_s3_matches_local_build_and_resumes(s3_server, tmp_path, toy_cache):
    fs = s3_server
    summary = build_toy("s3://cachebuild-test/toy", workers=2, storage_options=fs.test_options)
    assert summary.built == summary.shards
    fs.invalidate_cache()
    local = _hashes(toy_cache)
    remote_names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("cachebuild-test/toy"))
    assert remote_names == sorted(local)
    for name in ("shard-00000.tar", read_manifest(toy_cache).shards[3].index, "manifest.json"):
        fs.get_file(f"cachebuild-test/toy/{name}", str(tmp_path / name))
        assert file_sha256(tmp_path / name) == local[name], name
    # a lost worker's shard: remove it and its marker, rerun, get the same bytes back
    fs.rm("cachebuild-test/toy/manifest.json")
    fs.rm("cachebuild-test/toy/shard-00002.tar")
    fs.invalidate_cache()
    again = build_toy("s3://cachebuild-test/toy", workers=1, storage_options=fs.test_options)
    assert again.built == 1 and again.skipped == summary.shards - 1
    fs.invalidate_cache()
    fs.get_file("cachebuild-test/toy/shard-00002.tar", str(tmp_path / "s2.tar"))
    assert file_sha256(tmp_path / "s2.tar") == local["shard-00002.tar"]


@pytest.mark.timeout(300)
def test_ray_local_builds_same_bytes(tmp_path, toy_cache):
    pytest.importorskip("ray")
    summary = build_toy(tmp_path / "r", workers=2, backend="ray")
    assert summary.built == summary.shards
    assert _hashes(tmp_path / "r") == _hashes(toy_cache)
