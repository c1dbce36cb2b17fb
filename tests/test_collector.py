"""Fewer cyclic collections while shards are written: raised inside, restored after, shared by threads."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from cachebuild import BuildOptions
from cachebuild.builder import build_cache
from cachebuild.builder.collector import GEN0_THRESHOLD, fewer_collections
from cachebuild.testing import ToySource


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def test_raised_inside_and_restored_after(thresholds):
    with fewer_collections():
        assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)
        with fewer_collections():
            assert gc.get_threshold()[0] == GEN0_THRESHOLD
        assert gc.get_threshold()[0] == GEN0_THRESHOLD  # the outer shard is still being written
    assert gc.get_threshold() == thresholds


def test_restored_after_an_error(thresholds):
    with pytest.raises(RuntimeError):
        with fewer_collections():
            raise RuntimeError("a source failed")
    assert gc.get_threshold() == thresholds


def test_collection_off_stays_off(thresholds):
    gc.set_threshold(0, 10, 10)
    with fewer_collections():
        assert gc.get_threshold()[0] == 0


def test_threads_restore_once_the_last_one_leaves(thresholds):
    inside, leave = threading.Barrier(3), threading.Event()
    seen: list[int] = []

    def shard() -> None:
        with fewer_collections():
            inside.wait()
            leave.wait()
            seen.append(gc.get_threshold()[0])

    threads = [threading.Thread(target=shard) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert gc.get_threshold()[0] == GEN0_THRESHOLD
    leave.set()
    for t in threads:
        t.join()
    assert gc.get_threshold() == thresholds
    assert GEN0_THRESHOLD in seen  # the first to leave still saw the raised threshold


@dataclass(frozen=True)
class _Watching(ToySource):
    """A toy source that fails unless generation 0's threshold is raised while its blocks are written."""

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for block in super().blocks(seed, shard, start, stop):
            if gc.get_threshold()[0] != GEN0_THRESHOLD:
                raise RuntimeError(f"threshold {gc.get_threshold()} while a shard is written")
            yield block


def test_a_build_writes_its_shards_with_fewer_collections(tmp_path, thresholds):
    opts = BuildOptions(out=tmp_path / "c", records=300, shard_bytes=20_000, workers=1, progress=False, sync=False)
    summary = build_cache(_Watching(), opts)
    assert summary.built == summary.shards > 1
    assert gc.get_threshold() == thresholds
