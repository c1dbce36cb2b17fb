"""The loader's fast decode path equals a straightforward one, on dirty memory too.

The hot path reuses batch buffers (a worker's slots, the main process's spare
buffers) without clearing them, skips zero fills of keys a view writes whole,
reads zstd output offsets per buffer and decodes whole pools at once. Each
test here builds the expected batch the plain way: every record read on its
own with tarfile + zstandard + np.load (:class:`loader_fixtures.Reference`),
padded with ``np.full``, indexed row by row; and the batch under test is
assembled into a buffer first filled with garbage bytes.

Caches: causal (zstd and raw: ragged ``[n, n]``, ``[k, S, n]``, JSON), toy
(zstd and raw: varying ``[n, n]``, fixed vector, 0-d, JSON) and one with a
3-D field varying on two axes, a 0-d field and a 1-D field that can be empty.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from cachebuild import FunctionSource, build
from cachebuild.format.codec import Codec
from conftest import build_toy
from loader_fixtures import Reference, batches_equal, build_causal, padded
from loaders import ShardStream, make_loader
from cachebuild.format.decode import read_block
from loaders.loader import shutdown_workers
from loaders.slots import ZERO_COPY_HELD


def _ragged_record(rng: np.random.Generator, index: int) -> dict:
    a, b = 1 + int(rng.integers(0, 6)), 1 + int(rng.integers(0, 5))
    return {"cube": rng.standard_normal((a, b, 3)).astype(np.float16), "lab": np.array(index % 7, np.int16), "seq": rng.integers(0, 100, size=int(rng.integers(0, 61))).astype(np.int32)}


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decref")
    out = {"causal": build_causal(root / "causal", graphs=120), "causal_raw": build_causal(root / "causal_raw", graphs=120, codec="none")}
    for name, codec in (("toy", Codec()), ("toy_raw", Codec("none", 0))):
        build_toy(root / name, records=300, codec=codec)
        out[name] = root / name
    for name, codec in (("ragged", "zstd"), ("ragged_raw", "none")):  # seq: 61 lengths, so its blocks take the one-gather path
        build(FunctionSource.per_record(_ragged_record, {"cube": "float16", "lab": "int16", "seq": "int32"}), root / name, records=200, workers=1, shard_mb=0.01, codec=codec, progress=False)
        out[name] = root / name
    return out


def _dirty_batch(stream: ShardStream, b: int, byte: int = 0xAB) -> dict[str, torch.Tensor]:
    """Global batch ``b`` of epoch 0 assembled into a buffer full of ``byte`` (a reused slot)."""
    from loaders.batch import PackedBatch

    buf = torch.full((stream.layout.nbytes,), byte, dtype=torch.uint8)
    _, arrays = stream.layout.allocate(False, (buf, None))
    stream.view.decode_threads = 1
    stream.view.reset()
    stream.view.assemble(stream._shards(), stream.plan(0).batch(b), arrays)
    return PackedBatch(buf, stream.layout.spec()).unpack()


@pytest.mark.parametrize("name", ["causal", "causal_raw", "toy", "toy_raw", "ragged", "ragged_raw"])
def test_read_block_equals_record_by_record(caches, name):
    root = caches[name]
    ref = Reference(root)
    m = ref.manifest
    rng = np.random.default_rng(0)
    ids = rng.choice(m.records, size=min(m.records, 90), replace=False)
    ids = np.concatenate([ids, ids[:5]])  # repeats allowed
    stream = ShardStream(root, view="records", batch_size=8)
    blocks = read_block(stream._shards(), ids, m.field_names, threads=2)
    if name.startswith("ragged"):
        assert blocks["seq"].segments is not None and not blocks["seq"].runs
    for f in m.fields:
        blk = blocks[f.name]
        if f.dtype == "json":
            assert blk.values == [ref.record(int(r))[f.name] for r in ids]
            continue
        out = np.full((len(ids),) + tuple(f.max_shape), 77, dtype=f.dtype)
        blk.scatter(out)
        for i, rid in enumerate(ids.tolist()):
            want = ref.record(rid)[f.name]
            assert tuple(blk.shapes[i]) == want.shape
            got = out[(i,) + tuple(slice(0, n) for n in want.shape)]
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, f.name, rid)


@pytest.mark.parametrize("name", ["causal", "toy", "ragged"])
@pytest.mark.parametrize("chunk", [1, 3000])
def test_a_block_decoded_in_several_zstd_calls_equals_record_by_record(caches, name, chunk, monkeypatch):
    """zstd's output in calls of at most ``chunk`` bytes (one frame per call at 1): each frame found in its
    own call's buffers, so the block is the same."""
    from cachebuild.format import zstd_output

    monkeypatch.setattr(zstd_output, "CHUNK_BYTES", chunk)
    calls = []
    real = zstd_output.packed_offsets
    monkeypatch.setattr(zstd_output, "packed_offsets", lambda out, lens: calls.append(len(lens)) or real(out, lens))
    test_read_block_equals_record_by_record(caches, name)
    assert len(calls) > 5 and (chunk > 1 or set(calls) == {1}), calls


