"""Acceptance audit of issues 3 and 12 (sixteenth session): what a user's loop met that the suite had not.

Each test failed before its fix (see docs/DECISIONS.md, "Acceptance audit of issues 3 and 12").
"""

from __future__ import annotations

import pytest

from loader_fixtures import all_batches_equal, causal_cache  # noqa: F401
from loaders import ShardStream

sdl = pytest.importorskip("torchdata.stateful_dataloader")


def _stream(root):
    return ShardStream(root, view="graphs", batch_size=16, seed=3)


def _epochs(root, n: int) -> list[list]:
    out = []
    for e in range(n):
        s = _stream(root)
        s.set_epoch(e)
        out.append(list(s))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_state_taken_on_an_epochs_last_batch_finishes_that_epoch(causal_cache, workers):
    """The usual loop saves inside ``for batch in dl`` : on the epoch's last batch the pass is still open.
    torchdata resumes such a state with the (empty) rest of that epoch, then the next epoch, as it does
    for any dataset; at 0 workers the stream skipped the rest and ran the next epoch at once, so a
    loop counting epochs trained one more epoch than the uninterrupted run (2 workers were right)."""
    e0, e1 = _epochs(causal_cache, 2)
    dl = sdl.StatefulDataLoader(_stream(causal_cache), batch_size=None, num_workers=workers)
    it = iter(dl)
    for _ in range(len(e0)):
        next(it)
    state = dl.state_dict()
    fresh = sdl.StatefulDataLoader(_stream(causal_cache), batch_size=None, num_workers=workers)
    fresh.load_state_dict(state)
    assert list(fresh) == [], "the rest of the saved epoch is empty"
    assert all_batches_equal(list(fresh), e1), "then the next epoch, as in the uninterrupted run"


def test_a_state_whose_position_is_past_its_epochs_end_is_refused(causal_cache):
    """An edited or foreign state with a position beyond the epoch was taken as "epoch finished": the
    next pass silently ran the next epoch. It is now one line naming the position and the epoch's end."""
    from loaders import make_loader

    loader = make_loader(_stream(causal_cache), num_workers=0)
    state = loader.state_dict()
    end = len(loader)  # world of 1: global batches = batches per rank
    loader.load_state_dict({**state, "position": end})  # a state on the epoch's last batch: fine
    with pytest.raises(ValueError, match=rf"position {end + 1} is past its epoch's end \({end} global batches"):
        loader.load_state_dict({**state, "position": end + 1})
    with pytest.raises(ValueError, match="invalid world_size: 0"):
        loader.load_state_dict({**state, "world_size": 0})


def test_torchdata_nodes_iterable_wrapper_resumes_mid_epoch_exactly(causal_cache):
    """torchdata's newer API (``torchdata.nodes``): the stream is ``Stateful``, so ``IterableWrapper`` saves
    and loads it, through a ``Prefetcher`` too; a state taken on an epoch's last batch starts the next epoch
    (the stream's rule, README)."""
    tn = pytest.importorskip("torchdata.nodes")

    def loader():
        return tn.Loader(tn.Prefetcher(tn.IterableWrapper(_stream(causal_cache)), prefetch_factor=4))

    e0, e1 = _epochs(causal_cache, 2)
    for k in (5, len(e0)):
        it = iter(first := loader())
        head = [next(it) for _ in range(k)]
        fresh = loader()
        fresh.load_state_dict(first.state_dict())
        rest = list(fresh)
        assert all_batches_equal(head + rest, e0) if k < len(e0) else all_batches_equal(rest, e1)


@pytest.mark.parametrize("bad", ["a", "2", 2.5, True])
def test_make_loader_refuses_a_num_workers_that_is_not_a_whole_number(causal_cache, bad):
    """``num_workers="a"`` said only ``invalid literal for int() with base 10``; ``2.5`` became 2 workers and
    ``True`` one, without a word. Now one line naming the argument and the value."""
    from loaders import make_loader

    with pytest.raises(ValueError, match=rf"^num_workers must be a whole number >= 0, got {bad!r}"):
        make_loader(_stream(causal_cache), num_workers=bad)


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind, context", [("make", "fork"), ("plain", "fork"), ("plain", "spawn")])
def test_a_stream_made_before_spawning_the_ranks_splits_the_cache(causal_cache, tmp_path, kind, context):
    """Lightning's ``ddp_spawn`` (and ``torch.multiprocessing.spawn(main, args=(stream,))``) hands every rank a
    pickled copy of one stream: its pass block, shared memory, was shared by all ranks, so every rank's workers
    read the pass one rank handed out: 2 ranks trained on the same half of the cache (482 of 1,000 graphs, each
    twice). Each rank now takes its own copy of the block before it hands out a pass or forks its workers.
    And a plain DataLoader's spawned workers (no ``RANK`` in the environment: ``torch.multiprocessing.spawn``)
    took themselves for rank 0 of 1, so every rank read the whole cache; they now get the world of the rank
    that pickled the stream for them."""
    from loader_fixtures import free_port, spawn_ranks
    from shared_stream_run import rank_main

    stream = ShardStream(causal_cache, view="graphs", batch_size=16, seed=5)
    world = 2
    results = spawn_ranks(rank_main, (world, free_port(), stream, str(tmp_path), kind, context), world, tmp_path, 200)
    records = stream.manifest.records
    for e in range(2):
        ids = sorted(i for r in results for i in r["epochs"][e])
        assert ids == list(range(records)), f"epoch {e}: {len(set(ids))} distinct records of {records} across the ranks, {len(ids)} read"


def test_a_direct_pass_closes_like_the_generator_it_was(causal_cache):
    """``iter(stream)`` was a generator; the pass object torchdata restores keeps its ``close()``."""
    stream = _stream(causal_cache)
    it = iter(stream)
    next(it)
    it.close()
    assert list(it) == []
    unstarted = iter(stream)
    unstarted.close()
    assert list(unstarted) == []
    assert len(list(stream)) == len(stream)
