"""Review of the pool decode order of :class:`loaders.TwinsContext` (``loaders/pool_schedule.py``).

Every case checks the invariant (``ctx.expand(pool batch)`` equals the default ``twins`` batch bit for
bit, at most ``pool_span + REGIONS_AHEAD`` pools held) and, where the pools are at least one consumer step long, that
no batch after a pass's first finds a pool it needs neither held nor being decoded ahead: DDP ranks
reading every other (third) batch, their padding batches, epoch jumps, passes cut short, resumes, odd
cache sizes, mixtures, a grown cache; and the failures: a decode process killed, more decode processes
than graphs in a pool, a decode that fails ahead of need.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import numpy as np
import pytest

from cachebuild.errors import ShardCorruptError
from cachebuild.format import read_manifest
from loader_fixtures import build_causal, causal_cache, free_port, spawn_ranks  # noqa: F401
from loaders import Mixture, ShardStream, TwinsContext, make_loader
from loaders.pool_schedule import batch_pools, upcoming_pools
from loaders.twins_context import REGIONS_AHEAD
from mixture_fixtures import levels  # noqa: F401
from test_twins_pool import _same
from twins_schedule_run import schedule_rank_main

KW = {"view": "twins", "batch_size": 1400, "seed": 4, "mix": 64}  # 65 batches of 4 pools: an odd count (padding for 2 ranks)


def _missing(ctx: TwinsContext, plan, b: int) -> list[int]:
    """The pools batch ``b`` needs that ``ctx`` neither holds nor decodes ahead now."""
    ready = set(ctx.held()) | {ctx.ahead}
    return [q for q in batch_pools(plan, b).tolist() if (plan.fingerprint(), q) not in ready]


def _consume(pool: ShardStream, full: ShardStream, ctx: TwinsContext, seq: list, firsts: set = frozenset()) -> list:
    """Expand each ``(epoch, batch)`` of ``seq``, bit for bit the default view's, within ``pool_span + REGIONS_AHEAD``
    pools; returns the batches (but the first and ``firsts``, the first of a pass) that waited for a decode."""
    waited = []
    for i, (e, b) in enumerate(seq):
        plan = pool.plan(e)
        if i and (e, b) not in firsts and _missing(ctx, plan, b):
            waited.append((e, b, _missing(ctx, plan, b)))
        assert _same(ctx.expand(pool.batch(b, e)), full.batch(b, e)), (e, b)
        assert ctx.max_held <= plan.pool_span + REGIONS_AHEAD
    return waited


def _rank_seq(stream: ShardStream, world: int, rank: int, epochs: int) -> list:
    """The ``(epoch, global batch)`` a rank of ``world`` reads, padding batches included, then the next epoch's first."""
    seq = [(e, int(b)) for e in range(epochs) for b in stream.plan(e).rank_batches(world, rank)]
    return seq + [(epochs, rank)]


def _gone(ctx: TwinsContext) -> tuple[str, list]:
    """The ``/dev/shm`` segment and processes of a process context (to check after close)."""
    dec = ctx._decoder
    return dec._shm.name, list(dec._procs)  # type: ignore[union-attr]


def _closed(shm: str, procs: list) -> None:
    for p in procs:
        p.join(timeout=10)
        assert not p.is_alive()
    assert not os.path.exists(f"/dev/shm/{shm}")


