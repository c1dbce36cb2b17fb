"""torchdata's ``StatefulDataLoader`` over a ShardStream: each worker saves its own share, and a resume is exact.

No silent repeats: the batches before the save and after the resume are
exactly the uninterrupted epoch, whatever the cut; the next epoch follows.
"""

from __future__ import annotations

import psutil
import pytest

from loader_fixtures import all_batches_equal, real_record_ids, batches_equal, causal_cache  # noqa: F401
from cachebuild.errors import WorkerStateError
from loaders import ShardStream
from loaders.state import saved_workers

sdl = pytest.importorskip("torchdata.stateful_dataloader")
from loaders.stateful import StatefulStreamLoader  # noqa: E402


def _stream(root):
    return ShardStream(root, view="graphs", batch_size=16, seed=7)


def _epoch(root, epoch: int) -> list:
    s = _stream(root)
    s.set_epoch(epoch)
    return list(s)


@pytest.mark.parametrize("workers,cut,persistent", [(2, 7, True), (2, 1, False), (0, 5, False), (3, 12, True), (2, 13, True)])
def test_stateful_dataloader_resumes_exactly(causal_cache, workers, cut, persistent):
    e0, e1 = _epoch(causal_cache, 0), _epoch(causal_cache, 1)
    kw = dict(batch_size=None, num_workers=workers, persistent_workers=persistent)
    dl = sdl.StatefulDataLoader(_stream(causal_cache), **kw)
    it = iter(dl)
    head = [next(it) for _ in range(cut)]
    state = dl.state_dict()
    del it, dl
    fresh = sdl.StatefulDataLoader(_stream(causal_cache), **kw)
    fresh.load_state_dict(state)
    tail = list(fresh)
    ids = real_record_ids(head + tail)
    assert sorted(ids) == list(range(200)), "a record repeated or lost across the resume"
    assert all_batches_equal(head + tail, e0)
    assert all_batches_equal(list(fresh), e1)  # the next pass is the next epoch


def _saved_at(root, workers: int, batches: int = 3) -> dict:
    dl = sdl.StatefulDataLoader(_stream(root), batch_size=None, num_workers=workers)
    it = iter(dl)
    for _ in range(batches):
        next(it)
    state = dl.state_dict()
    del it, dl
    return state


def _one_line(exc: BaseException, saved: int, now: int) -> None:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text and "Caught" not in text, text
    assert f"num_workers={saved}" in text and f"num_workers={now}" in text, text


def test_stateful_dataloader_refuses_another_worker_count_in_one_line(causal_cache):
    """A plain StatefulDataLoader, 2 workers saved, 1 or 3 loading: the workers refuse, and what
    torch re-raises in the main process is one line naming both counts (not the worker's traceback)."""
    state = _saved_at(causal_cache, 2)
    for now in (1, 3):
        fresh = sdl.StatefulDataLoader(_stream(causal_cache), batch_size=None, num_workers=now)
        fresh.load_state_dict(state)
        before = {p.pid for p in psutil.Process().children()}
        with pytest.raises(WorkerStateError) as info:
            list(fresh)
        _one_line(info.value, 2, now)
        assert isinstance(info.value, ValueError)
        # The iterator raised while starting, its workers already running: torch's later shutdown of it (at
        # some garbage collection) joins each for 5 s, 15-20 s inside the next tests. End them here.
        for worker in [p for p in psutil.Process().children() if p.pid not in before]:
            worker.terminate()


@pytest.mark.parametrize("saved,now", [(2, 1), (2, 0), (0, 2)])
def test_stateful_stream_loader_refuses_in_the_main_process(causal_cache, saved, now):
    """StatefulStreamLoader checks the counts in load_state_dict, before any worker starts or
    torchdata's own assertions (which come first with 0 workers) see the state."""
    state = _saved_at(causal_cache, saved)
    assert saved_workers(state) == saved
    fresh = StatefulStreamLoader(_stream(causal_cache), num_workers=now)
    with pytest.raises(WorkerStateError) as info:
        fresh.load_state_dict(state)
    _one_line(info.value, saved, now)
    assert fresh._iterator is None and fresh.next_iter_state is None  # refused before torchdata kept it
    assert info.value.__traceback__ is not None
    frames = [f.name for f in __import__("traceback").extract_tb(info.value.__traceback__)]
    assert frames[-1] == "check_loader_workers", frames  # raised here, in this process


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_stream_loader_resumes_with_the_same_count(causal_cache, workers):
    e0 = _epoch(causal_cache, 0)
    state = _saved_at(causal_cache, workers, batches=5)
    fresh = StatefulStreamLoader(_stream(causal_cache), num_workers=workers)
    fresh.load_state_dict(state)
    assert all_batches_equal(list(fresh), e0[5:])
