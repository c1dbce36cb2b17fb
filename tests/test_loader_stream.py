"""ShardStream and make_loader: determinism, worker-count independence, epochs, shuffle quality, errors."""

from __future__ import annotations

import gc

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachebuild.format.index import load_index

from cachebuild.errors import ManifestError, ShardCorruptError
from cachebuild.format import read_manifest
from cachebuild.format.names import record_key
from loader_fixtures import Reference, batches_equal, causal_cache, causal_cache_raw  # noqa: F401
from loaders import ShardStream, make_loader


def _ids(batches) -> list[int]:
    return [r for b in batches for r in b["record_id"].tolist()]


def _real(batches) -> list[int]:
    return [r for b in batches for r in b["record_id"][~b["is_pad"]].tolist()]


def test_same_seed_and_epoch_give_the_same_batches(causal_cache):
    a = list(ShardStream(causal_cache, view="graphs", batch_size=32, seed=9))
    b = list(ShardStream(causal_cache, view="graphs", batch_size=32, seed=9))
    assert len(a) == len(b) == 7
    assert all(batches_equal(x, y) for x, y in zip(a, b))


def test_epochs_and_seeds_change_the_order(causal_cache):
    s = ShardStream(causal_cache, view="graphs", batch_size=32, seed=0)
    e0 = _real(s)
    s.set_epoch(1)
    e1 = _real(s)
    other = _real(ShardStream(causal_cache, view="graphs", batch_size=32, seed=1))
    assert e0 != e1 and e0 != other
    assert sorted(e0) == sorted(e1) == list(range(200))
    s.set_epoch(0)
    assert _real(s) == e0  # an epoch is a pure function of (seed, epoch)


def test_a_second_pass_runs_the_next_epoch_unless_set_epoch(causal_cache):
    s = ShardStream(causal_cache, view="graphs", batch_size=64, seed=0)
    e0, e1 = _ids(s), _ids(s)
    assert s.epoch == 1 and e0 != e1
    s.set_epoch(0)
    assert _ids(s) == e0  # set_epoch says otherwise: epoch 0 again


def test_shuffle_quality(causal_cache):
    ref = Reference(causal_cache)
    s = ShardStream(causal_cache, view="graphs", batch_size=50, seed=0, window=16)
    ids = _real(s)
    shards = np.array([ref.shard_of(r) for r in ids])
    assert (shards[1:] == shards[:-1]).mean() < 0.15  # ~1/16 expected
    assert abs(np.corrcoef(ids, np.arange(len(ids)))[0, 1]) < 0.3  # not close to the stored order
    plain = _real(ShardStream(causal_cache, view="graphs", batch_size=50, shuffle=False))
    assert plain == list(range(200))


@pytest.mark.parametrize("view,batch,kw", [("graphs", 24, {}), ("twins", 1500, {"compact": True})])
def test_batches_are_the_same_for_any_worker_count(causal_cache, view, batch, kw):
    ref = list(ShardStream(causal_cache, view=view, batch_size=batch, seed=2, **kw))
    for nw in (1, 2, 3):
        stream = ShardStream(causal_cache, view=view, batch_size=batch, seed=2, **kw)
        got = list(make_loader(stream, num_workers=nw, prefetch_factor=2))
        assert len(got) == len(ref)
        assert all(batches_equal(x, y) for x, y in zip(ref, got)), nw


def test_persistent_workers_follow_set_epoch(causal_cache):
    stream = ShardStream(causal_cache, view="graphs", batch_size=40, seed=0)
    loader = make_loader(stream, num_workers=2, prefetch_factor=2)
    expect = {}
    for e in (0, 1):
        direct = ShardStream(causal_cache, view="graphs", batch_size=40, seed=0)
        direct.set_epoch(e)
        expect[e] = _ids(direct)
    for e in (0, 1, 0):
        stream.set_epoch(e)  # on the stream: the loader sees it
        got = _ids(loader)
        assert got == expect[e]
        assert len(loader) == len(got) // 40