@pytest.mark.parametrize("world,rank", [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)])
def test_a_ddp_rank_finds_every_pool_decoded_ahead_after_its_first_batch(causal_cache, world, rank):
    """A rank reads every ``world``-th batch (its padding batch past the epoch's end too): its next epoch's
    first pool is the one of its own first batch, and it does not decode the wrap pool of a batch it
    never reads (before: rank 1 of 2 decoded pool 1 after its padding batch and waited for pool 0)."""
    pool, full = ShardStream(causal_cache, compact="pool", **KW), ShardStream(causal_cache, **KW)
    plan = pool.plan(0)
    assert plan.batches % world and plan.pool_span == 2  # (padding batches for some ranks)
    assert min(np.diff(plan.pool_items)) >= world * plan.batch_size  # every pool is in some batch of every rank
    with TwinsContext(pool) as ctx:
        assert _consume(pool, full, ctx, _rank_seq(pool, world, rank, 2)) == []
        assert ctx.loads <= 2 * len(plan.pools) + 2  # each pool once an epoch and pool 0 again (wrap or padding); epoch 2's first two


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_gloo_ranks_find_every_pool_decoded_ahead_after_their_first_batch(causal_cache, tmp_path):
    """A real gloo world of 2 through ``make_loader`` (2 workers, persistent): each rank's context learns
    its stride from the batches and expands them bit for bit, with no wait after its first batch."""
    results = spawn_ranks(schedule_rank_main, (2, free_port(), str(causal_cache), str(tmp_path), KW), 2, tmp_path, 120)
    for res in results:
        assert all(same for _, _, same in res["batches"]), [x for x in res["batches"] if not x[2]][:3]
        assert res["waited"] == [] and res["max_held"] <= res["pool_span"] + REGIONS_AHEAD
        assert len(res["batches"]) == 2 * -(-ShardStream(causal_cache, compact="pool", **KW).plan(0).batches // 2)


def test_upcoming_pools_of_a_rank_follow_its_own_batches(causal_cache):
    plan = ShardStream(causal_cache, compact="pool", **KW).plan(0)
    pools, last = len(plan.pools) - 1, plan.batches - 1
    assert last % 2 == 0 and batch_pools(plan, last).tolist() == [pools - 1, 0]  # rank 0 of 2 reads the wrap batch
    assert upcoming_pools(plan, last - 2, 2, 9) == [0] and upcoming_pools(plan, last, 2, 9) == []
    assert batch_pools(plan, last + 1).tolist() == [0] and upcoming_pools(plan, last - 1, 2, 9) == [0]  # rank 1: its padding batch
    assert upcoming_pools(plan, last + 1, 2, 9) == []  # after its padding batch: the next epoch
    assert upcoming_pools(plan, last - 3, 3, 9) == [0] and upcoming_pools(plan, last + 1, 3, 9) == []  # rank 2 of 3: padding batch 65
    assert upcoming_pools(plan, 0, 1, 9) == list(range(1, pools)) and upcoming_pools(plan, 0, 1, 2) == [1, 2]  # (0: the batch's own)
    in1 = next(b for b in range(plan.batches) if batch_pools(plan, b).tolist() == [1])
    assert upcoming_pools(plan, in1, 1, 9) == list(range(2, pools)) + [0]  # then the wrap batch's pool 0 again


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_jumps_a_pass_cut_short_and_a_resume_through_the_loader(causal_cache, workers):
    """``set_epoch`` 0 -> 5 -> 2 (persistent workers), a pass broken after 3 batches and the next pass, then
    a mid-epoch resume into a fresh loader and context: bit for bit, and no wait after a pass's first batch."""
    pool, full = ShardStream(causal_cache, compact="pool", **KW), ShardStream(causal_cache, **KW)
    loader = make_loader(pool, num_workers=workers, persistent_workers=workers > 0)
    waited, passes = [], []
    with TwinsContext(loader) as ctx:
        for epoch, cut in [(0, None), (5, 3), (None, None), (2, 20)]:
            if epoch is not None:
                loader.set_epoch(epoch)
            read = []
            for i, batch in enumerate(loader):
                _, e, b = ctx.meta(batch)
                if i and _missing(ctx, pool.plan(e), b):
                    waited.append((e, b))
                assert _same(ctx.expand(batch), full.batch(b, e)), (e, b)
                assert ctx.max_held <= pool.plan(e).pool_span + REGIONS_AHEAD
                read.append((e, b))
                if i + 1 == cut:
                    break
            passes.append(read)
        state = loader.state_dict()
    assert [(p[0], len(p)) for p in passes] == [((0, 0), 65), ((5, 0), 3), ((6, 0), 65), ((2, 0), 20)]
    fresh = make_loader(ShardStream(causal_cache, compact="pool", **KW), num_workers=workers)
    fresh.load_state_dict(state)
    rest = []
    with TwinsContext(fresh) as ctx:
        for i, batch in enumerate(fresh):
            _, e, b = ctx.meta(batch)
            if i and _missing(ctx, pool.plan(e), b):
                waited.append((e, b))
            assert _same(ctx.expand(batch), full.batch(b, e)), (e, b)
            rest.append((e, b))
    assert rest == [(2, b) for b in range(20, 65)] and waited == []


def _odd(causal_cache, batch_size: int, mix: int, drop_last: bool = False):
    kw = dict(KW, batch_size=batch_size, mix=mix, drop_last=drop_last)
    return ShardStream(causal_cache, compact="pool", **kw), ShardStream(causal_cache, **kw)


@pytest.mark.parametrize(
    "batch_size,mix,drop_last,decoder,processes,what",
    [
        (100_000, 64, False, "thread", 1, "a batch is the whole epoch: every pool"),
        (4_000, 2, False, "process", 3, "the last batch wraps onto 2 pools or more; more processes than graphs in a pool"),
        (5_000, 8, False, "thread", 1, "pool_span 3: a small mix, big batches"),
        (1_400, 256, False, "process", 2, "a single pool"),
        (1_400, 32, True, "thread", 1, "drop_last"),
    ],
)
def test_caches_of_odd_sizes_expand_bit_for_bit(causal_cache, batch_size, mix, drop_last, decoder, processes, what):
    pool, full = _odd(causal_cache, batch_size, mix, drop_last)
    plan = pool.plan(0)
    pools = len(plan.pools) - 1
    if "wraps" in what:
        assert len(batch_pools(plan, plan.batches - 1)) >= 3 and plan.pool_size < processes
    if "span" in what:
        assert plan.pool_span == 3
    seq = [(e, b) for e in range(2) for b in range(pool.plan(e).batches)]
    with TwinsContext(pool, decoder=decoder, processes=processes) as ctx:
        waited = _consume(pool, full, ctx, seq)
        shm = _gone(ctx) if decoder == "process" else None
    if shm:
        _closed(*shm)
    if min(np.diff(plan.pool_items)) >= batch_size and plan.batches > 1:  # pools at least a batch long: decoded in time
        assert waited == [], what
    assert pools >= 1


def test_more_decode_processes_than_graphs_in_a_pool(causal_cache):
    """Pools of 2 graphs and 3 processes: the third gets no share (an empty block crashed its process with
    SIGFPE in zstd, and the context then failed every batch)."""
    pool, full = _odd(causal_cache, 1400, 2)
    assert pool.plan(0).pool_size == 2
    with TwinsContext(pool, decoder="process", processes=3) as ctx:
        _consume(pool, full, ctx, [(0, b) for b in range(25)])
        shm = _gone(ctx)
    _closed(*shm)


@pytest.mark.parametrize("when", ["idle", "ahead"])
def test_a_killed_decode_process_is_one_line_every_time_and_never_wrong_rows(causal_cache, when):
    """One of 2 decode processes killed (between decodes, or while one is under way): every batch after is
    either the default one, bit for bit, or the same one-line error (before: a BrokenPipeError, and then a
    region that looked decoded: wrong rows)."""
    pool, full = ShardStream(causal_cache, compact="pool", **KW), ShardStream(causal_cache, **KW)
    plan = pool.plan(0)
    ctx = TwinsContext(pool, decoder="process", processes=2)
    ctx.expand(pool.batch(0))
    if when == "idle":
        ctx._drain()
    shm, procs = _gone(ctx)
    os.kill(procs[1].pid, signal.SIGKILL)
    errors = []
    for b in range(1, plan.batches):
        try:
            got = ctx.expand(pool.batch(b))
        except RuntimeError as e:
            errors.append((b, str(e)))
            continue
        assert _same(got, full.batch(b)), b
    assert errors and all(m == errors[0][1] for _, m in errors)
    assert "TwinsContext decode process 2 of 2" in errors[0][1] and "exit code -9" in errors[0][1] and "\n" not in errors[0][1]
    assert errors[-1][0] == plan.batches - 1  # broken for good: the wrap batch's pool 0 is not decoded again
    ctx.close()
    _closed(shm, procs)


def _damaged(causal_cache, tmp_path):
    """A copy of the cache whose last shard is damaged; its record ids."""
    root = tmp_path / "cache"
    shutil.copytree(causal_cache, root)
    shards = read_manifest(root).shards
    shard = root / shards[-1].name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 20000] = bytes(20000)
    shard.write_bytes(bytes(data))
    total = sum(s.records for s in shards)
    return root, set(range(total - shards[-1].records, total))


