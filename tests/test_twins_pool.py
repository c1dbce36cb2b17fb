"""``twins`` with ``compact="pool"``: batches that point into the epoch's pools, and the
:class:`loaders.TwinsContext` that holds those pools in the consumer and expands them.

The invariant, bit for bit: ``ctx.expand(pool batch) == expand_compact(compact batch) ==``
the default view's batch, for every batch of 2 epochs, through ``make_loader`` at 0 and 2
workers, after a mid-epoch resume, under a gloo DDP world of 2, and on a mixture.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from cachebuild.errors import CacheMismatchError, ShardCorruptError
from cachebuild.format import read_manifest
from loader_fixtures import causal_cache, free_port, spawn_ranks  # noqa: F401
from loaders import Mixture, ShardStream, TwinsContext, expand_compact, make_loader
from loaders.twins_context import REGIONS_AHEAD, batch_pools
from mixture_fixtures import levels  # noqa: F401
from twins_pool_run import pool_rank_main

KW = {"view": "twins", "batch_size": 1500, "seed": 4, "mix": 64}
DEADLINE_S = 150


def _same(got: dict, want: dict) -> bool:
    """Same keys in the same order, dtypes, shapes and bytes."""
    if list(got) != list(want):
        return False
    return all(got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]) for k in want)


def _check_epoch(root, ctx: TwinsContext, batches, epoch: int, first: int = 0) -> list[int]:
    """Every batch (pool mode) expands to the default view's and to the compact view's expanded; returns the batch numbers."""
    full, compact = ShardStream(root, **KW), ShardStream(root, compact=True, **KW)
    numbers = []
    for batch in batches:
        _, e, b = ctx.meta(batch)
        assert e == epoch
        want = full.batch(b, e)
        assert _same(ctx.expand(batch), want), f"epoch {e} batch {b}"
        exp = expand_compact(compact.batch(b, e))
        assert set(exp) == set(want) and all(exp[k].dtype == want[k].dtype and torch.equal(exp[k], want[k]) for k in want)
        numbers.append(b)
    assert numbers == list(range(first, first + len(numbers)))
    return numbers


def test_pool_batches_are_small_and_the_rows_those_of_the_plan(causal_cache):
    pool = ShardStream(causal_cache, compact="pool", **KW)
    compact = ShardStream(causal_cache, compact=True, **KW)
    assert pool.layout.nbytes < 20 * KW["batch_size"] + 1024
    assert compact.layout.nbytes > 40 * pool.layout.nbytes
    plan = pool.plan(0)
    for b in (0, 7, plan.batches - 1):
        items, got = plan.batch(b), pool.batch(b)
        records = plan.pool_records  # the row's graph, found through its pool
        ids = np.array([records(int(q))[int(i)] for q, i in zip(got["pool"], got["pool_index"])])
        assert np.array_equal(ids, items.records)
        assert got["plan"].tolist() == [plan.fingerprint(), 0, b]
        assert set(np.unique(got["pool"].numpy()).tolist()) <= set(batch_pools(plan, b).tolist())
        buf, arrays = pool.layout.allocate(False)  # the view's assemble of the plan's whole BatchItems: the same rows
        pool.view.assemble(pool._shards(), items, arrays)
        assert all(np.array_equal(arrays[k], got[k].numpy()) for k in got)


@pytest.mark.parametrize("workers,decoder,processes", [(0, "thread", 1), (2, "thread", 1), (0, "process", 1), (2, "process", 1), (0, "process", 2)])
def test_expand_equals_the_default_view_through_the_loader_for_two_epochs(causal_cache, workers, decoder, processes):
    stream = ShardStream(causal_cache, compact="pool", **KW)
    loader = make_loader(stream, num_workers=workers, persistent_workers=workers > 0)
    with TwinsContext(loader, decoder=decoder, processes=processes) as ctx:
        for epoch in range(2):
            numbers = _check_epoch(causal_cache, ctx, loader, epoch)
            assert len(numbers) == stream.plan(epoch).batches
        pools = len(stream.plan(0).pools) - 1
        # each pool once per epoch, pool 0 again for the last batch's padding unless still held (this cache's
        # pools fit the regions, so it is), and epoch 2's first pool decoded ahead
        assert stream.plan(0).pool_span + REGIONS_AHEAD >= pools and ctx.loads == 2 * pools + 1


def test_a_mid_epoch_resume_expands_the_same_remaining_batches(causal_cache):
    loader = make_loader(ShardStream(causal_cache, compact="pool", **KW), num_workers=2)
    loader.set_epoch(1)
    it = iter(loader)
    with TwinsContext(loader) as ctx:
        _check_epoch(causal_cache, ctx, [next(it) for _ in range(23)], epoch=1)
    state = loader.state_dict()
    del it
    fresh = make_loader(ShardStream(causal_cache, compact="pool", **KW), num_workers=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    with TwinsContext(fresh) as ctx:  # a new consumer: nothing held, the plan says where to start
        numbers = _check_epoch(causal_cache, ctx, fresh, epoch=1, first=23)
    assert numbers[-1] == fresh.stream.plan(1).batches - 1


def test_a_mixture_expands_like_its_compact_and_default_views(levels):
    mix = dict(KW, batch_size=500, mix=32)

    def stream(**kw):
        return ShardStream(Mixture(levels, weights=[1, 1, 1], epoch_size=150), **dict(mix, **kw))

    pool, full, compact = stream(compact="pool"), stream(), stream(compact=True)
    with TwinsContext(pool) as ctx:
        for epoch in range(2):
            for b in range(pool.plan(epoch).batches):
                want = full.batch(b, epoch)
                assert _same(ctx.expand(pool.batch(b, epoch)), want), (epoch, b)
                exp = expand_compact(compact.batch(b, epoch))
                assert set(exp) == set(want) and all(torch.equal(exp[k], want[k]) for k in want)


@pytest.mark.parametrize("decoder", ["thread", "process"])
def test_the_context_holds_at_most_pool_span_plus_two_pools_and_decodes_ahead(causal_cache, decoder):
    stream = ShardStream(causal_cache, compact="pool", **KW)
    plan = stream.plan(0)
    pools = len(plan.pools) - 1
    assert pools >= 3 and plan.pool_span == 2
    with TwinsContext(stream, decoder=decoder) as ctx:
        first = stream.batch(0)
        ctx.load(first)
        assert ctx.held() == [(plan.fingerprint(), 0)] and ctx.ahead == (plan.fingerprint(), 1)  # the next pool, in the background
        for b in range(plan.batches):
            ctx.load(stream.batch(b))
            assert len(ctx.held()) + (ctx.ahead is not None) <= plan.pool_span + REGIONS_AHEAD and ctx.max_held <= plan.pool_span + REGIONS_AHEAD
        # every pool once, pool 0 again for the last batch's padding (unless it is still held), the next epoch's first
        assert pools + 1 <= ctx.loads <= pools + 2
        nxt, loads = stream.plan(1), ctx.loads
        assert (nxt.fingerprint(), 0) in ctx.held() + [ctx.ahead]  # decoded ahead, across the epoch's end
        ctx.load(stream.batch(0, 1))
        assert ctx.loads == loads + 1 and ctx.ahead == (nxt.fingerprint(), 1)  # only the next pool is decoded
        assert ctx.max_held <= plan.pool_span + REGIONS_AHEAD
    with TwinsContext(stream, prefetch=False) as ctx:
        ctx.load(first)
        assert ctx.ahead is None and ctx.max_held == 1


@pytest.mark.parametrize("decoder,processes", [("thread", 1), ("process", 2)])
def test_after_a_pass_starts_every_pool_a_batch_needs_was_decoded_ahead(causal_cache, decoder, processes):
    """No batch but a pass's first waits for a decode it did not see coming: the epoch's next pools, the pool
    its last batch wraps back to (decoded again, ahead of that batch), and the next epoch's first pool are all
    asked for before the batch that needs them, within ``pool_span + REGIONS_AHEAD`` regions."""
    stream = ShardStream(causal_cache, compact="pool", **KW)
    with TwinsContext(stream, decoder=decoder, processes=processes) as ctx:
        for epoch in range(3):
            plan = stream.plan(epoch)
            for b in range(plan.batches):
                if (epoch, b) != (0, 0):
                    ready = set(ctx.held()) | {ctx.ahead}
                    missing = [q for q in batch_pools(plan, b).tolist() if (plan.fingerprint(), q) not in ready]
                    assert not missing, f"epoch {epoch} batch {b}: pools {missing} not decoded ahead"
                ctx.load(stream.batch(b, epoch))
                assert ctx.max_held <= plan.pool_span + REGIONS_AHEAD


def test_pool_schedule_never_lets_go_of_a_pool_needed_sooner(causal_cache):
    from loaders.pool_schedule import next_use, pick_region, upcoming_pools

    plan = ShardStream(causal_cache, compact="pool", **KW).plan(0)
    fp, nfp, pools, last = plan.fingerprint(), 9, len(plan.pools) - 1, plan.batches - 1
    mid = next(b for b in range(plan.batches) if batch_pools(plan, b).tolist() == [1, 2])
    assert upcoming_pools(plan, mid, 1, 9) == list(range(3, pools)) + [0]  # the next pools, then the wrap-around
    assert upcoming_pools(plan, last, 1, 9) == []  # after the wrapped batch: this epoch is done
    order = [(fp, 3), (fp, 0), (nfp, 0)]  # next, wrap-around, next epoch
    uses = [next_use(k, order) for k in [(fp, 3), (fp, 0), (nfp, 0), (fp, 1), (5, 0), None]]
    assert uses == [1, 2, 3, -1, -1, -1]  # needed in that order; free
    held = [(fp, 3), (fp, 0), (nfp, 0), (fp, 2)]
    assert pick_region(held, {(fp, 2)}, uses[:3] + [0]) == 2  # the one needed last
    assert pick_region(held + [(fp, 1)], {(fp, 2)}, uses[:3] + [0, -1]) == 4  # a free one first


def test_a_batch_of_another_plan_is_a_one_line_error(causal_cache):
    other = ShardStream(causal_cache, compact="pool", **dict(KW, seed=5))
    batch = ShardStream(causal_cache, compact="pool", **KW).batch(3, 1)
    with TwinsContext(other) as ctx:
        with pytest.raises(CacheMismatchError, match=r"twins batch of epoch 1 was planned as 0x[0-9a-f]+, but .* plans epoch 1 as 0x[0-9a-f]+") as err:
            ctx.expand(batch)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("decoder", ["thread", "process"])
def test_a_failed_pool_decode_reaches_the_caller_every_time(causal_cache, tmp_path, decoder):
    """A damaged shard: the decoder's error (the reader's own, from a thread or a process) is raised by
    ``load``, and again on the next ask (never a region that looks decoded)."""
    root = tmp_path / "cache"
    shutil.copytree(causal_cache, root)
    shard = root / read_manifest(root).shards[0].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 20000] = bytes(20000)
    shard.write_bytes(bytes(data))
    stream = ShardStream(root, compact="pool", **KW)
    with TwinsContext(stream, decoder=decoder) as ctx:
        with pytest.raises(ShardCorruptError, match="shard-00000.tar") as err:
            for b in range(stream.plan(0).batches):
                ctx.load(stream.batch(b))
        with pytest.raises(ShardCorruptError):
            ctx.load(stream.batch(b))
    assert "\n" not in str(err.value)


def test_pool_mode_needs_pools(causal_cache):
    with pytest.raises(ValueError, match="compact='pool' needs mixing pools"):
        ShardStream(causal_cache, compact="pool", **dict(KW, mix=None))
    unshuffled = ShardStream(causal_cache, compact="pool", shuffle=False, **KW)
    with pytest.raises(ValueError, match="compact='pool' needs a mixed plan"):
        unshuffled.batch(0)
    with pytest.raises(ValueError, match="compact='pool' needs a mixed plan"):
        TwinsContext(unshuffled)
    with pytest.raises(ValueError, match="decoder must be one of"):
        TwinsContext(ShardStream(causal_cache, compact="pool", **KW), decoder="fork")
    for bad in (0, 2.0, True, "2"):
        with pytest.raises(ValueError, match="processes must be a whole number from 1 to 64"):
            TwinsContext(ShardStream(causal_cache, compact="pool", **KW), decoder="process", processes=bad)
    with pytest.raises(ValueError, match="processes=2 needs decoder='process'"):
        TwinsContext(ShardStream(causal_cache, compact="pool", **KW), processes=2)
    with pytest.raises(ValueError, match="TwinsContext needs a ShardStream"):
        TwinsContext(ShardStream(causal_cache, compact=True, **KW))


@pytest.mark.dist
@pytest.mark.timeout(DEADLINE_S + 60)
def test_ddp_ranks_expand_their_batches_of_the_global_plan(causal_cache, tmp_path):
    world = 2
    results = spawn_ranks(pool_rank_main, (world, free_port(), str(causal_cache), str(tmp_path), 2), world, tmp_path, DEADLINE_S)
    for res in results:
        assert all(same for _, _, same in res["batches"]), [x for x in res["batches"] if not x[2]][:3]
        assert res["max_held"] <= res["pool_span"] + REGIONS_AHEAD
    batches = ShardStream(causal_cache, compact="pool", **dict(KW, batch_size=1200, seed=6)).plan(0).batches
    for epoch in range(2):
        got = sorted(b for res in results for e, b, _ in res["batches"] if e == epoch)
        steps = -(-batches // world)
        assert got == list(range(steps * world))  # every global batch once (the last ones whole padding for equal steps)
        for r, res in enumerate(results):
            assert [b for e, b, _ in res["batches"] if e == epoch] == list(range(r, steps * world, world))
