"""Resumption: a state taken after any batch continues with the same remaining batches, bit for bit.

Cut points include batches still inside the workers' prefetch; resumes go to fresh loader
objects, a fresh process, other worker counts and other world sizes; nothing skipped is decoded.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from cachebuild.errors import CacheMismatchError
from loader_fixtures import batch_digest, batches_equal, build_causal, causal_cache, resume_digests_to_queue  # noqa: F401
from loaders import ShardStream, make_loader
from loaders.views import graphs as graphs_mod


def _stream(root, view="graphs", batch=16, **kw):
    return ShardStream(root, view=view, batch_size=batch, seed=11, **kw)


@pytest.fixture(scope="module")
def reference(causal_cache):
    """The uninterrupted epoch 1 of the graphs view (13 batches of 16)."""
    s = _stream(causal_cache)
    s.set_epoch(1)
    return list(s)


@pytest.mark.parametrize("cut", [0, 1, 2, 5, 12, 13])
@pytest.mark.parametrize("workers_before,workers_after", [(2, 2), (2, 3), (0, 2)])
def test_resume_equals_uninterrupted(causal_cache, reference, cut, workers_before, workers_after):
    loader = make_loader(_stream(causal_cache), num_workers=workers_before, prefetch_factor=4)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it) for _ in range(cut)]  # the workers have built up to 8 batches ahead by now
    state = loader.state_dict()
    assert (state["epoch"], state["position"], state["batches"]) == (1, cut, cut)
    del it
    fresh = make_loader(_stream(causal_cache), num_workers=workers_after, prefetch_factor=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)  # the same epoch keeps the loaded position
    tail = list(fresh)
    assert len(head) + len(tail) == len(reference)
    assert all(batches_equal(a, b) for a, b in zip(head + tail, reference))
    assert fresh.state_dict()["position"] == len(reference)


def test_resume_in_a_fresh_process(causal_cache):
    ref = _stream(causal_cache, view="twins", batch=1500, compact=True)
    ref.set_epoch(2)
    digests = [batch_digest(b) for b in ref]
    loader = make_loader(_stream(causal_cache, view="twins", batch=1500, compact=True), num_workers=2, prefetch_factor=3)
    loader.set_epoch(2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=resume_digests_to_queue, args=(queue, str(causal_cache), state, "twins", 1500, 2, {"compact": True}))
    proc.start()
    try:
        got = queue.get(timeout=120)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert got == digests[4:], got


def test_resume_then_next_epoch(causal_cache):
    loader = make_loader(_stream(causal_cache), num_workers=0)
    loader.set_epoch(0)
    done = list(loader)
    state = loader.state_dict()
    fresh = make_loader(_stream(causal_cache), num_workers=0)
    fresh.load_state_dict(state)
    direct = _stream(causal_cache)
    direct.set_epoch(1)
    expect = list(direct)
    got = list(fresh)  # the saved epoch was complete: the next pass is epoch 1
    assert fresh.state_dict()["epoch"] == 1 and len(got) == len(expect) == len(done) == 13
    assert all(batches_equal(a, b) for a, b in zip(got, expect))
    again = make_loader(_stream(causal_cache), num_workers=0)
    again.load_state_dict(state)
    again.set_epoch(0)  # the saved epoch named again: its remaining batches, none
    assert list(again) == []


def test_elastic_world_resume_at_stream_level(causal_cache):
    """2 ranks run 3 steps, then 3 ranks resume from the same state: every record once, nothing repeated."""
    seen = []
    state = None
    for r in range(2):
        s = _stream(causal_cache, batch=10, rank=r, world_size=2)
        it = iter(s)
        for _ in range(3):
            b = next(it)
            seen += b["record_id"][~b["is_pad"]].tolist()
        state = s.state_dict() if r == 0 else state
        assert s.state_dict()["position"] == state["position"] == 6
    steps = set()
    for r in range(3):
        s = _stream(causal_cache, batch=10, rank=r, world_size=3)
        s.load_state_dict(state)
        rest = list(s)
        steps.add(len(rest))
        seen += [i for b in rest for i in b["record_id"][~b["is_pad"]].tolist()]
    assert len(steps) == 1
    assert sorted(seen) == list(range(200))


def test_resume_decodes_only_what_remains(causal_cache, monkeypatch):
    stream = _stream(causal_cache)
    stream.set_epoch(1)
    state = dict(stream.state_dict(), position=9)
    calls = []
    real = graphs_mod.read_block
    monkeypatch.setattr(graphs_mod, "read_block", lambda shards, ids, *a, **k: calls.append(len(ids)) or real(shards, ids, *a, **k))
    fresh = _stream(causal_cache)
    fresh.load_state_dict(state)
    t = time.perf_counter()
    first = next(iter(make_loader(fresh, num_workers=0)))
    assert time.perf_counter() - t < 1.0
    assert calls == [16]  # one batch's records, nothing replayed
    assert batches_equal(first, fresh.batch(9, epoch=1))


def test_state_from_another_cache_or_plan_is_refused(causal_cache, tmp_path):
    state = _stream(causal_cache).state_dict()
    other = build_causal(tmp_path / "other", graphs=24, seed=1)
    with pytest.raises(CacheMismatchError, match="another cache"):
        _stream(other).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="batch_size"):
        _stream(causal_cache, batch=17).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="view"):
        ShardStream(causal_cache, view="records", batch_size=16, seed=11).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="seed"):
        ShardStream(causal_cache, view="graphs", batch_size=16, seed=12).load_state_dict(state)
    with pytest.raises(ValueError, match="not a cachebuild loader state"):
        _stream(causal_cache).load_state_dict({"epoch": 0})
    loader = make_loader(_stream(causal_cache), num_workers=0)
    it = iter(loader)
    next(it), next(it), next(it)
    loader.note_lookahead(1)  # a to_device-style consumer holds one batch ahead
    assert loader.state_dict()["position"] == 2
    loader.note_lookahead(-1)
    assert loader.state_dict()["position"] == 3
    assert np.isscalar(loader.state_dict()["epoch"])