@pytest.mark.parametrize("decoder", ["thread", "process"])
def test_a_decode_that_fails_ahead_is_raised_only_by_a_batch_that_needs_it(causal_cache, tmp_path, decoder):
    """Pool 1 damaged, decoded (and failing) ahead while pool 0's batches are read: ``close`` does not raise it,
    nor does a batch of another epoch whose pools are sound; the batch that needs pool 1 does, every time."""
    root, bad = _damaged(causal_cache, tmp_path)
    pool, full = ShardStream(root, compact="pool", **KW), ShardStream(causal_cache, **KW)

    def sound(e: int, q: int) -> bool:
        return not bad & set(pool.plan(e).pool_records(q).tolist())

    e = next(e for e in range(50) if sound(e, 0) and not sound(e, 1))
    jump = next(j for j in range(50) if j != e and sound(j, 0))
    plan = pool.plan(e)
    before = [b for b in range(plan.batches) if batch_pools(plan, b).tolist() == [0]]
    for end in ("close", "jump", "ask"):
        ctx = TwinsContext(pool, decoder=decoder)
        for b in before:
            assert _same(ctx.expand(pool.batch(b, e)), full.batch(b, e))
        assert ctx.ahead == (plan.fingerprint(), 1)
        deadline = time.monotonic() + 10
        while not ctx._pending[2].done() and time.monotonic() < deadline:  # type: ignore[index]
            time.sleep(0.01)
        if end == "jump":
            assert _same(ctx.expand(pool.batch(0, jump)), full.batch(0, jump))
        if end == "ask":
            for _ in range(2):
                with pytest.raises(ShardCorruptError, match=r"shard-000\d\d\.tar, record \d+") as err:
                    ctx.expand(pool.batch(before[-1] + 1, e))
                assert "\n" not in str(err.value)
        ctx.close()  # (before: raised the error of the pool decoded ahead)


