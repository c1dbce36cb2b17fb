"""ShardStream over remote caches: a real HTTP server on 127.0.0.1, a real moto S3 server,
real gloo DDP ranks with DataLoader workers, a bounded local cache folder watched while they run."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import RemoteError
from cachebuild.format import read_manifest
from loader_fixtures import batches_equal, build_causal, spawn_ranks
from loaders import ShardStream, make_loader
from loaders.remote import LocalShardCache, RemoteOptions
from remote_fixtures import free_port, moto_s3, remote_rank_main, serve_folder

GRAPHS = 400
DEADLINE_S = 120


@pytest.fixture(scope="session")
def remote_cache(tmp_path_factory) -> Path:
    """400 causal graphs in ~24 shards of ~0.5 MB (zstd)."""
    return build_causal(tmp_path_factory.mktemp("rcausal") / "cache", graphs=GRAPHS, shard_mb=1)


def _shard_bytes(root: Path) -> int:
    """The largest shard plus its index: the unit of the local cache limit."""
    return max(s.bytes + s.index_bytes for s in read_manifest(root).shards)


def _opts(tmp_path: Path, limit: int, **kw) -> RemoteOptions:
    kw = {"timeout_s": 2.0, "retries": 3, "prefetch": 1, **kw}
    return RemoteOptions(cache_dir=str(tmp_path / "local"), cache_limit_bytes=limit, **kw)


def _digest(batch: dict) -> str:
    h = hashlib.sha256()
    for k, v in batch.items():
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


class _Watch:
    """Samples the local cache folder every few ms, keeps the maxima of: bytes held counting
    in-flight downloads at their full reserved size (as the cache does), and bytes on disk.

    Files are counted once per inode: a download renamed into place while the folder is listed
    may show under both names. Each sample lists the folder under the cache's own lock (as
    ``reserve`` and ``commit`` change it): unlocked, a listing could see a file that ``reserve``
    then evicted *and* the reservation made in its place, one shard over the limit that the folder
    never held (a flake on a loaded machine, about 1 run in 5)."""

    def __init__(self, folder: Path, limit: int):
        self._cache = LocalShardCache(folder, limit)
        self.folder = self._cache.folder
        self.peak_reserved = self.peak_disk = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        held: dict[int, tuple[int, int]] = {}
        with self._cache._locked():
            for p in self.folder.iterdir():
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                reserved = int(p.name.split("-")[1]) if p.name.startswith(".part-") else st.st_size
                r, d = held.get(st.st_ino, (0, 0))
                held[st.st_ino] = (max(r, reserved), max(d, st.st_size))
        return sum(r for r, _ in held.values()), sum(d for _, d in held.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            reserved, disk = self.sample()
            self.peak_reserved, self.peak_disk = max(self.peak_reserved, reserved), max(self.peak_disk, disk)
            self.samples += 1
            time.sleep(0.003)

    def __enter__(self) -> "_Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _launch(world: int, url: str, out_dir: Path, remote: RemoteOptions, batch_size: int, nw: int) -> list[dict]:
    return spawn_ranks(remote_rank_main, (world, free_port(), url, str(out_dir), remote, batch_size, nw), world, out_dir, DEADLINE_S)


@pytest.mark.dist
@pytest.mark.timeout(DEADLINE_S + 60)
def test_ddp_ranks_stream_http_cache_within_local_limit(remote_cache, tmp_path):
    world, nw, batch = 2, 2, 32
    limit = 3 * _shard_bytes(remote_cache)
    opts = _opts(tmp_path, limit)
    requests: list[str] = []
    with serve_folder(remote_cache, requests) as (url, _):
        with _Watch(opts.resolved_cache_dir(url), limit) as watch:
            results = _launch(world, url, tmp_path, opts, batch, nw)
    assert watch.samples > 10 and watch.peak_reserved > 0
    assert watch.peak_reserved <= limit, f"local cache held {watch.peak_reserved} > limit {limit}"
    assert watch.peak_disk <= limit, f"local cache folder reached {watch.peak_disk} bytes > limit {limit}"
    tars = [p for p in requests if p.endswith(".tar")]
    assert len(set(tars)) == len(read_manifest(remote_cache).shards) > 3  # more than the local cache holds: evictions
    steps = {res["steps"] for res in results}
    assert len(steps) == 1 and {res["len"] for res in results} == steps, f"unequal steps {steps}"
    real, pads = [], 0
    for res in results:
        for ids, pad, _ in res["batches"]:
            real += [i for i, p in zip(ids, pad) if not p]
            pads += sum(pad)
    assert sorted(real) == list(range(GRAPHS)), "the ranks together must see every record exactly once"
    assert pads == steps.pop() * world * batch - GRAPHS
    # values: the same batches as a local read of the same cache, rank by rank
    for r, res in enumerate(results):
        local = ShardStream(remote_cache, view="graphs", batch_size=batch, shuffle=True, seed=3, rank=r, world_size=world)
        local.set_epoch(1)
        assert [d for _, _, d in res["batches"]] == [_digest(b) for b in local]


def test_each_rank_fetches_only_the_shards_its_batches_touch(remote_cache, tmp_path):
    world, batch = 4, 8
    requests: list[str] = []
    with serve_folder(remote_cache, requests) as (url, _):
        kw = dict(view="graphs", batch_size=batch, shuffle=True, seed=0, window=1, rank=0, world_size=world)
        stream = ShardStream(url, remote=_opts(tmp_path, 1 << 30, prefetch=2), **kw)
        del requests[:]  # the manifest
        got = [b["record_id"][~b["is_pad"]] for b in stream]
    plan = ShardStream(remote_cache, **kw).plan()
    starts = read_manifest(remote_cache).shard_starts()
    want = sorted({int(s) for b in plan.rank_batches(world, 0) for s in np.searchsorted(starts, plan.batch(int(b)).unique, side="right") - 1})
    fetched = sorted(int(p.rsplit("-", 1)[1].split(".")[0]) for p in requests if p.endswith(".tar"))
    assert fetched == want, "fetched shards other than the rank's (or some twice, with a roomy cache)"
    assert len(want) < len(read_manifest(remote_cache).shards)
    assert sum(len(g) for g in got) > 0


def test_remote_twins_and_file_url_equal_local(remote_cache, tmp_path):
    limit = 4 * _shard_bytes(remote_cache)
    with serve_folder(remote_cache) as (url, _):
        kw = dict(view="twins", batch_size=500, seed=5, compact=True)
        remote = ShardStream(url, remote=_opts(tmp_path, limit), **kw)
        local = ShardStream(f"file://{remote_cache}", **kw)
        assert isinstance(local.root, Path) and local.root == remote_cache
        n = 0
        for a, b in zip(remote, local):
            assert batches_equal(a, b)
            n += 1
        assert n == len(local) > 1
        # a state saved on the remote stream resumes on the local one (the cache's identity, not its location)
        remote.set_epoch(2)
        it = iter(remote)
        next(it)
        local.load_state_dict(remote.state_dict())
        local.set_epoch(2)
        assert batches_equal(next(it), next(iter(local)))
    assert LocalShardCache(_opts(tmp_path, limit).resolved_cache_dir(url), limit).used_bytes() <= limit


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_server_dying_mid_epoch_is_a_clear_error_in_the_trainer(remote_cache, tmp_path):
    limit = 3 * _shard_bytes(remote_cache)
    opts = _opts(tmp_path, limit, timeout_s=1.0, retries=1)
    with serve_folder(remote_cache) as (url, server):
        stream = ShardStream(url, view="graphs", batch_size=16, seed=1, remote=opts)
        loader = make_loader(stream, num_workers=2, prefetch_factor=1)
        it = iter(loader)
        next(it)
        server.shutdown()
        server.server_close()
        t = time.monotonic()
        with pytest.raises(RemoteError, match=re.escape(url) + r"/shard-\d+\.(tar|idx\.npy)") as info:
            for _ in it:
                pass
        elapsed = time.monotonic() - t
    assert elapsed < 30, f"the error took {elapsed:.1f} s"
    assert "attempts" in str(info.value)
    assert not list(Path(opts.resolved_cache_dir(url)).glob(".part-*"))  # nothing partial left behind


def test_missing_remote_cache_names_the_url(tmp_path):
    with serve_folder(tmp_path) as (url, _):
        with pytest.raises(RemoteError, match=re.escape(url) + r"/nope/manifest\.json.*404"):
            ShardStream(url + "/nope", remote=_opts(tmp_path, 1 << 20, retries=0))


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_s3_cache_through_s3fs_and_moto(remote_cache, tmp_path):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with moto_s3() as (fs, options):
        for p in sorted(remote_cache.iterdir()):
            fs.put_file(str(p), f"cachebuild-test/causal/{p.name}")
        opts = _opts(tmp_path, 4 * _shard_bytes(remote_cache), storage_options=tuple(options.items()))
        stream = ShardStream("s3://cachebuild-test/causal", view="graphs", batch_size=64, seed=2, remote=opts)
        loader = make_loader(stream, num_workers=2, prefetch_factor=2)
        local = ShardStream(remote_cache, view="graphs", batch_size=64, seed=2)
        seen = []
        for a, b in zip(loader, local, strict=True):
            assert batches_equal(a, b)
            seen += a["record_id"][~a["is_pad"]].tolist()
        # a missing prefix is "not found" at once, not retried into an unexplained path (was: "after 2 attempts: cachebuild-test/nothere/manifest.json")
        with pytest.raises(RemoteError, match=r"^cannot fetch s3://cachebuild-test/nothere/manifest\.json: not found"):
            ShardStream("s3://cachebuild-test/nothere", view="graphs", batch_size=64, remote=opts)
    assert sorted(seen) == list(range(GRAPHS))
