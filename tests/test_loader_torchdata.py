"""torchdata's ``StatefulDataLoader`` over a ShardStream: each worker saves its own share, and a resume is exact.

No silent repeats: the batches before the save and after the resume are
exactly the uninterrupted epoch, whatever the cut; the next epoch follows.
"""

from __future__ import annotations

import pytest

from loader_fixtures import all_batches_equal, real_record_ids, batches_equal, causal_cache  # noqa: F401
from loaders import ShardStream

sdl = pytest.importorskip("torchdata.stateful_dataloader")


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


def test_stateful_dataloader_refuses_another_worker_count(causal_cache):
    dl = sdl.StatefulDataLoader(_stream(causal_cache), batch_size=None, num_workers=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it, dl
    fresh = sdl.StatefulDataLoader(_stream(causal_cache), batch_size=None, num_workers=1)
    with pytest.raises(ValueError, match="saved by worker 0 of 2, loaded into worker 0 of 1"):
        fresh.load_state_dict(state)
        list(fresh)