def test_a_mixture_read_by_a_ddp_rank(levels):
    """A mixture's pools, rank 1 of 2 (its padding batch included): bit for bit, no wait after its first batch."""
    kw = dict(KW, batch_size=500, mix=32)

    def stream(**extra):
        return ShardStream(Mixture(levels, weights=[1, 1, 1], epoch_size=150), **dict(kw, **extra))

    pool, full = stream(compact="pool"), stream()
    plan = pool.plan(0)
    assert min(np.diff(plan.pool_items)) >= 2 * plan.batch_size
    with TwinsContext(pool, decoder="process", processes=2) as ctx:
        assert _consume(pool, full, ctx, _rank_seq(pool, 2, 1, 2)) == []
        shm = _gone(ctx)
    _closed(*shm)


@pytest.mark.parametrize("decoder,processes", [("thread", 1), ("process", 3)])
def test_a_cache_grown_between_epochs(tmp_path, decoder, processes):
    """Epoch 0 on 120 graphs (the next epoch's first pool decoded ahead on them), 80 more appended, epoch 1 on
    the 200: bit for bit (that pool of the old generation is never used), nothing waits after epoch 1's first."""
    from cachebuild.jobs import run_causal_build

    root = build_causal(tmp_path / "grow", graphs=120)
    pool, full = ShardStream(root, compact="pool", **KW), ShardStream(root, **KW)
    with TwinsContext(pool, decoder=decoder, processes=processes) as ctx:  # (each process gets the new shard set)
        assert _consume(pool, full, ctx, [(0, b) for b in range(pool.plan(0).batches)]) == []
        old = pool.plan(1).fingerprint()
        assert (old, 0) in ctx.held() + [ctx.ahead]
        run_causal_build(None, [], {"graphs": 80, "build.shard_mb": 0.5, "seed": 0}, root, workers=1, progress=False, append=True)
        pool.set_epoch(1)
        full.set_epoch(1)
        assert read_manifest(root).records == 200 and pool.plan(1).fingerprint() != old
        assert _consume(pool, full, ctx, [(1, b) for b in range(pool.plan(1).batches)]) == []


@pytest.mark.parametrize("decoder", ["thread", "process"])
def test_without_prefetch_nothing_is_decoded_ahead(causal_cache, decoder):
    pool, full = ShardStream(causal_cache, compact="pool", **KW), ShardStream(causal_cache, **KW)
    seq = _rank_seq(pool, 2, 1, 1)
    with TwinsContext(pool, prefetch=False, decoder=decoder) as ctx:
        waited = _consume(pool, full, ctx, seq)
        assert ctx.ahead is None and ctx._next is None  # (the next epoch is not even planned)
        # each pool once (pool 0 kept for the padding batch: needed before the others held), epoch 1's first
        assert ctx.loads == len(pool.plan(0).pools) and len(waited) == ctx.loads - 1


def test_a_wait_for_a_decode_process_interrupted_by_ctrl_c_leaves_the_pipes_in_step(causal_cache):
    """Ctrl-C while ``load`` waits for a decode process (a notebook cell stopped, then run again): the reply
    left in the pipe is read before the next request's (before: the next request took it for its own and
    its pool was read before it was decoded)."""
    pool, full = ShardStream(causal_cache, compact="pool", **KW), ShardStream(causal_cache, **KW)
    plan = pool.plan(0)
    first1 = next(b for b in range(plan.batches) if 1 in batch_pools(plan, b).tolist())
    ctx = TwinsContext(pool, decoder="process", prefetch=False)
    for b in range(first1):
        ctx.expand(pool.batch(b))
    shm, procs = _gone(ctx)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    os.kill(procs[0].pid, signal.SIGSTOP)  # (the decode cannot finish before the interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            ctx.expand(pool.batch(first1))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.kill(procs[0].pid, signal.SIGCONT)
    for b in range(first1, plan.batches):
        assert _same(ctx.expand(pool.batch(b)), full.batch(b)), b
    ctx.close()
    _closed(shm, procs)