@pytest.mark.parametrize("name", ["causal", "toy", "ragged"])
@pytest.mark.parametrize("chunk", [1, 3000, None])
def test_a_block_in_record_order_goes_to_zstd_by_shard_runs_and_equals_record_by_record(caches, name, chunk, monkeypatch):
    """Records in id order (a ``twins`` pool's decode, ``shuffle=False``): the frames go to zstd as
    ``BufferWithSegments`` runs of one shard (no memoryview per frame), in calls of ``chunk`` bytes too (one
    frame per call at 1, a run cut by a call's end at 3000): every record's bytes are the plain read's."""
    from cachebuild.format import decode, zstd_output

    if chunk is not None:
        monkeypatch.setattr(zstd_output, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(decode, "_RUNS_PER_FRAME", 1)  # (these small caches' shards hold few records: runs of one shard are short)
    used = []
    real = zstd_output.ShardFrames.collection
    monkeypatch.setattr(zstd_output.ShardFrames, "collection", lambda self, a, b: used.append(b - a) or real(self, a, b))
    root = caches[name]
    ref = Reference(root)
    m = ref.manifest
    ids = np.arange(m.records, dtype=np.int64)[5:-3]
    blocks = read_block(ShardStream(root, view="records", batch_size=8)._shards(), ids, m.field_names)
    assert used and (chunk != 1 or set(used) == {1}), used
    for f in m.fields:
        blk = blocks[f.name]
        if f.dtype == "json":
            assert blk.values == [ref.record(int(r))[f.name] for r in ids]
            continue
        out = np.full((len(ids),) + tuple(f.max_shape), 77, dtype=f.dtype)
        blk.scatter(out)
        for i, rid in enumerate(ids.tolist()):
            want = ref.record(rid)[f.name]
            got = out[(i,) + tuple(slice(0, n) for n in want.shape)]
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, f.name, rid)


@pytest.mark.parametrize("name", ["causal", "toy", "ragged", "ragged_raw"])
def test_read_block_of_no_records_is_empty_blocks(caches, name):
    """No ids: a block of 0 rows per field (zstd is not asked for no frames: that crashed the interpreter)."""
    root = caches[name]
    m = Reference(root).manifest
    blocks = read_block(ShardStream(root, view="records", batch_size=8)._shards(), np.array([], np.int64), m.field_names)
    assert set(blocks) == set(m.field_names)
    for f in m.fields:
        blk = blocks[f.name]
        if f.dtype == "json":
            assert blk.values == []
            continue
        assert blk.shapes.shape == (0, len(f.max_shape)) and blk.dtype == np.dtype(f.dtype) and not blk.runs and blk.segments is None
        out = np.full((0,) + tuple(f.max_shape), 77, dtype=f.dtype)
        blk.scatter(out)


@pytest.mark.parametrize("name", ["causal", "causal_raw", "toy", "toy_raw", "ragged", "ragged_raw"])
def test_records_view_on_dirty_buffers(caches, name):
    root = caches[name]
    ref = Reference(root)
    stream = ShardStream(root, view="records", batch_size=32, seed=1)
    fields = [f for f in ref.manifest.fields if f.dtype != "json"]
    for b in range(stream.plan(0).batches):
        batch = _dirty_batch(stream, b)
        for i, rid in enumerate(batch["record_id"].tolist()):
            rec = ref.record(rid)
            for f in fields:
                want = padded(np.asarray(rec[f.name]), tuple(f.max_shape))
                assert batch[f.name][i].numpy().tobytes() == want.tobytes(), (name, f.name, rid)
                if f.varying_axes:
                    assert batch[f"{f.name}_shape"][i].tolist() == list(np.shape(rec[f.name]))
                    mask = padded(np.ones(np.shape(rec[f.name]), bool), tuple(f.max_shape))
                    assert np.array_equal(batch[f"{f.name}_mask"][i].numpy(), mask)


@pytest.mark.parametrize("name", ["causal", "causal_raw"])
@pytest.mark.parametrize("delta", ["computed", "stored"])
def test_graphs_view_on_dirty_buffers(caches, name, delta):
    ref = Reference(caches[name])
    m = ref.manifest
    N, K, S = m.schema("adj").max_shape[0], m.schema("targets").max_shape[0], m.schema("base").max_shape[0]
    stream = ShardStream(caches[name], view="graphs", batch_size=40, seed=2, delta=delta)
    for b in range(stream.plan(0).batches):
        batch = _dirty_batch(stream, b, 0xFF)  # 0xFF..: NaN in float32, -1 in ints
        for i, rid in enumerate(batch["record_id"].tolist()):
            rec = ref.record(rid)
            k = rec["targets"].shape[0]
            for key, shape, fill in (("adj", (N, N), 0), ("base", (S, N), 0), ("int", (K, S, N), 0), ("targets", (K,), -1), ("values", (K,), 0)):
                assert batch[key][i].numpy().tobytes() == padded(rec[key], shape, fill).tobytes(), (key, rid)
            want = np.zeros((K, S, N), np.float32)
            want[:k] = padded(rec["int"], (K, S, N))[:k] - padded(rec["base"], (S, N))[None]
            assert batch["delta"][i].numpy().tobytes() == want.tobytes()
            assert batch["delta"][i].numpy().tobytes() == padded(rec["delta"], (K, S, N)).tobytes()


