"""The epoch rule everywhere a stream is iterated: each new pass is the next epoch unless told otherwise.

Plain torch DataLoaders (persistent workers and fresh ones), ``make_loader``,
and torchdata's ``StatefulDataLoader``: epochs advance by themselves, each
epoch yields every record exactly once, and a saved state resumes exactly.
"""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loader_fixtures import all_batches_equal, real_record_ids, batches_equal, causal_cache  # noqa: F401
from loaders import ShardStream, loader_state, make_loader
from loaders.loader import shutdown_workers


def _stream(root, **kw):
    return ShardStream(root, view="graphs", batch_size=16, seed=5, **kw)


def _epoch(root, epoch: int) -> list:
    s = _stream(root)
    s.set_epoch(epoch)
    return list(s)


@pytest.mark.parametrize("persistent", [True, False])
def test_plain_dataloader_advances_epochs_in_its_workers(causal_cache, persistent):
    e0, e1, e2 = (_epoch(causal_cache, e) for e in range(3))
    stream = _stream(causal_cache)
    dl = DataLoader(stream, batch_size=None, num_workers=2, persistent_workers=persistent)
    try:
        got0, got1 = list(dl), list(dl)
        assert all_batches_equal(got0, e0) and all_batches_equal(got1, e1)  # each epoch once, in the plan's order
        assert sorted(real_record_ids(got0)) == sorted(real_record_ids(got1)) == list(range(200)) and real_record_ids(got0) != real_record_ids(got1)
        assert stream.epoch == 1
        stream.set_epoch(0)  # reaches the workers too
        assert all_batches_equal(list(dl), e0)
        assert all_batches_equal(list(dl), e1)
        assert all_batches_equal(list(dl), e2)
    finally:
        shutdown_workers(dl)


def test_make_loader_advances_epochs_with_persistent_workers(causal_cache):
    loader = make_loader(_stream(causal_cache), num_workers=2, prefetch_factor=2)
    try:
        assert all_batches_equal(list(loader), _epoch(causal_cache, 0))
        assert all_batches_equal(list(loader), _epoch(causal_cache, 1))
        assert loader.state_dict()["epoch"] == 1
    finally:
        shutdown_workers(loader)


@pytest.mark.parametrize("cut", [0, 3, 13])
def test_plain_dataloader_state_resumes_exactly(causal_cache, cut):
    e1 = _epoch(causal_cache, 1)
    stream = _stream(causal_cache)
    dl = DataLoader(stream, batch_size=None, num_workers=2, persistent_workers=True, prefetch_factor=3)
    try:
        list(dl)  # epoch 0
        it = iter(dl)
        head = [next(it) for _ in range(cut)]
        state = loader_state(dl)
        assert (state["epoch"], state["position"]) == (1, cut)
        with pytest.raises(RuntimeError, match="loader_state"):
            stream.state_dict()  # never a silent position 0
    finally:
        shutdown_workers(dl)
    fresh = _stream(causal_cache)
    fresh.load_state_dict(state)
    dl2 = DataLoader(fresh, batch_size=None, num_workers=3, persistent_workers=True)
    try:
        tail = list(dl2)
        if cut == len(e1):  # saved at the epoch's end: the next pass is epoch 2
            assert all_batches_equal(tail, _epoch(causal_cache, 2))
        else:
            assert all_batches_equal(head + tail, e1)
            assert all_batches_equal(list(dl2), _epoch(causal_cache, 2))  # and then the next epoch
    finally:
        shutdown_workers(dl2)


def test_loader_state_refuses_what_it_cannot_know(causal_cache):
    dl = DataLoader(_stream(causal_cache), batch_size=None, num_workers=1, persistent_workers=False)
    list(dl)
    with pytest.raises(RuntimeError, match="persistent_workers=True"):
        loader_state(dl)
    with pytest.raises(TypeError, match="ShardStream"):
        loader_state(DataLoader(list(range(4))))
    direct = DataLoader(_stream(causal_cache), batch_size=None, num_workers=0)
    it = iter(direct)
    next(it), next(it)
    assert loader_state(direct)["position"] == 2
