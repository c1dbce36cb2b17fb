"""Decoded pools shared between DataLoader workers (``loaders.shared_pools``): each pool is decoded
once in all instead of once per worker, and the batches are the ones 0 workers give, bit for bit.

Real DataLoader worker processes, real caches; the counts come from the shared control block the
workers update (``SharedPools.decoded``: records decoded into shared regions by every worker;
``private_batches``: batches a worker built from its private store instead).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from loader_fixtures import all_batches_equal, build_causal, build_mel_from_arrays
from loaders import ShardStream, make_loader
from loaders.shared_pools import SharedPools

GRAPHS = 240


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_causal(tmp_path_factory.mktemp("shared-pools") / "c", graphs=GRAPHS, shard_mb=0.6)


@pytest.fixture(scope="module")
def mels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mel_from_arrays(tmp_path_factory.mktemp("shared-pools-mel") / "c", files=300, shard_mb=1.0)


def _twins(root: Path, **kw) -> ShardStream:
    return ShardStream(root, view="twins", batch_size=1024, shuffle=True, seed=5, compact=True, mix=64, **kw)


def _epochs(loader, epochs: int) -> list[dict]:
    """The batches of epochs 0 to ``epochs - 1``, in order (copies: a batch's memory may be reused)."""
    return [b for e in range(epochs) for b in _epochs_from(loader, e)]


@pytest.fixture(scope="module")
def twins_of_0_workers(graphs: Path) -> list[list[dict]]:
    """The ``_twins`` batches of 0 workers, epoch by epoch (epochs 0 and 1): the reference of the tests
    below, read once for the module (read-only: the tests compare with it, never change it)."""
    loader = make_loader(_twins(graphs), num_workers=0)
    return [_epochs_from(loader, e) for e in range(2)]


def _epochs_from(loader, epoch: int) -> list[dict]:
    loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_share_each_pool_and_give_the_batches_of_0_workers(graphs: Path, twins_of_0_workers: list[list[dict]], workers: int) -> None:
    """2 and 3 persistent workers over 2 epochs: every graph decoded exactly once per epoch in all
    (it was once per worker), no batch built privately, and the batches of 0 workers."""
    want = twins_of_0_workers[0] + twins_of_0_workers[1]
    loader = make_loader(_twins(graphs), num_workers=workers, shared_pools=True, persistent_workers=True)
    got = _epochs(loader, 2)
    assert all_batches_equal(want, got)
    shared = loader.dataset.shared_pools
    assert isinstance(shared, SharedPools) and shared.workers == workers
    assert shared.decoded == 2 * GRAPHS and shared.private_batches == 0


def test_mel_segments_share_pools_across_passes_of_fresh_workers(mels: Path) -> None:
    """The ``mel`` view, workers started anew for each pass (new shared pools each time): the
    batches of 0 workers, each file decoded once per pass."""

    def stream() -> ShardStream:
        return ShardStream(mels, view="mel", batch_size=512, shuffle=True, seed=2, mix=128)

    want = _epochs(make_loader(stream(), num_workers=0), 2)
    loader = make_loader(stream(), num_workers=2, shared_pools=True, persistent_workers=False)
    got = []
    for e in range(2):
        loader.set_epoch(e)
        got += [{k: v.clone() for k, v in b.items()} for b in loader]
        assert loader.dataset.shared_pools.decoded == 300 and loader.dataset.shared_pools.private_batches == 0
    assert all_batches_equal(want, got)


def test_too_few_regions_fall_back_to_private_decoding(graphs: Path, twins_of_0_workers: list[list[dict]]) -> None:
    """With one shared region (a batch touching two pools cannot fit), workers build those batches
    from their private stores: the batches do not change, and no worker waits for ever."""
    want = twins_of_0_workers[0]
    loader = make_loader(_twins(graphs), num_workers=2, shared_pools=True, persistent_workers=True)
    big = loader.dataset.shared_pools
    small = SharedPools(big.fields, big.pool_size, 1, 2, big.lock)
    loader.dataset.shared_pools = small  # before the (persistent) workers start
    got = _epochs(loader, 1)
    assert all_batches_equal(want, got)
    assert small.private_batches > 0 and 0 < small.decoded


def _payload(root: Path, field: str) -> tuple[int, int]:
    """(offset, size) in shard 0's tar of ``field``'s payload of the shard's middle record, from the
    sidecar index (``.idx.npy``, or one zstd frame when the shard packs records)."""
    import io

    import numpy as np
    import zstandard

    from cachebuild.format import read_manifest

    m = read_manifest(root)
    raw = (root / m.shards[0].index).read_bytes()
    index = np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(raw) if m.shards[0].index.endswith(".zst") else raw))
    entry = index[len(index) // 2, [f.name for f in m.fields].index(field)]
    return int(entry["offset"]), int(entry["size"])


def test_a_corrupt_pool_fails_cleanly_in_every_worker(graphs: Path, tmp_path: Path) -> None:
    """A pool whose decode raises frees its region: the worker waiting for it gives up and decodes
    (and fails) itself; the loader raises the one-line error and nothing hangs."""
    from cachebuild.errors import ShardCorruptError
    from cachebuild.format import read_manifest

    root = tmp_path / "c"
    shutil.copytree(graphs, root)
    tar = root / read_manifest(root).shards[0].name
    data = bytearray(tar.read_bytes())
    off, size = _payload(root, "base")  # a field the twins view reads, in the middle of shard 0
    data[off + size // 4 : off + size // 4 + 64] = bytes(64)  # zeros in the middle of its zstd frame
    tar.write_bytes(bytes(data))
    loader = make_loader(_twins(root), num_workers=2, shared_pools=True)
    t0 = time.monotonic()
    with pytest.raises(ShardCorruptError) as info:
        for _ in loader:
            pass
    assert time.monotonic() - t0 < 120
    assert "\n" not in str(info.value) and read_manifest(root).shards[0].name in str(info.value)


def test_views_without_pools_get_none(graphs: Path) -> None:
    """Only views that keep pools decoded get shared pools (graphs: per-batch blocks), and only
    with 2 or more workers."""
    assert make_loader(ShardStream(graphs, view="graphs", batch_size=32), num_workers=2, shared_pools=True).dataset.shared_pools is None
    assert make_loader(_twins(graphs), num_workers=1, shared_pools=True).dataset.shared_pools is None
    assert make_loader(_twins(graphs), num_workers=2, shared_pools=True).dataset.shared_pools is not None
    assert make_loader(_twins(graphs), num_workers=2, shared_pools=False).dataset.shared_pools is None


def test_auto_shares_only_when_workers_outnumber_free_cores(graphs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto (``shared_pools=None``): shared when the workers and the main process outnumber the
    usable cores (decoding once frees CPU), private with a core to spare for each worker (sharing
    would only make workers wait on each other)."""
    import loaders.loader as loader_mod

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 2)
    assert loader_mod.share_pools(None, 2) and loader_mod.share_pools(None, 8)
    assert make_loader(_twins(graphs), num_workers=2).dataset.shared_pools is not None
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 16)
    assert loader_mod.share_pools(None, 16) and not loader_mod.share_pools(None, 15) and not loader_mod.share_pools(None, 2)
    assert make_loader(_twins(graphs), num_workers=2).dataset.shared_pools is None
    assert loader_mod.share_pools(True, 2) and not loader_mod.share_pools(False, 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 ranks on this node (torchrun): 8 x (2 + 1) > 16 cores
    assert loader_mod.share_pools(None, 2) and not loader_mod.share_pools(None, 1)


def test_spawned_workers_share_pools_too(graphs: Path, twins_of_0_workers: list[list[dict]]) -> None:
    """Workers started with ``spawn`` (not ``fork``) receive the shared memory and the lock through
    the DataLoader's pickling: the same batches, each graph decoded once."""
    want = twins_of_0_workers[0]
    loader = make_loader(_twins(graphs), num_workers=2, shared_pools=True, multiprocessing_context="spawn")
    got = _epochs(loader, 1)
    assert all_batches_equal(want, got)
    assert loader.dataset.shared_pools.decoded == GRAPHS and loader.dataset.shared_pools.private_batches == 0


def test_a_cache_that_grows_under_persistent_workers_keeps_sharing(graphs: Path, tmp_path: Path) -> None:
    """Persistent workers read a cache across an append: the new generation's plan cuts its pools
    anew (240 graphs, mix 64: 4 pools of 60; 340: 6 of 56-57). The batches are those of 0 workers
    and the grown epoch's pools are still decoded once in the shared regions (they were sized for
    one plan's exact pool size, so every later batch went back to per-worker decoding)."""
    from cachebuild.jobs import run_causal_build

    root = tmp_path / "c"
    shutil.copytree(graphs, root)
    ref = make_loader(_twins(root), num_workers=0)
    loader = make_loader(_twins(root), num_workers=2, shared_pools=True, persistent_workers=True)
    shared = loader.dataset.shared_pools
    want, got, decoded = [], [], []
    for e in range(2):
        if e == 1:
            run_causal_build(None, [], {"graphs": 100, "build.shard_mb": 0.6, "seed": 0}, root, workers=1, progress=False, append=True)
        for lo, out in ((ref, want), (loader, got)):
            lo.set_epoch(e)
            out += [{k: v.clone() for k, v in b.items()} for b in lo]
        decoded.append(shared.decoded)
    assert all_batches_equal(want, got)
    assert decoded[0] >= GRAPHS and decoded[1] - decoded[0] >= GRAPHS + 100 and shared.private_batches == 0


def test_a_failed_decode_frees_every_region_its_batch_claimed(graphs: Path) -> None:
    """A batch touching two pools not decoded yet claims a region for each; when the first decode
    raises, the second must not stay claimed: the next worker needing that batch decodes both itself
    (the second region was left ``DECODING``: that worker waited ``wait_s`` for a decode nobody
    ran, then built the batch privately, and the region was never reusable again)."""
    import multiprocessing

    import numpy as np

    stream = _twins(graphs)
    plan = stream.plan(0)
    items = next(it for it in map(plan.batch, range(plan.batches)) if len(np.unique(it.pool)) == 2)
    store = stream.view.store
    fields = {k: (tuple(d.shape), np.dtype(d.dtype).name) for k, d in store.fields.items()}
    pools = SharedPools(fields, plan.pool_size, plan.pool_span + 2, 2, multiprocessing.Lock(), wait_s=1.0)
    zero = [k for k, f in store.fields.items() if f.zero]

    def corrupt(ids, rows, arrays) -> None:
        raise OSError("a corrupt frame")

    def decode(ids, rows, arrays) -> None:
        store.decode(stream._shards(), ids, arrays, rows)

    with pytest.raises(OSError):
        pools.take(items, 0, corrupt, zero)
    got = pools.take(items, 1, decode, zero)  # before the fix: a 1 s wait for the second pool, then None
    assert got is not None
    pools.done()
    assert pools.private_batches == 0 and pools.decoded == sum(len(items.pool_records(q)) for q in np.unique(items.pool).tolist())
    arrays, where = got
    store.attach(None, 0)
    mine, rows = store.rows(stream._shards(), items)  # the private store's decode: the same records
    assert all(np.array_equal(arrays[k][where], mine[k][rows]) for k in arrays)


def test_workers_help_decode_a_pool_instead_of_waiting(graphs: Path) -> None:
    """Two workers (threads here, each with its own handle on the same shared memory) need one pool at
    once: the second takes parts of the first's decode instead of waiting for all of it. Both get the
    rows a private store decodes, and each record is decoded once in all."""
    import copy
    import threading

    import numpy as np

    stream = _twins(graphs)
    plan = stream.plan(0)
    items = next(it for it in map(plan.batch, range(plan.batches)) if len(np.unique(it.pool)) == 1)
    store = stream.view.store
    fields = {k: (tuple(d.shape), np.dtype(d.dtype).name) for k, d in store.fields.items()}
    zero = [k for k, f in store.fields.items() if f.zero]
    pools = SharedPools(fields, plan.pool_size, plan.pool_span + 2, 2, threading.Lock(), wait_s=30.0, part_records=4)
    handles = [pools, copy.copy(pools)]
    parts: list[list[int]] = [[], []]
    got: list = [None, None]

    def run(w: int) -> None:
        shards = _twins(graphs)._shards()

        def decode(ids, rows, arrays) -> None:
            parts[w].append(len(ids))
            time.sleep(0.02)  # a slow part: the other worker arrives while parts are left
            store.decode(shards, ids, arrays, rows)

        got[w] = handles[w].take(items, w, decode, zero)
        handles[w].done()

    first = threading.Thread(target=run, args=(0,))
    first.start()
    time.sleep(0.01)
    second = threading.Thread(target=run, args=(1,))
    second.start()
    first.join(60)
    second.join(60)
    records = len(items.pool_records(int(items.pool[0])))
    assert parts[0] and parts[1], parts  # both decoded parts of the one pool
    assert sum(parts[0]) + sum(parts[1]) == records == pools.decoded and pools.private_batches == 0
    store.attach(None, 0)
    mine, rows = store.rows(stream._shards(), items)
    for arrays, where in got:
        assert all(np.array_equal(arrays[k][where], mine[k][rows]) for k in arrays)


@pytest.mark.parametrize("workers", [2, 3])
def test_pools_decoded_in_small_parts_give_the_batches_of_0_workers(graphs: Path, twins_of_0_workers: list[list[dict]], workers: int) -> None:
    """Real DataLoader workers with pools cut into parts of 5 records (12 per pool of 60): the
    batches of 0 workers, each graph decoded once per epoch, no batch built privately."""
    want = twins_of_0_workers[0] + twins_of_0_workers[1]
    loader = make_loader(_twins(graphs), num_workers=workers, shared_pools=True, persistent_workers=True)
    loader.dataset.shared_pools.part_records = 5  # before the (persistent) workers start
    got = _epochs(loader, 2)
    assert all_batches_equal(want, got)
    assert loader.dataset.shared_pools.decoded == 2 * GRAPHS and loader.dataset.shared_pools.private_batches == 0
