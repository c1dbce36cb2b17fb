"""Ragged 1-d fields in the ``records`` view: one gather and one masked write per batch, on reused buffers.

The view writes a ragged field (``Segments``: records of many lengths, read in place from zstd's
output buffers, shared frames included) as ``out[mask] = data``, the mask being the lengths' mask it
also hands out (made from the records' own lengths by ``Segments.fill_masked``); the padding is the
buffer's fill. These tests check the batches against records read
one by one with ``tarfile`` + ``zstd`` (:class:`loader_fixtures.Reference`) while the loader reuses
its batch buffers (a short batch after a long one must not keep the long one's tail), with and
without the mask key, and the pieces (``Segments.fill_masked``, ``length_mask``, ``shape_mask``)
against plain loops: garbage (NaN) between and after the records, the longest record last in its
buffer, records of length 0.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.format.reader import open_cache
from cachebuild.format.segments import Segments, length_mask
from loader_fixtures import Reference, padded
from loaders import ShardStream, make_loader
from loaders.views.records import shape_mask

MAX_LEN = 300


def _seq_record(rng: np.random.Generator, index: int) -> dict:
    # lengths spread 0..MAX_LEN (some records short enough to share a zstd frame), a label beside them
    n = int(rng.integers(0, 40)) if index % 3 else int(rng.integers(0, MAX_LEN + 1))
    return {"seq": rng.integers(-(2**31), 2**31 - 1, size=n).astype(np.int32), "lab": np.array(index % 11, np.int16)}


@pytest.fixture(scope="module")
def seq_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("raggedfill") / "seq"
    build(FunctionSource.per_record(_seq_record, {"seq": "int32", "lab": "int16"}), root, records=700, workers=1, shard_mb=0.05, progress=False)
    return root


def test_the_cache_has_shared_frames_and_many_lengths(seq_cache: Path) -> None:
    with open_cache(seq_cache) as shards:
        assert len(shards.manifest.shards) > 2
        assert any(shards.layout(s).shared[:, shards.field_pos["seq"]].any() for s in range(len(shards.manifest.shards)))
        assert len(np.unique(shards.field_shapes("seq"))) > 100


@pytest.mark.parametrize("masks", [True, False])
def test_batches_on_reused_buffers_equal_the_records(seq_cache: Path, masks: bool) -> None:
    ref = Reference(seq_cache)
    stream = ShardStream(seq_cache, view="records", batch_size=64, seed=5, masks=masks)
    loader = make_loader(stream, num_workers=0)
    buffers, longest = set(), []
    for _ in range(2):
        for batch in loader:
            seq, lengths = batch["seq"].numpy(), batch["seq_shape"].numpy()[:, 0]
            longest.append(int(lengths.max()))
            buffers.add(batch["seq"].data_ptr())
            for i, rid in enumerate(batch["record_id"].tolist()):
                want = ref.record(rid)
                assert seq[i].tobytes() == padded(want["seq"], (MAX_LEN,)).tobytes(), rid
                assert int(batch["lab"][i]) == int(want["lab"])
                assert lengths[i] == len(want["seq"])
                if masks:
                    assert np.array_equal(batch["seq_mask"][i].numpy(), np.arange(MAX_LEN) < len(want["seq"]))
            del batch, seq
            gc.collect(0)  # (the young generation: a full collection walks the whole suite's heap, 16 s a test in CI)
    assert "seq_mask" not in loader.stream.layout.fields or masks
    assert len(buffers) < len(longest) // 4  # the spare buffers were reused...
    assert any(a > b for a, b in zip(longest, longest[1:]))  # ...and a shorter batch followed a longer one


def _segments(rng: np.random.Generator, lengths: np.ndarray, buffers: int) -> tuple[Segments, list[np.ndarray]]:
    """Block rows of ``lengths`` spread over ``buffers`` int32 buffers with garbage between them, listed in a shuffled order."""
    n = len(lengths)
    buf = rng.integers(0, buffers, n)
    data = [rng.integers(0, 1000, int(k)) for k in lengths]
    bufs, start = [], np.zeros(n, np.int64)
    for b in range(buffers):
        parts, pos = [], 0
        for i in np.flatnonzero(buf == b).tolist():
            gap = int(rng.integers(0, 5))
            parts += [np.full(gap, -7, np.int32), np.asarray(data[i][: lengths[i]], np.int32)]
            start[i] = pos + gap
            pos += gap + lengths[i]
        bufs.append(np.concatenate(parts) if parts else np.zeros(0, np.int32))
    order = rng.permutation(n)  # entry j holds block row order[j]
    seg = Segments(order, buf[order], start[order], lengths[order], bufs)
    return seg, [np.asarray(data[i][: lengths[i]], np.int32) for i in range(n)]


@pytest.mark.parametrize("buffers", [1, 3])
def test_fill_masked_equals_a_loop(buffers: int) -> None:
    rng = np.random.default_rng(buffers)
    lengths = rng.integers(0, 20, 30)
    seg, records = _segments(rng, lengths, buffers)
    slot = np.concatenate([rng.permutation(30), rng.integers(0, 30, 6)])  # every record once, then repeats
    out = np.full((len(slot), 20), 99, np.int32)
    mask = np.ones((len(slot), 20), bool)  # (written by fill_masked: the rows' lengths)
    seg.fill_masked(out, slot, mask)
    np.testing.assert_array_equal(mask, length_mask(lengths[slot], np.empty((len(slot), 20), bool)))
    for r, k in enumerate(slot.tolist()):
        assert out[r, : lengths[k]].tolist() == records[k].tolist()
        assert (out[r, lengths[k] :] == 99).all()  # outside the mask: left as is
    scattered = np.full((30, 20), 99, np.int32)
    seg.scatter(scattered)
    for k in range(30):
        assert scattered[k, : lengths[k]].tolist() == records[k].tolist() and (scattered[k, lengths[k] :] == 99).all()


@pytest.mark.parametrize("buffers", [1, 2])
def test_fill_masked_windows_stay_inside_the_records(buffers: int) -> None:
    """Each row reads a window as wide as the batch's longest record: NaN after every record (and the
    longest record last in its buffer, its window past the buffer's end) must not reach the batch."""
    rng = np.random.default_rng(7)
    lengths = np.array([3, 0, 17, 5, 1, 12])
    bufs, start, buf = [], np.zeros(6, np.int64), np.arange(6) % buffers
    records = [rng.standard_normal(int(k)).astype(np.float32) for k in lengths]
    for b in range(buffers):
        order = sorted(np.flatnonzero(buf == b).tolist(), key=lambda i: lengths[i])  # longest last
        parts, pos = [], 0
        for i in order:
            parts += [records[i], np.full(2, np.nan, np.float32)]
            start[i] = pos
            pos += lengths[i] + 2
        parts[-1] = parts[-1][:0]  # nothing after the last record
        bufs.append(np.concatenate(parts))
    seg = Segments(np.arange(6), buf, start, lengths, bufs)
    slot = np.array([5, 2, 0, 1, 2, 3, 4])
    out = np.zeros((7, 20), np.float32)
    mask = np.empty((7, 20), bool)
    seg.fill_masked(out, slot, mask)
    assert not np.isnan(out).any()
    for r, k in enumerate(slot.tolist()):
        assert out[r, : lengths[k]].tobytes() == records[k].tobytes() and not out[r, lengths[k] :].any()
    empty = Segments(np.arange(2), np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64), [np.zeros(0, np.float32)])
    out2, mask2 = np.full((2, 4), 5.0, np.float32), np.ones((2, 4), bool)
    empty.fill_masked(out2, np.array([1, 0]), mask2)
    assert not mask2.any() and (out2 == 5.0).all()


@pytest.mark.parametrize("max_shape", [(7,), (4, 6), (3, 2, 5), (40000,)])
def test_masks_equal_a_loop(max_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(max_shape))
    shapes = np.stack([rng.integers(0, m + 1, 9) for m in max_shape], axis=1)
    out = np.ones((9,) + max_shape, bool)
    shape_mask(shapes, max_shape, out)
    for i in range(9):
        want = np.zeros(max_shape, bool)
        want[tuple(slice(0, int(n)) for n in shapes[i])] = True
        assert np.array_equal(out[i], want)
    if len(max_shape) == 1:
        np.testing.assert_array_equal(length_mask(shapes[:, 0], np.ones((9,) + max_shape, bool)), out)
