"""A pass still being iterated after ``load_state_dict``, ``set_epoch`` or a newer pass: it stops with one
line (:class:`PassSupersededError`) and never counts into the position, so the loaded state (or the epoch
asked for) governs the next pass. Every counting path: a bare stream (the stream counts itself), a loader
without workers (read directly, and through torch's single-process iterator with a caller's collate_fn),
and real DataLoader workers, persistent and not; a mixture of caches too.

Each test fails on the tree before the fix (edd9669): there the old pass ran on to the end of its epoch,
counting its batches on top of the loaded position, and the next pass started the following epoch.
"""

from __future__ import annotations

import pytest

from cachebuild.errors import CacheBuildError, PassSupersededError
from loader_fixtures import batch_digest, causal_cache  # noqa: F401
from loaders import ShardStream, make_loader
from mixture_fixtures import levels, make_mixture  # noqa: F401

BATCH = 8

# how the source is iterated: (workers, persistent, collate) or "bare" (the stream itself)
SOURCES = {
    "bare": None,
    "w0-direct": (0, False, None),
    "w0-collate": (0, False, lambda b: b),  # torch's single-process iterator, not StreamLoader._direct
    "w2-persistent": (2, True, None),
    "w2-fresh": (2, False, None),
}


def _source(root, how, **stream_kwargs):
    stream = ShardStream(root, view="graphs", batch_size=BATCH, seed=3, **stream_kwargs)
    if how is None:
        return stream, stream
    workers, persistent, collate = how
    kwargs = {"collate_fn": collate} if collate is not None else {}
    return stream, make_loader(stream, num_workers=workers, persistent_workers=persistent, prefetch_factor=2, pin_memory=False, **kwargs)


def _pos(state: dict) -> tuple[int, int, int]:
    return state["epoch"], state["position"], state["batches"]


def _drain_raises(it) -> int:
    """Batches a superseded iterator still gave before raising (0 with the fix); fails where it does not raise."""
    n = 0
    with pytest.raises(PassSupersededError, match=r"superseded by .*") as info:
        for _ in it:
            n += 1
    assert "\n" not in str(info.value) and isinstance(info.value, RuntimeError) and isinstance(info.value, CacheBuildError)
    return n


def _check_load_while_iterating(root, how, **stream_kwargs):
    """The write-up's shape: a pass is left half-read, a state is loaded, and the old pass is drained."""
    stream, src = _source(root, how, **stream_kwargs)
    it = iter(src)
    for _ in range(3):
        next(it)
    state = src.state_dict()
    expected = [batch_digest(b) for b in it]  # this epoch's remaining batches, as a fresh resume gives them
    it = iter(src)  # the next pass (epoch 1), half-read again
    next(it)
    next(it)
    src.load_state_dict(state)
    assert _drain_raises(it) == 0
    assert _pos(src.state_dict()) == _pos(state)  # nothing of the superseded pass counted
    got = [batch_digest(b) for b in src]  # the next pass continues the loaded state exactly
    assert got == expected
    end = src.state_dict()
    assert (end["epoch"], end["batches"]) == (state["epoch"], state["batches"] + len(expected))
    assert stream.epoch == state["epoch"]


@pytest.mark.parametrize("name", list(SOURCES))
def test_load_state_dict_supersedes_a_running_pass(causal_cache, name):  # noqa: F811
    _check_load_while_iterating(causal_cache, SOURCES[name])


@pytest.mark.parametrize("name", ["bare", "w2-persistent"])
def test_load_state_dict_supersedes_a_running_pass_of_a_mixture(levels, name):  # noqa: F811
    mixture = make_mixture(levels, {"weights": {"small": 0.5, "mid": 0.3, "big": 0.2}, "epoch_size": 120})
    _check_load_while_iterating(mixture, SOURCES[name])


@pytest.mark.parametrize("name", ["bare", "w0-direct", "w2-persistent", "w2-fresh"])
def test_set_epoch_to_another_epoch_supersedes_a_running_pass(causal_cache, name):  # noqa: F811
    stream, src = _source(causal_cache, SOURCES[name])
    it = iter(src)
    next(it)
    src.set_epoch(0)  # the epoch it runs: the pass goes on counting where it is
    next(it)
    assert _pos(src.state_dict()) == (0, 2, 2)
    src.set_epoch(5)
    assert _drain_raises(it) == 0
    assert _pos(src.state_dict()) == (5, 0, 0)
    fresh = ShardStream(causal_cache, view="graphs", batch_size=BATCH, seed=3)
    fresh.set_epoch(5)
    assert [batch_digest(b) for b in src] == [batch_digest(b) for b in fresh]  # the next pass: epoch 5, whole
    assert _pos(src.state_dict())[:2] == (5, len(stream))


@pytest.mark.parametrize("name", ["bare", "w0-direct", "w2-persistent"])
def test_a_newer_pass_supersedes_the_older_one(causal_cache, name):  # noqa: F811
    stream, src = _source(causal_cache, SOURCES[name])
    old = iter(src)
    next(old)
    new = iter(src)  # epoch 1 (the pass of `old` counts as begun)
    first = next(new)
    with pytest.raises(PassSupersededError, match="a newer pass"):
        next(old)
    assert _pos(src.state_dict()) == (1, 1, 1)
    fresh = ShardStream(causal_cache, view="graphs", batch_size=BATCH, seed=3)
    fresh.set_epoch(1)
    assert [batch_digest(first)] + [batch_digest(b) for b in new] == [batch_digest(b) for b in fresh]
    assert _pos(src.state_dict())[:2] == (1, len(stream))


def test_a_superseded_pass_of_fresh_workers_ends_them_at_once(causal_cache):  # noqa: F811
    """Non-persistent workers of a superseded pass are stopped when it raises, not when its iterator is
    garbage collected later: there torch's shutdown waited 5 s for each worker (still busy with the
    batches it had been asked for), in whatever code of the trainer's happened to trigger the collection."""
    import gc
    import time

    import psutil

    _, loader = _source(causal_cache, SOURCES["w2-fresh"])
    before = {p.pid for p in psutil.Process().children()}  # (other tests' helpers, a session's fork server)
    it = iter(loader)
    next(it)
    next(it)
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) == 2, workers
    loader.set_epoch(5)
    assert _drain_raises(it) == 0
    t = time.monotonic()
    del it
    gc.collect()
    assert time.monotonic() - t < 2.0
    gone = psutil.wait_procs(workers, timeout=3)[1]
    assert not gone, gone  # the old pass's workers have exited
    assert sum(1 for _ in loader) == len(loader)  # and the next pass runs whole