def test_loader_yields_fixed_shapes_and_len(causal_cache):
    stream = ShardStream(causal_cache, view="twins", batch_size=1000, compact=True)
    loader = make_loader(stream, num_workers=0)
    shapes = stream.layout.shapes()
    n = 0
    for batch in loader:
        n += 1
        assert {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in batch.items()} == {k: (s, d) for k, (s, d) in shapes.items()}
    assert n == len(loader) == len(stream)


def test_explicit_rank_split_covers_the_cache(causal_cache):
    ids, pads, steps = [], 0, set()
    for r in range(3):
        batches = list(ShardStream(causal_cache, view="graphs", batch_size=16, rank=r, world_size=3))
        steps.add(len(batches))
        for b in batches:
            ids += b["record_id"][~b["is_pad"]].tolist()
            pads += int(b["is_pad"].sum())
    assert len(steps) == 1
    assert sorted(ids) == list(range(200))
    assert pads == steps.pop() * 3 * 16 - 200


def test_drop_last_drops_instead_of_padding(causal_cache):
    batches = list(ShardStream(causal_cache, view="graphs", batch_size=32, drop_last=True))
    assert len(batches) == 200 // 32
    assert not any(b["is_pad"].any() for b in batches)
    assert len(set(_ids(batches))) == 6 * 32 == len(_ids(batches))


