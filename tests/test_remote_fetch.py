"""Remote shards through a bounded local cache: real HTTP server on 127.0.0.1."""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
import zstandard

from cachebuild.errors import RemoteError, ShardCorruptError
from cachebuild.format.reader import open_shard
from loaders.remote import LocalShardCache, RemoteOptions, ShardFetcher, fetch_manifest
from remote_fixtures import serve_folder


def _opts(tmp_path, limit, **kw):
    return RemoteOptions(cache_dir=str(tmp_path / "local"), cache_limit_bytes=limit, timeout_s=2.0, retries=1, **kw)


def test_fetch_all_shards_within_limit(toy_cache, tmp_path):
    with serve_folder(toy_cache) as (url, _):
        m = fetch_manifest(url, _opts(tmp_path, 1))
        biggest = max(s.bytes + s.index_bytes for s in m.shards)
        limit = 3 * biggest
        opts = _opts(tmp_path, limit, prefetch=1)
        f = ShardFetcher(url, m, opts)
        f.plan(list(range(len(m.shards))))
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], f.cache.used_bytes())
                time.sleep(0.001)

        t = threading.Thread(target=watch)
        t.start()
        j = m.field_names.index("ident")
        seen = 0
        for i, e in enumerate(m.shards):
            with f.open(i, lambda tar, idx: open_shard(m, e, tar, idx)) as sh:  # sizes, index and keys checked
                ent = sh.index[0, j]
                member = zstandard.ZstdDecompressor().decompress(sh.view[int(ent["offset"]) : int(ent["offset"]) + int(ent["size"])])
                assert int(np.frombuffer(member[-8:], np.int64)[0]) == e.first_record
                seen += len(sh.index)
        stop.set()
        t.join()
        f.close()
    assert seen == m.records
    assert 0 < peak[0] <= limit
    assert f.cache.used_bytes() <= limit


def test_second_pass_is_served_from_local_cache(toy_cache, tmp_path):
    with serve_folder(toy_cache) as (url, server):
        m = fetch_manifest(url, _opts(tmp_path, 1 << 30))
        f = ShardFetcher(url, m, _opts(tmp_path, 1 << 30))
        paths = [f.get(i) for i in range(len(m.shards))]
    # the server is gone: a warm local cache still serves every shard
    f2 = ShardFetcher(url, m, _opts(tmp_path, 1 << 30))
    assert [f2.get(i) for i in range(len(m.shards))] == paths


def test_corrupt_remote_shard_is_refused(toy_cache, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(toy_cache, served)
    m_name = "shard-00001.tar"
    data = bytearray((served / m_name).read_bytes())
    data[700] ^= 0xFF
    (served / m_name).write_bytes(bytes(data))
    with serve_folder(served) as (url, _):
        m = fetch_manifest(url, _opts(tmp_path, 1 << 30))
        f = ShardFetcher(url, m, _opts(tmp_path, 1 << 30))
        f.get(0)
        with pytest.raises(ShardCorruptError, match=m_name):
            f.get(1)
    assert not list((tmp_path / "local").glob("**/*shard-00001.tar"))  # never kept
    assert not list((tmp_path / "local").glob("**/.part-*"))


@pytest.mark.timeout(60)
def test_dead_server_is_a_clear_error_not_a_hang(toy_cache, tmp_path):
    with serve_folder(toy_cache) as (url, _):
        m = fetch_manifest(url, _opts(tmp_path, 1 << 30))
    f = ShardFetcher(url, m, _opts(tmp_path, 1 << 30))
    t = time.perf_counter()
    with pytest.raises(RemoteError, match=r"127\.0\.0\.1.*shard-00000"):
        f.get(0)
    assert time.perf_counter() - t < 30


def test_missing_remote_cache(tmp_path):
    with serve_folder(tmp_path) as (url, _):
        with pytest.raises(RemoteError, match="HTTP 404"):
            fetch_manifest(url + "/nope", _opts(tmp_path, 1))


def test_file_larger_than_limit_is_refused(tmp_path):
    cache = LocalShardCache(tmp_path / "c", 1000)
    with pytest.raises(RemoteError, match="larger than the local cache limit"):
        cache.reserve("x.tar", 5000, set())


def _records_sum(stream) -> tuple[int, float]:
    ids, total = 0, 0.0
    for batch in stream:
        keep = ~batch["is_pad"]
        ids += int(keep.sum())
        total += float(batch["vec"][keep].double().sum())
    return ids, total


@pytest.mark.parametrize("verify", ["crc", "size"])
def test_a_cache_rebuilt_at_the_same_url_is_fetched_again_not_served_stale(tmp_path, verify):
    """Same names and sizes (a raw cache rebuilt with another seed): the local copies of the
    old cache must not be taken for the new one's files (they were, by name and size alone)."""
    from conftest import build_toy
    from cachebuild.format.manifest import Codec
    from loaders import ShardStream

    served = tmp_path / "served"
    build_toy(served, codec=Codec("none", 0), seed=0)
    other = tmp_path / "other"
    build_toy(other, codec=Codec("none", 0), seed=1)
    old_m, new_m = fetch_manifest(f"file://{served}"), fetch_manifest(f"file://{other}")
    assert [(e.bytes, e.index_bytes) for e in old_m.shards] == [(e.bytes, e.index_bytes) for e in new_m.shards]
    opts = _opts(tmp_path, 1 << 30)

    def stream(root):
        return ShardStream(str(root), view="records", batch_size=64, shuffle=False, verify=verify, **({"remote": opts} if "://" in str(root) else {}))

    with serve_folder(served) as (url, _):
        assert _records_sum(stream(url)) == _records_sum(stream(served))  # the local cache now holds the old files
        shutil.rmtree(served)
        shutil.copytree(other, served)  # rebuilt in place: same URL, names and sizes
        assert _records_sum(stream(url)) == _records_sum(stream(other))
