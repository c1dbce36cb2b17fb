"""torchdata's ``StatefulDataLoader`` tried as a user would (review): states saved at an epoch's end,
in a later epoch, before any batch, with snapshots every n steps, per rank.

Found: with ``num_workers=0``, a state saved after a whole epoch resumed with the epoch after next
(one epoch skipped silently): on such a state torchdata makes an iterator to restore it, drops it
unread and makes another, and each ``iter()`` of the stream started an epoch. A direct pass now
begins at its first ``next()``.
"""

from __future__ import annotations

import pytest

from loader_fixtures import all_batches_equal, causal_cache, real_record_ids  # noqa: F401
from loaders import ShardStream

sdl = pytest.importorskip("torchdata.stateful_dataloader")


def _stream(root, **kw):
    return ShardStream(root, view="graphs", batch_size=16, seed=7, **kw)


def _epochs(root, n: int, **kw) -> list[list]:
    out = []
    for e in range(n):
        s = _stream(root, **kw)
        s.set_epoch(e)
        out.append(list(s))
    return out


def _loader(root, workers: int, **kw):
    return sdl.StatefulDataLoader(_stream(root, **kw), batch_size=None, num_workers=workers, persistent_workers=workers > 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_saved_at_an_epochs_end_resumes_with_the_next_epoch(causal_cache, workers):
    e0, e1, e2 = _epochs(causal_cache, 3)
    dl = _loader(causal_cache, workers)
    assert all_batches_equal(list(dl), e0)
    state = dl.state_dict()
    fresh = _loader(causal_cache, workers)
    fresh.load_state_dict(state)
    assert all_batches_equal(list(fresh), e1), "an epoch skipped or repeated after a state saved at an epoch's end"
    assert all_batches_equal(list(fresh), e2)


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_second_epoch_and_unread_states_resume_exactly(causal_cache, workers):
    e0, e1, e2 = _epochs(causal_cache, 3)
    dl = _loader(causal_cache, workers)
    list(dl)
    it = iter(dl)
    head = [next(it) for _ in range(9)]
    state = dl.state_dict()
    del it
    fresh = _loader(causal_cache, workers)
    fresh.load_state_dict(state)
    assert all_batches_equal(head + list(fresh), e1) and all_batches_equal(list(fresh), e2)
    unread = _loader(causal_cache, workers)  # a state taken before any batch
    state = unread.state_dict()
    fresh = _loader(causal_cache, workers)
    fresh.load_state_dict(state)
    assert all_batches_equal(list(fresh), e0)


@pytest.mark.parametrize("workers", [0, 2])
def test_snapshots_every_n_steps_and_ranks_resume_exactly(causal_cache, workers):
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        (want,) = _epochs(causal_cache, 1, rank=rank, world_size=world)
        kw = dict(batch_size=None, num_workers=workers, persistent_workers=workers > 0, snapshot_every_n_steps=4)
        dl = sdl.StatefulDataLoader(_stream(causal_cache, rank=rank, world_size=world), **kw)
        it = iter(dl)
        head = [next(it) for _ in range(5)]  # inside the epoch: a rank of 2 has 7 batches (13 global)
        state = dl.state_dict()
        del it
        fresh = sdl.StatefulDataLoader(_stream(causal_cache, rank=rank, world_size=world), **kw)
        fresh.load_state_dict(state)
        got = head + list(fresh)
        assert all_batches_equal(got, want), f"rank {rank} of {world}"
        assert len(set(real_record_ids(got))) == len(real_record_ids(got))