@pytest.mark.parametrize("compact", [True, False])
def test_twins_view_on_dirty_buffers(caches, compact):
    ref = Reference(caches["causal"])
    m = ref.manifest
    N, S = m.schema("adj").max_shape[0], m.schema("base").max_shape[0]
    stream = ShardStream(caches["causal"], view="twins", batch_size=1024, seed=3, compact=compact, mix=64)
    for b in range(0, stream.plan(0).batches, 7):
        batch = _dirty_batch(stream, b)
        graphs = batch["ctx_record_id"][batch["graph_index"]] if compact else batch["graph_id"]
        for i in range(0, 1024, 5):
            rec = ref.record(int(graphs[i]))
            k, j = int(batch["int_index"][i]), int(batch["row_index"][i])
            base, world = padded(rec["base"], (S, N)), padded(rec["int"][k], (S, N))
            assert batch["target_row"][i].numpy().tobytes() == base[j].tobytes()
            assert batch["int_row"][i].numpy().tobytes() == world[j].tobytes()
            assert batch["delta"][i].numpy().tobytes() == padded(rec["delta"][k], (S, N))[j].tobytes()
            assert int(batch["int_node_idx"][i]) == int(rec["targets"][k])
            assert batch["int_mask"][i].tolist() == [float(x == rec["targets"][k]) for x in range(N)]
            if compact:
                g, w = int(batch["graph_index"][i]), int(batch["world_index"][i])
                assert batch["ctx_base"][g].numpy().tobytes() == base.tobytes()
                assert batch["ctx_int"][w].numpy().tobytes() == world.tobytes()
                assert batch["ctx_adj"][g].numpy().tobytes() == padded(rec["adj"].astype(np.float32), (N, N)).tobytes()
            else:
                assert batch["base_samples"][i].numpy().tobytes() == base.tobytes()
                assert batch["int_samples"][i].numpy().tobytes() == world.tobytes()
        if compact:  # unused context slots: zero, record id -1
            used = int(batch["ctx_mask"].sum())
            assert (batch["ctx_record_id"][used:] == -1).all() and not batch["ctx_mask"][used:].any()
            assert not batch["ctx_base"][used:].any() and not batch["ctx_adj"][used:].any() and not batch["ctx_n"][used:].any()
            assert not batch["ctx_int"][int(batch["world_index"].max()) + 1 :].any()


def test_spare_buffers_are_reused_only_once_dropped(caches):
    stream = ShardStream(caches["causal"], view="graphs", batch_size=16, seed=4)
    stream.set_epoch(0)
    expect = [stream.batch(b, 0) for b in range(stream.plan(0).batches)]
    stream.set_epoch(0)
    kept, ptrs = [], set()
    for b, batch in enumerate(stream):
        ptrs.add(batch["adj"].data_ptr())
        if b % 3 == 0:
            kept.append((b, batch))  # held: its buffer must not be reused
        del batch
    assert all(batches_equal(batch, expect[b]) for b, batch in kept)
    assert len(ptrs) < stream.plan(0).batches  # dropped buffers were reused


def test_zero_copy_batches_from_workers(caches):
    stream = ShardStream(caches["causal"], view="graphs", batch_size=8, seed=5)
    expect = [stream.batch(b, 0) for b in range(stream.plan(0).batches)]
    loader = make_loader(ShardStream(caches["causal"], view="graphs", batch_size=8, seed=5), num_workers=2, prefetch_factor=2, pin_memory=False)
    try:
        rings = loader.dataset.slot_rings
        got = []
        for batch in loader:  # every batch held: past the budget they are copies, never a stall or an overwrite
            assert max(rings.held) <= ZERO_COPY_HELD
            got.append(batch)
        assert sum(rings.held) > 0  # some batches are views of the slots
        assert len(got) == len(expect) and all(batches_equal(a, b) for a, b in zip(got, expect))
        del got, batch
        gc.collect()
        assert rings.held == [0, 0]  # dropped: every slot is free again
        again = [batches_equal(b, expect[i]) for i, b in enumerate(loader)]  # epoch 1 differs; just runs
        assert len(again) == len(expect)
    finally:
        shutdown_workers(loader)
