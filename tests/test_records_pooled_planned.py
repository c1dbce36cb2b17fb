"""Pooled ``records`` passes through ``make_loader(..., num_workers=N)``: planned on the loader's hand-over
thread in the trainer's process, where the next pool is decoded ahead, not in worker processes
(:mod:`loaders.planned`). The batches (bytes), every record once per epoch, the resume state across worker
counts and a superseded pass behave as with workers; a plain torch ``DataLoader`` and a ``worker_init_fn``
of the caller's still get worker processes, with the same batches."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from torch.utils.data import DataLoader

from cachebuild.errors import PassSupersededError
from loaders import ShardStream, make_loader
from test_records_pooled import shared_cache  # noqa: F401

KW = {"view": "records", "batch_size": 40, "seed": 6, "mix": 150}


def _digest(batches) -> list[tuple]:
    return [tuple((k, v.dtype, tuple(v.shape), v.numpy().tobytes()) for k, v in b.items()) for b in batches]


def _children() -> int:
    return len(psutil.Process().children(recursive=True))


def _pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _note_worker(worker_id: int) -> None:
    pass


def _zero_workers(root: Path, epochs: int = 2) -> list[tuple]:
    zero = make_loader(ShardStream(root, **KW), num_workers=0)
    want = []
    for epoch in range(epochs):
        zero.set_epoch(epoch)
        want += _digest(zero)
    return want


def _cachebuild_threads(earlier: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """Our threads alive now, but those in ``earlier`` (another test's are that test's to report)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("cachebuild-") and t not in earlier]


def test_pooled_batches_with_workers_are_planned_here_and_equal_those_of_zero_workers(shared_cache: Path) -> None:
    earlier = frozenset(threading.enumerate())
    want = _zero_workers(shared_cache)
    for persistent, pin in ((True, False), (False, False), (False, True)):  # (pinning: only where CUDA is)
        loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2, persistent_workers=persistent, pin_memory=pin)
        before, got, decodes = _pids(), [], []
        for epoch in range(2):
            loader.set_epoch(epoch)
            start = loader.stream.view.store.decodes
            for batch in loader:
                decoder = loader.stream.view.store.process.pid
                assert _pids() - before <= {decoder}  # no worker process, one that decodes pools (started once)
                got += _digest([batch])
            assert decoder in _pids()
            decodes.append(loader.stream.view.store.decodes - start)
        assert got == want, (persistent, pin)
        ids = [np.frombuffer(dict((k, b) for k, _, _, b in d)["record_id"], np.int64) for d in got]
        pads = [np.frombuffer(dict((k, b) for k, _, _, b in d)["is_pad"], bool) for d in got]
        half = len(got) // 2
        for part in (slice(0, half), slice(half, None)):  # every record once per epoch
            real = np.concatenate([i[~p] for i, p in zip(ids[part], pads[part])])
            assert np.array_equal(np.sort(real), np.arange(1000))
        assert all(1000 <= d <= 1000 + 150 for d in decodes), decodes  # each record decoded once (a wrapped pool at most again)
        assert not any(n.startswith("cachebuild-handover") for n in _cachebuild_threads(earlier))


def test_a_mid_epoch_state_resumes_exactly_across_worker_counts_and_a_superseded_pass_stops(shared_cache: Path) -> None:
    whole = make_loader(ShardStream(shared_cache, **KW), num_workers=0)
    whole.set_epoch(1)
    want = _digest(whole)
    loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2)
    loader.set_epoch(1)
    it = iter(loader)
    head = _digest([next(it) for _ in range(7)])
    state = loader.state_dict()
    assert state["batches"] == 7  # what the trainer received, not what the thread planned ahead
    for workers in (3, 0):  # another worker count, and none: the same plan
        fresh = make_loader(ShardStream(shared_cache, **KW), num_workers=workers)
        fresh.load_state_dict(state)
        fresh.set_epoch(1)
        assert head + _digest(fresh) == want, workers
    zero = make_loader(ShardStream(shared_cache, **KW), num_workers=0)  # and a 0-worker state into 2 workers
    zero.set_epoch(1)
    zit = iter(zero)
    for _ in range(4):
        next(zit)
    two = make_loader(ShardStream(shared_cache, **KW), num_workers=2)
    two.load_state_dict(zero.state_dict())
    two.set_epoch(1)
    assert _digest(two) == want[4:]
    loader.load_state_dict(state)
    with pytest.raises(PassSupersededError):
        next(it)


def test_plain_dataloader_and_a_worker_init_fn_still_get_workers_with_the_same_batches(shared_cache: Path) -> None:
    want = _zero_workers(shared_cache, epochs=1)
    plain = DataLoader(ShardStream(shared_cache, **KW), batch_size=None, num_workers=2)
    it = iter(plain)
    got = _digest([next(it)])
    assert _children() >= 2  # a torch DataLoader's own workers (they share pools)
    got += _digest(it)
    assert got == want
    loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2, worker_init_fn=_note_worker)
    it = iter(loader)
    got = _digest([next(it)])
    assert _children() >= 2  # the workers the caller asked for
    assert got + _digest(it) == want


def test_an_unshuffled_pooled_stream_keeps_its_workers(shared_cache: Path) -> None:
    from loaders.planned import pool_work_here

    assert pool_work_here(ShardStream(shared_cache, **KW))
    assert not pool_work_here(ShardStream(shared_cache, **(KW | {"shuffle": False})))  # no pools: a decode per batch
    assert not pool_work_here(ShardStream(shared_cache, view="records", batch_size=40))