# ---------------------------------------------------------------- errors


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _payload_span(root: Path, record: int, field: str) -> tuple[Path, int, int]:
    """(shard path, offset, size) of one member's payload."""
    m = read_manifest(root)
    ref = Reference(root)
    s = ref.shard_of(record)
    idx = load_index(root / m.shards[s].index)
    e = idx[record - m.shards[s].first_record, m.field_names.index(field)]
    return root / m.shards[s].name, int(e["offset"]), int(e["size"])


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_payload_names_shard_and_record(causal_cache, tmp_path, num_workers):
    root = _copy(causal_cache, tmp_path / "c")
    path, off, size = _payload_span(root, 37, "int")
    _flip(path, off + size // 2)
    stream = ShardStream(root, view="graphs", batch_size=50, shuffle=False)
    with pytest.raises(ShardCorruptError) as err:
        list(make_loader(stream, num_workers=num_workers, prefetch_factor=2))
    assert path.name in str(err.value) and record_key(37) in str(err.value)


def test_corrupt_raw_payload_is_caught_with_crc(causal_cache_raw, tmp_path):
    root = _copy(causal_cache_raw, tmp_path / "c")
    path, off, size = _payload_span(root, 12, "base")
    _flip(path, off + size - 3)
    stream = ShardStream(root, view="graphs", batch_size=50, shuffle=False, verify="crc")
    with pytest.raises(ShardCorruptError, match=f"{path.name}.*{record_key(12)}.*crc32"):
        list(stream)


def test_truncated_shard_is_refused_naming_shard_and_record(causal_cache, tmp_path):
    root = _copy(causal_cache, tmp_path / "c")
    path, off, _ = _payload_span(root, 53, "delta")
    with open(path, "r+b") as fh:
        fh.truncate(off + 10)
    with pytest.raises(ShardCorruptError, match=f"{path.name}.*truncated.*record {record_key(53)}"):
        ShardStream(root, view="graphs", batch_size=8)


def test_shard_truncated_after_start_fails_in_the_worker_with_its_name(causal_cache, tmp_path):
    root = _copy(causal_cache, tmp_path / "c")
    stream = ShardStream(root, view="graphs", batch_size=50, shuffle=False)
    path, off, _ = _payload_span(root, 101, "int")
    with open(path, "r+b") as fh:
        fh.truncate(off)
    with pytest.raises(ShardCorruptError, match=f"{path.name}.*record {record_key(101)}"):
        list(make_loader(stream, num_workers=2, prefetch_factor=2))


def test_corrupt_index_is_refused(causal_cache, tmp_path):
    root = _copy(causal_cache, tmp_path / "c")
    m = read_manifest(root)
    idx_path = root / m.shards[3].index
    _flip(idx_path, idx_path.stat().st_size - 5)
    stream = ShardStream(root, view="graphs", batch_size=200, shuffle=False)
    with pytest.raises(ShardCorruptError, match=m.shards[3].index):
        list(stream)


def test_missing_shard_and_manifest_are_clear_errors(causal_cache, tmp_path):
    root = _copy(causal_cache, tmp_path / "c")
    m = read_manifest(root)
    (root / m.shards[5].name).unlink()
    with pytest.raises(ManifestError, match=f"{m.shards[5].name}.*missing"):
        ShardStream(root, view="graphs", batch_size=8)
    (root / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="no cache manifest"):
        ShardStream(root, view="graphs", batch_size=8)
    with pytest.raises(ManifestError, match="does not exist"):
        ShardStream(tmp_path / "nowhere", batch_size=8)


def test_slots_that_fit_dev_shm_make_a_loader_quietly(causal_cache):
    """(Too little /dev/shm is one clear error: tests/test_loader_user_contract.py, on a real 64 MiB tmpfs.)"""
    stream = ShardStream(causal_cache, view="graphs", batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = make_loader(stream, num_workers=2, prefetch_factor=4)
    assert loader.num_workers == 2


def test_make_loader_defaults(causal_cache):
    stream = ShardStream(causal_cache, view="graphs", batch_size=8)
    loader = make_loader(stream)
    assert loader.batch_size is None and loader.num_workers >= 1
    assert loader.persistent_workers and loader.prefetch_factor == 4
    assert loader.pin_memory == __import__("torch").cuda.is_available()
    with pytest.raises(TypeError):
        make_loader([1, 2, 3])


# ---------------------------------------------------------------- reusable slots between workers and main


def test_slot_protocol():
    import gc

    from loaders.slots import SlotLease, SlotRings

    rings = SlotRings(workers=1, slots=2, nbytes=100, timeout_s=0.05)
    assert rings.acquire(0) is not None and rings.acquire(0) is not None  # slots 0, 1
    assert rings.acquire(0) is None  # slot 0 still busy: the worker falls back to a fresh buffer
    rings.release(0, 1)
    data, lease = rings.acquire(0)  # slot 1 (round robin), free again
    assert (lease.slot, data.numel()) == (1, 100)
    del lease  # the worker's own lease never frees its slot
    gc.collect()
    assert rings.acquire(0) is None and rings.acquire(0) is None
    main_side = SlotLease(rings, 0, 0, armed=True)  # the main process's: frees when dropped unread
    del main_side
    gc.collect()
    assert rings.acquire(0) is not None


def test_a_batch_of_retired_rings_unpickles_inert():
    """Torch's pin-memory thread can unpickle a queued batch after its loader was let go of (a
    trainer leaving its loop at exit); seen on an H100 as "Exception in thread ... no live loader".
    Such a batch is an inert RetiredBatch; a batch naming rings never seen still raises."""
    import gc

    from loaders.slots import RetiredBatch, SlotRings, _rebuild, register

    class Owner:
        pass

    owner, rings = Owner(), SlotRings(workers=1, slots=2, nbytes=100)
    register(rings, owner)
    live = _rebuild(rings.token, 0, 0, {})
    assert not isinstance(live, RetiredBatch)
    del live, owner
    gc.collect()
    assert isinstance(_rebuild(rings.token, 0, 1, {}), RetiredBatch)
    with pytest.raises(RuntimeError, match="no live loader"):
        _rebuild("0" * 32, 0, 0, {})


@pytest.mark.parametrize("persistent", [True, False])
def test_broken_off_passes_free_their_slots(causal_cache, persistent):
    direct = ShardStream(causal_cache, view="graphs", batch_size=16, seed=4)
    direct.set_epoch(3)  # three broken-off passes: epochs 0, 1, 2
    expect = list(direct)
    stream = ShardStream(causal_cache, view="graphs", batch_size=16, seed=4)
    loader = make_loader(stream, num_workers=2, prefetch_factor=3, persistent_workers=persistent)
    for cut in (2, 0, 5):
        for i, _ in enumerate(loader):
            if i == cut:
                break
    got = list(loader)
    assert all(batches_equal(a, b) for a, b in zip(expect, got)) and len(got) == len(expect)
    rings = loader.dataset.slot_rings
    del got, _  # batches still held may be views of their slots (zero copy): dropped, they free them
    gc.collect()
    assert all(int(buf[0]) == 0 for ring in rings.buffers for buf in ring)  # every slot free again
