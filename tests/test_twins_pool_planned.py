"""``compact="pool"`` batches through ``make_loader(..., num_workers=N)``: planned on the loader's hand-over
thread in the trainer's process, not in worker processes (a pool batch is a few index arrays; its graphs
are decoded by the consumer's :class:`loaders.TwinsContext` in that process, so a worker only added a
process round trip per batch). The batches, the resume state and a superseded pass behave exactly as
with workers; a ``worker_init_fn`` of the caller's still gets its workers."""

from __future__ import annotations

import psutil
import pytest
import torch

from cachebuild.errors import PassSupersededError
from loader_fixtures import causal_cache  # noqa: F401
from loaders import ShardStream, make_loader

KW = {"view": "twins", "batch_size": 1500, "seed": 4, "mix": 64, "compact": "pool"}


def _digest(batches) -> list[tuple]:
    return [tuple((k, v.dtype, tuple(v.shape), v.numpy().tobytes()) for k, v in b.items()) for b in batches]


def _children() -> int:
    return len(psutil.Process().children(recursive=True))


def _note_worker(worker_id: int) -> None:
    pass


def test_pool_batches_with_workers_are_planned_here_and_equal_those_of_zero_workers(causal_cache):
    zero = make_loader(ShardStream(causal_cache, **KW), num_workers=0)
    want = []
    for epoch in range(2):
        zero.set_epoch(epoch)
        want += _digest(zero)
    for persistent, pin in ((False, False), (True, False), (False, True)):  # (pinning: only where CUDA is)
        loader = make_loader(ShardStream(causal_cache, **KW), num_workers=2, persistent_workers=persistent, pin_memory=pin)
        before, got = _children(), []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                assert _children() == before  # no worker process was started for these batches
                got += _digest([batch])
        assert got == want, (persistent, pin)
        assert loader.stream.view.compact == "pool" and loader.num_workers == 2


def test_a_mid_epoch_state_resumes_exactly_and_a_superseded_pass_stops(causal_cache):
    whole = make_loader(ShardStream(causal_cache, **KW), num_workers=2)
    whole.set_epoch(1)
    want = _digest(whole)
    loader = make_loader(ShardStream(causal_cache, **KW), num_workers=2)
    loader.set_epoch(1)
    it = iter(loader)
    head = _digest([next(it) for _ in range(5)])
    state = loader.state_dict()
    assert state["batches"] == 5  # what the trainer received, not what the thread planned ahead
    fresh = make_loader(ShardStream(causal_cache, **KW), num_workers=3)  # another worker count: the same plan
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    assert head + _digest(fresh) == want
    loader.load_state_dict(state)
    with pytest.raises(PassSupersededError):
        next(it)


def test_a_worker_init_fn_of_the_callers_still_gets_worker_processes(causal_cache):
    zero = make_loader(ShardStream(causal_cache, **KW), num_workers=0)
    want = _digest(zero)
    loader = make_loader(ShardStream(causal_cache, **KW), num_workers=2, worker_init_fn=_note_worker)
    it = iter(loader)
    first = next(it)
    assert _children() >= 2  # the workers the caller asked for
    got = _digest([first]) + _digest(it)
    assert got == want
    assert all(isinstance(v, torch.Tensor) for v in first.values())
