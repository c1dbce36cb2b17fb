"""The epoch plan as pure functions: grids over counts, batch sizes, ranks, workers; hypothesis round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.plan import (
    EpochPlan,
    epoch_order,
    num_batches,
    rank_batches,
    steps_per_rank,
)
from loaders.world import World

COUNTS = [np.array([8] * 25), np.array([5, 0, 7, 1, 13]), np.array([1]), np.array([313] * 15 + [305])]


@pytest.mark.parametrize("counts", COUNTS, ids=lambda c: f"{len(c)}shards")
@pytest.mark.parametrize("window", [1, 3, None])
def test_epoch_order_is_a_deterministic_permutation(counts, window):
    total = int(counts.sum())
    a = epoch_order(counts, seed=7, epoch=2, window=window)
    assert a.dtype == np.int64 and a.shape == (total,)
    assert np.array_equal(np.sort(a), np.arange(total))
    assert np.array_equal(a, epoch_order(counts, seed=7, epoch=2, window=window))
    assert np.array_equal(epoch_order(counts, 7, 2, shuffle=False), np.arange(total))


def test_epoch_order_changes_with_epoch_and_seed():
    counts = np.array([8] * 25)
    base = epoch_order(counts, 0, 0)
    assert not np.array_equal(base, epoch_order(counts, 0, 1))
    assert not np.array_equal(base, epoch_order(counts, 1, 0))


@pytest.mark.parametrize("window", [1, 2, 4])
def test_windows_keep_records_of_their_shards_together(window):
    counts = np.array([10] * 12)
    order = epoch_order(counts, 3, 0, window=window)
    shard = order // 10
    for w in range(len(counts) // window):
        part = shard[w * window * 10 : (w + 1) * window * 10]
        assert len(np.unique(part)) == window  # exactly the window's shards, each whole
        assert all((part == s).sum() == 10 for s in np.unique(part))


def test_full_shuffle_mixes_shards():
    counts = np.array([8] * 200)
    shard = epoch_order(counts, 0, 0, window=None) // 8
    assert (shard[1:] == shard[:-1]).mean() < 0.02


@pytest.mark.parametrize("total", [0, 1, 7, 64, 65, 1000])
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_steps_and_cover_every_batch_once(total, batch, world, drop_last):
    T = num_batches(total, batch, drop_last)
    per_rank = [rank_batches(T, world, r, 0, drop_last) for r in range(world)]
    steps = {len(p) for p in per_rank}
    assert len(steps) == 1 and steps.pop() == steps_per_rank(T, world, 0, drop_last)
    ids = np.concatenate(per_rank)
    real = ids[ids < T]
    assert np.array_equal(np.sort(real), np.arange(T) if not drop_last else np.arange(len(real)))
    if drop_last:
        assert (ids < T).all()
    else:
        assert np.array_equal(np.sort(real), np.arange(T))


def _epoch_items(plan: EpochPlan, world: int, start: int = 0) -> list[tuple[int, int, bool]]:
    """(record, item, pad) of every row the ranks yield from ``start``, in global batch order."""
    out = []
    ids = sorted(np.concatenate([plan.rank_batches(world, r, start) for r in range(world)]).tolist())
    for b in ids:
        it = plan.batch(b)
        out += list(zip(it.records.tolist(), it.items.tolist(), it.is_pad.tolist()))
    return out


@pytest.mark.parametrize("items_per_record", [None, "twins"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [5, 64])
def test_every_item_once_per_epoch_plus_flagged_padding(items_per_record, world, batch):
    counts = np.array([6, 4, 0, 9])
    per = None if items_per_record is None else np.arange(19) % 4 * 3  # some records have no items
    plan = EpochPlan.build(counts, per, batch, seed=1, epoch=0)
    rows = _epoch_items(plan, world)
    real = sorted((r, i) for r, i, pad in rows if not pad)
    expected = sorted((r, i) for r in range(19) for i in range(1 if per is None else int(per[r])))
    assert real == expected
    assert len(rows) % batch == 0 and len(rows) // batch % world == 0


def test_batch_items_invariants():
    per = np.array([3, 0, 5, 1, 2, 7])
    plan = EpochPlan.build(np.array([4, 2]), per, 16, seed=0, epoch=3)
    for b in range(plan.batches + 2):
        it = plan.batch(b)
        assert np.array_equal(it.records, it.unique[it.slot])
        assert np.array_equal(np.unique(it.records), it.unique)
        assert (it.items < per[it.records]).all()
        for g, row in enumerate(it.first):
            assert it.slot[row] == g and (it.slot[:row] != g).all()


def test_rows_are_mixed_within_a_batch_and_deterministic():
    per = np.full(10, 50)
    a = EpochPlan.build(np.array([10]), per, 100, seed=0, epoch=0).batch(1)
    b = EpochPlan.build(np.array([10]), per, 100, seed=0, epoch=0).batch(1)
    assert np.array_equal(a.records, b.records) and np.array_equal(a.items, b.items)
    assert (a.records[1:] != a.records[:-1]).mean() > 0.3  # rows of several graphs interleave
    plain = EpochPlan.build(np.array([10]), per, 100, seed=0, epoch=0, shuffle=False).batch(1)
    assert plain.items.tolist() == list(range(50)) * 2


@pytest.mark.parametrize("world_before,world_after", [(2, 3), (3, 2), (1, 4), (2, 2)])
@pytest.mark.parametrize("steps_done", [0, 1, 3])
def test_elastic_resume_loses_and_repeats_nothing(world_before, world_after, steps_done):
    counts = np.array([7, 7, 7, 5])
    per = np.arange(26) % 5 + 1
    plan = EpochPlan.build(counts, per, 8, seed=2, epoch=1)
    T = plan.batches
    done = [b for r in range(world_before) for b in plan.rank_batches(world_before, r)[:steps_done].tolist()]
    position = min(steps_done, plan.steps(world_before)) * world_before
    rest = [b for r in range(world_after) for b in plan.rank_batches(world_after, r, position).tolist()]
    real = sorted(b for b in done + rest if b < T)
    assert real == list(range(T))
    assert len({len(plan.rank_batches(world_after, r, position)) for r in range(world_after)}) == 1


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    per_max=st.integers(0, 6),
    batch=st.integers(1, 20),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    data=st.data(),
)
def test_plan_partition_properties(counts, per_max, batch, world, workers, drop_last, window, seed, epoch, data):
    counts = np.array(counts)
    n = int(counts.sum())
    per = None if per_max == 0 else np.array(data.draw(st.lists(st.integers(0, per_max), min_size=n, max_size=n)), dtype=np.int64)
    plan = EpochPlan.build(counts, per, batch, seed, epoch, True, window, drop_last)
    total = n if per is None else int(per.sum())
    assert plan.total == total
    if total == 0:
        assert plan.batches == 0
        return
    # each worker of each rank: its batches interleave back into the rank's sequence
    seen = []
    for r in range(world):
        rank_ids = plan.rank_batches(world, r)
        parts = [rank_ids[w::workers] for w in range(workers)]  # what ShardStream gives worker w
        assert sum(len(p) for p in parts) == len(rank_ids) == plan.steps(world)
        seen += [b for p in parts for b in p.tolist()]
    rows = [(int(rr), int(i)) for b in seen for rr, i, pad in zip(plan.batch(b).records, plan.batch(b).items, plan.batch(b).is_pad) if not pad]
    assert len(rows) == len(set(rows))  # nothing twice
    if not drop_last:
        expected = {(r, i) for r in range(n) for i in range(1 if per is None else int(per[r]))}
        assert set(rows) == expected  # everything once
    else:
        assert len(rows) == plan.steps(world) * world * batch
    # a world-independent global order: rank r at step t holds global batch t*W + r
    if plan.steps(world):
        assert plan.rank_batches(world, world - 1)[0] == world - 1


def test_world_value_object():
    w = World(1, 3, 0, 2)
    assert (w.rank, w.world_size, w.worker, w.num_workers) == (1, 3, 0, 2)
    with pytest.raises(ValueError):
        World(3, 3)
    with pytest.raises(ValueError):
        World(0, 1, 2, 2)


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError):
        epoch_order(np.array([3]), -1, 0)
    with pytest.raises(ValueError):
        epoch_order(np.array([3]), 0, 0, window=0)
    with pytest.raises(ValueError):
        num_batches(10, 0, False)
    with pytest.raises(ValueError):
        rank_batches(10, 2, 2)
