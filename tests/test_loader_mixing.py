"""Well-mixed batches, exactly once: the pooled plan as pure functions, and measured on real caches.

The plan mixes a many-item view's items across a pool of records
(:mod:`loaders.pools`); these tests check that it keeps every promise of the
plain plan (every item once, equal steps per rank, world-independent order,
resume at any position onto any world), that batches of real caches span many
records at the defaults (issue 9: a ``mel`` batch of 1,024 segments >= 512
files of a 4,096-file cache; a ``twins`` batch of 4,096 rows >= 256 graphs),
and that a process decodes each record a bounded number of times per epoch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loaders.views.mel  # noqa: F401  (registers "mel")
from loader_fixtures import batches_equal, build_causal, build_mel_from_arrays
from loaders import ShardStream
from loaders.plan import EpochPlan
from loaders.views.twins import auto_twin_chunk
from loaders.pools import chunk_lengths, max_records_per_batch, pool_bounds, pool_table


# ----------------------------------------------------------------- pure functions
def _rows(plan: EpochPlan, ids) -> list[tuple[int, int, bool]]:
    out = []
    for b in ids:
        it = plan.batch(int(b))
        out += list(zip(it.records.tolist(), it.items.tolist(), it.is_pad.tolist()))
    return out


def _expected(per: np.ndarray) -> set[tuple[int, int]]:
    return {(r, i) for r in range(len(per)) for i in range(int(per[r]))}


@pytest.mark.parametrize("records", [0, 1, 5, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize("mix", [1, 7, 1024])
def test_pool_bounds_cut_near_equal_pools(records, mix):
    b = pool_bounds(records, mix)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == records and (sizes <= mix).all()
    assert len(sizes) == max(1, -(-records // mix)) and sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_pool_table_permutes_every_item_of_the_pool_once(chunk):
    items = np.array([5, 0, 16, 1, 9])
    t = pool_table(items, 10, chunk, np.random.default_rng(0))
    rec, item = t.locate(np.arange(int(items.sum())))
    assert sorted(zip(rec.tolist(), item.tolist())) == sorted((10 + r, i) for r in range(5) for i in range(items[r]))
    starts = t.cum[:-1]
    assert ((item[starts] % chunk) == 0).all()  # chunks start at multiples of chunk
    assert chunk_lengths(items, chunk)[0].sum() == len(t.rec)


COUNTS = [np.array([6, 4, 0, 9]), np.array([40] * 5), np.array([1])]


@pytest.mark.parametrize("counts", COUNTS, ids=lambda c: f"{len(c)}shards")
@pytest.mark.parametrize("mix", [1, 3, 16, 1000])
@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (3, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_mixed_plan_every_item_once_equal_steps(counts, mix, chunk, batch, world, workers, drop_last):
    n = int(counts.sum())
    per = (np.arange(n) * 7) % 11  # 0..10 items, some records empty
    plan = EpochPlan.build(counts, per, batch, seed=5, epoch=2, drop_last=drop_last, mix=mix, chunk=chunk)
    if plan.total == 0:
        return
    steps = {len(plan.rank_batches(world, r)) for r in range(world)}
    assert steps == {plan.steps(world)}
    ids = [b for r in range(world) for w in range(workers) for b in plan.rank_batches(world, r)[w::workers].tolist()]
    rows = _rows(plan, ids)
    real = [(r, i) for r, i, pad in rows if not pad]
    assert len(real) == len(set(real))
    if drop_last:
        assert len(real) == plan.steps(world) * world * batch
    else:
        assert set(real) == _expected(per)
    assert all(plan.batch(b).pool is not None for b in ids[:3])


def test_mixed_plan_is_deterministic_and_changes_with_epoch():
    per = np.full(300, 80)
    a = EpochPlan.build(np.array([300]), per, 1024, 0, 0, mix=100).batch(5)
    b = EpochPlan.build(np.array([300]), per, 1024, 0, 0, mix=100).batch(5)
    c = EpochPlan.build(np.array([300]), per, 1024, 0, 1, mix=100).batch(5)
    assert np.array_equal(a.records, b.records) and np.array_equal(a.items, b.items)
    assert not np.array_equal(a.records, c.records)
    assert len(a.unique) > 90  # a batch spans most of its pool of 100 files, not 13


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 15), min_size=1, max_size=6),
    per_max=st.integers(1, 12),
    batch=st.integers(1, 40),
    mix=st.integers(1, 30),
    chunk=st.integers(1, 5),
    world_before=st.integers(1, 4),
    world_after=st.integers(1, 4),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_resume_anywhere_onto_another_world(counts, per_max, batch, mix, chunk, world_before, world_after, workers, seed, data):
    counts = np.array(counts)
    n = int(counts.sum())
    per = np.array(data.draw(st.lists(st.integers(0, per_max), min_size=n, max_size=n)), dtype=np.int64)
    plan = EpochPlan.build(counts, per, batch, seed, 1, mix=mix, chunk=chunk)
    if plan.total == 0:
        return
    steps_done = data.draw(st.integers(0, plan.steps(world_before)))
    done = [b for r in range(world_before) for b in plan.rank_batches(world_before, r)[:steps_done].tolist()]
    position = steps_done * world_before  # what state_dict() stores: global batches consumed
    rest = [b for r in range(world_after) for w in range(workers) for b in plan.rank_batches(world_after, r, position)[w::workers].tolist()]
    assert len({len(plan.rank_batches(world_after, r, position)) for r in range(world_after)}) == 1
    real = [(r, i) for r, i, pad in _rows(plan, done + rest) if not pad]
    assert sorted(real) == sorted(_expected(per))  # nothing lost, nothing twice
    # the bounds the views size their layouts and stores by
    for b in range(plan.batches):
        it = plan.batch(b)
        assert len(it.unique) <= max_records_per_batch(per, batch, chunk)
        assert len(np.unique(it.pool)) <= it.pool_span
        assert (it.pool_index < it.pool_size).all()


# ----------------------------------------------------------------- real caches
@pytest.fixture(scope="module")
def mel4k(tmp_path_factory):
    return build_mel_from_arrays(tmp_path_factory.mktemp("mel4k") / "cache", 4096)


@pytest.fixture(scope="module")
def causal1k(tmp_path_factory):
    return build_causal(tmp_path_factory.mktemp("causal1k") / "cache", graphs=1100, shard_mb=4)


def test_mel_batches_span_at_least_512_files_of_4096(mel4k):
    stream = ShardStream(mel4k, view="mel", batch_size=1024, seed=0)  # the defaults
    plan = stream.plan()
    spans = [len(plan.batch(b).unique) for b in range(plan.batches)]
    assert min(spans) >= 512, f"min {min(spans)} files per batch"
    for b in (0, 1, plan.batches // 2, plan.batches - 1):  # measured on the batches themselves
        assert len(np.unique(stream.batch(b)["file_id"].numpy())) == spans[b] >= 512
    old = ShardStream(mel4k, view="mel", batch_size=1024, seed=0, mix=None)
    assert len(np.unique(old.batch(3)["file_id"].numpy())) <= 1024 // 80 + 2  # what the clustered plan gave


def test_twins_batches_span_at_least_256_graphs(causal1k):
    for compact in (True, False):
        stream = ShardStream(causal1k, view="twins", batch_size=4096, seed=0, compact=compact)
        plan = stream.plan()
        spans = [len(plan.batch(b).unique) for b in range(plan.batches)]
        assert min(spans) >= 256, f"min {min(spans)} graphs per batch"
        for b in (0, plan.batches // 2, plan.batches - 1):
            batch = stream.batch(b)
            g = batch["ctx_record_id"][batch["graph_index"]] if compact else batch["graph_id"]
            assert len(np.unique(g.numpy())) == spans[b]


def test_twins_chunk_grows_with_the_batch_so_large_batches_stay_mixed_and_compact(causal1k):
    """B=16,384: chunk 32 (512 chunks per batch): still >= 256 graphs per batch, and a compact context of
    at most 513 graphs and worlds instead of the whole pool (which made batches 2.4x larger on the GPU)."""
    assert [auto_twin_chunk(b, 64) for b in (256, 4096, 4097, 8192, 16384, 65536, 10**6)] == [8, 8, 16, 16, 32, 64, 64]
    stream = ShardStream(causal1k, view="twins", batch_size=16384, seed=0, compact=True)
    assert stream.view.chunk == 32 and stream.view.g_max <= 513 and stream.view.w_max <= 513
    plan = stream.plan()
    assert min(len(plan.batch(b).unique) for b in range(plan.batches)) >= 256
    fixed = ShardStream(causal1k, view="twins", batch_size=16384, seed=0, compact=True, chunk=8)
    assert fixed.view.chunk == 8 and fixed.view.g_max > 1000  # an explicit chunk is kept
    with pytest.raises(ValueError):  # the chunk is part of the plan: a state from the other plan is refused
        stream.load_state_dict(fixed.state_dict())


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1)])
def test_a_process_decodes_each_record_a_bounded_number_of_times(mel4k, world, rank):
    stream = ShardStream(mel4k, view="mel", batch_size=1000, seed=1, rank=rank, world_size=world)
    store = stream.view.store
    counts = np.zeros(4096, np.int64)
    decode = store.decode

    def counting(shards, ids, arrays, dest):
        np.add.at(counts, ids, 1)
        decode(shards, ids, arrays, dest)

    store.decode = counting
    for epoch in (0, 1):
        counts[:] = 0
        stream.set_epoch(epoch)
        files = sum(len(np.unique(b["file_id"].numpy())) for b in stream)
        assert counts.max() <= 2  # once, twice where the last batch wraps to the first pool
        assert counts.sum() <= 4096 + stream.plan().pool_size
        assert files > 5 * counts.sum() / world  # without the store: a decode per file per batch


def test_a_new_epoch_drops_the_pools_of_the_last(mel4k):
    a = ShardStream(mel4k, view="mel", batch_size=1024, seed=2)
    a.batch(7, epoch=0)
    fresh = ShardStream(mel4k, view="mel", batch_size=1024, seed=2)
    assert batches_equal(a.batch(7, epoch=1), fresh.batch(7, epoch=1))


def test_mixing_options_are_checked_and_part_of_the_state(mel4k):
    with pytest.raises(ValueError, match="mix must be >= 1"):
        ShardStream(mel4k, view="mel", batch_size=64, mix=0)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        ShardStream(mel4k, view="mel", batch_size=64, chunk=0)
    state = ShardStream(mel4k, view="mel", batch_size=64, mix=512).state_dict()
    other = ShardStream(mel4k, view="mel", batch_size=64, mix=1024)
    with pytest.raises(ValueError, match="mix"):
        other.load_state_dict(state)
