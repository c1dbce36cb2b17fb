"""Several caches in one stream: counts per epoch, exactly once, proportions, shapes, schedules, resume, bad input."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cachebuild.format.index import load_index
from hypothesis import given, settings
from hypothesis import strategies as st

from cachebuild.errors import CacheMismatchError, ConfigError
from loader_fixtures import padded
from loaders import Mixture, ShardStream, Stage, make_loader
from loaders.mixplan import cache_draws, mixture_order
from loaders.plan import DEFAULT_WINDOW, epoch_order
from loaders.schedule import check_schedule, draws_before, epoch_counts, stage_at, stage_counts
from mixture_fixtures import LEVELS, batch_ids, build_level, levels, union_reference  # noqa: F401

SIZES = [v[2] for v in LEVELS.values()]  # 90, 50, 30


# ---- pure: weights -> counts -> records
@pytest.mark.parametrize("records,weights,size", [([90, 50, 30], None, None), ([90, 50, 30], [90, 50, 30], None), ([7, 3], [0.7, 0.3], 10)])
def test_counts_equal_sizes_when_weights_are_proportional(records, weights, size):
    assert epoch_counts(weights, records, size).tolist() == list(records) if size is None else [7, 3]


@given(st.lists(st.floats(0, 100), min_size=1, max_size=6), st.integers(1, 10_000))
@settings(max_examples=200, deadline=None)
def test_counts_add_up_and_round_the_quota(weights, size):
    if sum(weights) == 0:
        weights = weights[:-1] + [1.0]
    counts = epoch_counts(weights, [1] * len(weights), size)
    assert counts.sum() == size
    quota = np.array(weights) * size / sum(weights)
    assert np.all(np.abs(counts - quota) < 1 + 1e-9)


@pytest.mark.parametrize("size,count", [(30, 30), (30, 7), (30, 75), (1, 5), (30, 29)])
def test_cache_draws_cycle_without_replacement(size, count):
    shards = np.array([size // 3, size - 2 * (size // 3), size // 3]) if size >= 3 else np.array([size])
    epochs = 7
    draws = [cache_draws(shards, 4, 1, 3, e, e * count, count) for e in range(epochs)]
    for d in draws:
        per = Counter(d.tolist())
        assert len(d) == count and set(per) <= set(range(size))
        assert set(per.values()) <= {count // size, count // size + 1} - ({0} if count >= size else set())
        if count <= size:
            assert len(per) == count  # a subsample: no repeat inside an epoch
    seen = Counter(np.concatenate(draws).tolist())
    assert max(seen.values()) - min(seen.get(i, 0) for i in range(size)) <= 1  # every record before any again
    assert size == 1 or draws[0].tolist() != draws[1].tolist()  # each epoch shuffled afresh


def test_one_cache_mixture_reads_what_a_plain_stream_reads():
    counts = np.array([40, 25, 35])
    for e in range(3):
        order = mixture_order([counts], np.array([100]), np.array([100 * e]), 7, e)
        assert np.array_equal(order, epoch_order(counts, 7, e))


def test_every_stretch_of_the_order_holds_the_proportions():
    shard_counts = [np.array([50, 40]), np.array([30, 20]), np.array([30])]
    counts = np.array([120, 60, 20])
    order = mixture_order(shard_counts, counts, np.zeros(3, np.int64), 0, 2)
    cache = np.searchsorted([0, 90, 140, 170], order, side="right") - 1
    for lo in range(0, 200 - 20, 20):
        got = np.bincount(cache[lo : lo + 20], minlength=3)
        assert np.all(np.abs(got - counts * 20 / 200) <= 2), (lo, got)


def test_schedule_draws_continue_across_stages():
    stages = check_schedule([Stage((0, 2), {"a": 1}), Stage((2, None), {"a": 1, "b": 1}, epoch_size=10)], ["a", "b"])
    assert draws_before(stages, [30, 8], 0).tolist() == [0, 0]
    assert draws_before(stages, [30, 8], 2).tolist() == [60, 0]  # stage 0: every record of a, epoch_size 30
    assert draws_before(stages, [30, 8], 4).tolist() == [70, 10]


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(1, 3), st.lists(st.integers(0, 5), min_size=4, max_size=4), st.one_of(st.none(), st.integers(1, 90))), min_size=1, max_size=4),
    st.integers(0, 2**31),
    st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_mixture_orders_follow_their_schedule(sizes, stages, seed, shuffle):
    names = [f"c{i}" for i in range(len(sizes))]
    built, first = [], 0
    for length, weights, size in stages:
        w = [x if sizes[i] else 0 for i, x in enumerate(weights[: len(sizes)])]
        if sum(w) == 0:
            return
        built.append(Stage((first, first + length), w, size))
        first += length
    checked = check_schedule(built, names)
    shard_counts = [np.array([n // 2, n - n // 2]) for n in sizes]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for epoch in range(first):
        counts = stage_counts(checked[stage_at(checked, epoch)], sizes)
        before = draws_before(checked, sizes, epoch)
        assert np.array_equal(draws_before(checked, sizes, epoch + 1) - before, counts)
        if counts.sum() == 0:
            continue
        order = mixture_order(shard_counts, counts, before, seed, epoch, shuffle)
        cache = np.searchsorted(offsets, order, side="right") - 1
        assert np.array_equal(np.bincount(cache, minlength=len(sizes)), counts)
        for c, n in enumerate(sizes):  # each record of a cache count // size or one more times
            if counts[c]:
                per = np.bincount(order[cache == c] - offsets[c], minlength=n)
                assert per.min() >= counts[c] // n and per.max() <= -(-counts[c] // n)


# ---- the stream
def _epoch_rows(stream, epoch=None):
    if epoch is not None:
        stream.set_epoch(epoch)
    return [batch_ids(b) for b in stream]


def _real(rows):
    return [x if not isinstance(x, list) else tuple(x) for ids, pad in rows for x, p in zip(ids, pad) if not p]


@pytest.mark.parametrize("view,batch,options", [("graphs", 16, {}), ("twins", 1000, {"compact": True}), ("twins", 700, {"mix": None})])
def test_default_mixture_reads_every_record_of_every_cache_once(levels, view, batch, options):
    s = ShardStream(list(levels.values()), view=view, batch_size=batch, seed=2, **options)
    assert s.manifest.schema("adj").max_shape == (18, 18)
    for epoch in (0, 1):
        real = _real(_epoch_rows(s, epoch))
        assert len(real) == len(set(real))
        graphs = {r[0] if isinstance(r, tuple) else r for r in real}
        assert graphs == set(range(sum(SIZES)))


def test_a_mixture_of_one_cache_gives_the_batches_of_the_cache(levels):
    from loader_fixtures import all_batches_equal

    for epoch in (0, 3):
        one = ShardStream([levels["mid"]], view="twins", batch_size=640, seed=9, compact=True)
        plain = ShardStream(levels["mid"], view="twins", batch_size=640, seed=9, compact=True)
        one.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert all_batches_equal(list(one), list(plain))


def test_weights_give_the_counts_per_epoch_and_per_batch(levels):
    m = Mixture(levels, weights={"small": 1, "mid": 2, "big": 1}, epoch_size=200)
    s = ShardStream(m, view="graphs", batch_size=20, seed=3)
    for epoch in range(3):
        rows = _epoch_rows(s, epoch)
        cache = s.mixture.cache_of(np.array(_real(rows)))
        assert np.bincount(cache, minlength=3).tolist() == [50, 100, 50]
        for ids, pad in rows:  # every batch carries the weights, to within a record or two per cache
            got = np.bincount(s.mixture.cache_of(np.array(ids)), minlength=3)
            assert np.all(np.abs(got - np.array([5, 10, 5])) <= 2), got
        per = Counter(_real(rows))
        big = [per[i] for i in range(140, 170)]  # big: 50 draws of 30 records, each once or twice
        assert min(big) >= 1 and max(big) <= 2
        mid = [r for r in per if 90 <= r < 140]
        assert len(mid) == 50 and max(per[r] for r in mid) == 2  # mid: 100 draws of 50 records, each exactly twice


def test_rows_equal_the_records_padded_to_the_largest_cache(levels):
    s = ShardStream(levels, view="graphs", batch_size=32, seed=1, fields=["adj", "base", "targets"])
    refs, offsets = union_reference(levels)
    b = s.batch(0)
    for i in range(32):
        rid = int(b["record_id"][i])
        c = int(np.searchsorted(offsets, rid, side="right") - 1)
        rec = refs[c].record(rid - int(offsets[c]))
        assert b["adj"][i].shape == (18, 18)
        assert np.array_equal(b["adj"][i].numpy(), padded(rec["adj"], (18, 18)))
        assert np.array_equal(b["base"][i].numpy(), padded(rec["base"], tuple(b["base"].shape[1:])))
        assert int(b["n"][i]) == rec["adj"].shape[0]


SCHEDULE = [Stage((0, 2), {"small": 1}), Stage((2, 4), {"small": 1, "mid": 1}), Stage((4, None), {"mid": 1, "big": 2})]


def test_schedule_follows_the_epochs_the_passes_advance_to(levels):
    s = ShardStream(Mixture(levels, schedule=SCHEDULE), view="graphs", batch_size=16, seed=0)
    shapes = set()
    for epoch in range(6):  # no set_epoch: each new iter() is the next epoch (loaders.passes)
        rows, batches = [], 0
        for b in s:
            rows.append(batch_ids(b))
            shapes.add(tuple(b["adj"].shape))
            batches += 1
        assert s.epoch == epoch and batches == len(s)
        got = np.bincount(s.mixture.cache_of(np.array(_real(rows))), minlength=3).tolist()
        assert got == s.mixture.counts(epoch).tolist()
        expect = {0: [90, 0, 0], 1: [90, 0, 0], 2: [70, 70, 0], 3: [70, 70, 0], 4: [0, 27, 53], 5: [0, 27, 53]}[epoch]
        assert got == expect
    assert shapes == {(16, 18, 18)}  # one shape from the first stage on


@pytest.mark.parametrize("nw", [0, 2])
def test_order_is_independent_of_workers_and_resumes_exactly(levels, nw):
    m = Mixture(levels, weights=[1, 1, 1], epoch_size=150)
    ref = _epoch_rows(ShardStream(m, view="twins", batch_size=500, seed=4, compact=True), 1)
    s = ShardStream(m, view="twins", batch_size=500, seed=4, compact=True)
    loader = make_loader(s, num_workers=nw)
    loader.set_epoch(1)
    got, state = [], None
    for k, b in enumerate(loader):
        got.append(batch_ids(b))
        if k == 4:
            state = loader.state_dict()
    assert got == ref
    for ids, pad in ref[:-1]:  # well mixed: a batch's rows come from many graphs of every cache
        graphs = np.unique([g for g, _, _ in ids])
        assert len(graphs) >= 30 and set(s.mixture.cache_of(graphs).tolist()) == {0, 1, 2}
    s2 = ShardStream(Mixture(levels, weights=[1, 1, 1], epoch_size=150), view="twins", batch_size=500, seed=4, compact=True)
    s2.load_state_dict(state)
    assert [batch_ids(b) for b in s2] == ref[5:]


def test_a_state_loads_only_into_the_same_mixture(levels, tmp_path):
    m = Mixture(levels, weights=[1, 1, 1])
    s = ShardStream(m, view="graphs", batch_size=16)
    it = iter(s)
    next(it)
    state = s.state_dict()
    assert [c["name"] for c in state["mixture"]["caches"]] == ["small", "mid", "big"]
    other = dict(levels, big=str(build_level(tmp_path / "big2", 16, 18, 30, seed=99)))
    with pytest.raises(CacheMismatchError, match="another cache 'big'"):
        ShardStream(Mixture(other, weights=[1, 1, 1]), view="graphs", batch_size=16).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="other weights or schedule"):
        ShardStream(Mixture(levels, weights=[1, 1, 2]), view="graphs", batch_size=16).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="mixes"):
        ShardStream(Mixture({"small": levels["small"], "mid": levels["mid"]}), view="graphs", batch_size=16).load_state_dict(state)
    with pytest.raises(CacheMismatchError, match="single cache"):
        plain = ShardStream(levels["small"], view="graphs", batch_size=16)
        ShardStream(m, view="graphs", batch_size=16).load_state_dict(plain.state_dict())
    with pytest.raises(CacheMismatchError):
        ShardStream(levels["small"], view="graphs", batch_size=16).load_state_dict(state)


# ---- bad input: one clear error, nothing read or written
def _listing(roots):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for r in roots for p in Path(r).rglob("*"))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"weights": {"small": -1, "mid": 1}}, r"^Mixture: weight of cache 'small' is -1; weights must be finite numbers >= 0"),
        ({"weights": {"small": 0, "mid": 0.0}}, "all weights are 0"),
        ({"weights": [math.nan, 1, 1]}, "weight of cache 'small' is nan"),
        ({"weights": [1, math.inf, 1]}, "weight of cache 'mid' is inf"),
        ({"weights": [1, 1]}, "2 weights for 3 caches"),
        ({"weights": {"huge": 1}}, "unknown cache 'huge'"),
        ({"epoch_size": 0}, r"^Mixture: epoch_size must be an integer in \[1, 2,147,483,648\] records, got 0"),
        ({"epoch_size": 10**12}, r"^Mixture: epoch_size must be an integer in \[1, 2,147,483,648\] records, got 1000000000000"),
        ({"schedule": [Stage((0, None), {"small": -2})]}, r"^schedule stage 0 \(epochs 0\.\.\): weight of cache 'small' is -2"),
        ({"schedule": [Stage((0, 2), {"small": 1}), Stage((3, None), {"mid": 1})]}, r"epochs 2\.\.2 have no stage \(a gap"),
        ({"schedule": [Stage((1, None), {"small": 1})]}, r"epochs 0\.\.0 have no stage"),
        ({"schedule": [Stage((0, 3), {"small": 1}), Stage((2, None), {"mid": 1})]}, "overlap"),
        ({"schedule": [Stage((0, None), {"small": 1}), Stage((2, None), {"mid": 1})]}, "overlap"),
        ({"schedule": [Stage((0, 2), {"tiny": 1})]}, "unknown cache 'tiny'"),
        ({"schedule": [Stage((2, 2), {"small": 1})]}, "empty or negative"),
        ({"schedule": [Stage((0, None))], "weights": [1, 1, 1]}, "either weights/epoch_size or a schedule"),
    ],
)
def test_bad_weights_and_schedules_are_one_config_error(levels, kwargs, match):
    before = _listing(levels.values())
    with pytest.raises(ConfigError, match=match):
        ShardStream(Mixture(levels, **kwargs), view="graphs", batch_size=8)
    assert _listing(levels.values()) == before


def test_an_epoch_past_a_closed_schedule_is_a_config_error(levels):
    s = ShardStream(Mixture(levels, schedule=[Stage((0, 1), {"small": 1})]), view="graphs", batch_size=8)
    list(s)
    with pytest.raises(ConfigError, match=r"epoch 1 is past the last stage .* epochs=\(0, None\)"):
        list(s)


def _toy(out: Path, dtype: str, kind: str = "toy") -> str:
    from cachebuild import FunctionSource, build

    def rows(rng, start, stop):
        return {"x": rng.standard_normal((stop - start, 3)).astype(dtype)}

    build(FunctionSource.per_block(rows, {"x": dtype}, kind=kind), out, records=20, progress=False, shard_mb=1)
    return str(out)


def test_caches_that_cannot_be_read_as_one_are_refused(levels, tmp_path):
    raw = str(build_level(tmp_path / "raw", 5, 8, 20, 1, codec="none"))
    cases = [
        ([levels["small"], _toy(tmp_path / "t32", "float32")], r"kind 'toy', cache 'small' .* of kind 'causal'"),
        ([_toy(tmp_path / "a" / "t", "float32"), _toy(tmp_path / "b" / "t64", "float64")], r"field 'x' is float64 .* float32"),
        ({"s": levels["small"], "r": raw}, "codec 'none'"),
        ([levels["small"], levels["small"]], "two caches are named 'small'"),
        ({"s": levels["small"], "toy": _toy(tmp_path / "c" / "t", "float32", kind="causal")}, r"has fields \['x'\]"),
    ]
    for caches, match in cases:
        roots = caches.values() if isinstance(caches, dict) else caches
        before = _listing(roots)
        with pytest.raises(ConfigError, match=match):
            ShardStream(Mixture(caches), view="records", batch_size=4)
        assert _listing(roots) == before


def test_plain_dataloader_workers_follow_the_schedule(levels):
    import torch

    s = ShardStream(Mixture(levels, schedule=SCHEDULE), view="graphs", batch_size=16, seed=0)
    loader = torch.utils.data.DataLoader(s, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(5):  # the workers advance the epoch themselves, and plan it from the schedule
        ids = _real([batch_ids(b) for b in loader])
        assert np.bincount(s.mixture.cache_of(np.array(ids)), minlength=3).tolist() == s.mixture.counts(epoch).tolist()
        assert max(Counter(ids).values()) == (1 if epoch < 2 else 2)  # 'small' read once; then 'mid' (70 of 50), 'big' (53 of 30) repeat


def test_loader_state_of_a_plain_dataloader_resumes_a_mixture(levels):
    import torch

    from loaders import loader_state

    def stream():
        return ShardStream(Mixture(levels, schedule=SCHEDULE), view="graphs", batch_size=16, seed=0)

    s = stream()
    s.set_epoch(2)
    ref = [batch_ids(b) for b in s]
    loader = torch.utils.data.DataLoader(stream(), batch_size=None, num_workers=2, persistent_workers=True)
    loader.dataset.set_epoch(2)
    it = iter(loader)
    head = [batch_ids(next(it)) for _ in range(5)]
    state = loader_state(loader)
    assert head == ref[:5] and state["epoch"] == 2 and state["mixture"]["caches"][2]["name"] == "big"
    s2 = stream()
    s2.load_state_dict(state)
    assert [batch_ids(b) for b in s2] == ref[5:]


def test_a_corrupt_record_is_named_by_its_own_cache_and_key(levels, tmp_path):
    import shutil

    from cachebuild.errors import ShardCorruptError
    from cachebuild.format import read_manifest

    mid = tmp_path / "mid"
    shutil.copytree(levels["mid"], mid)
    m = read_manifest(mid)
    e = m.shards[1]
    idx = load_index(mid / e.index)
    entry = idx[1, m.field_names.index("base")]
    with open(mid / e.name, "r+b") as fh:  # flip a byte inside record e.first_record + 1's payload
        fh.seek(int(entry["offset"]) + int(entry["size"]) // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x5A]))
    s = ShardStream({"small": levels["small"], "mid": str(mid)}, view="graphs", batch_size=50, shuffle=False)
    with pytest.raises(ShardCorruptError, match=rf"shard mid/{e.name}, record {e.first_record + 1:010d} \(union record {90 + e.first_record + 1}\)"):
        list(s)


def test_a_remote_cache_mixes_with_a_local_one(levels, tmp_path):
    from loaders.remote import RemoteOptions
    from remote_fixtures import serve_folder

    with serve_folder(Path(levels["mid"])) as (url, _):
        m = Mixture({"small": levels["small"], "mid": url})
        s = ShardStream(m, view="graphs", batch_size=16, seed=1, remote=RemoteOptions(cache_dir=str(tmp_path / "fetched")))
        ids = _real(_epoch_rows(s, 0))
        local = _real(_epoch_rows(ShardStream({"small": levels["small"], "mid": levels["mid"]}, view="graphs", batch_size=16, seed=1, window=DEFAULT_WINDOW), 0))  # a remote cache's default window
    assert ids == local and sorted(ids) == list(range(140))
