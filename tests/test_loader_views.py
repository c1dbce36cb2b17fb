"""Every value a view yields equals the value in the shard (read with a plain tarfile + zstd reader); padding and masks are right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loader_fixtures import Reference, batches_equal, causal_cache, causal_cache_packed, causal_cache_raw, padded  # noqa: F401
from loaders import ShardStream, expand_compact, register_view
from loaders.views import VIEWS, make_view
from loaders.views.records import RecordsView


@pytest.fixture(scope="module", params=["zstd", "raw", "packed"])
def cache(request, causal_cache, causal_cache_raw, causal_cache_packed):
    return {"zstd": causal_cache, "raw": causal_cache_raw, "packed": causal_cache_packed}[request.param]


def _all_batches(stream: ShardStream, epoch: int = 0) -> list[dict]:
    plan = stream.plan(epoch)
    return [stream.batch(b, epoch) for b in range(plan.batches)]


def test_graphs_view_equals_shards(cache):
    ref = Reference(cache)
    stream = ShardStream(cache, view="graphs", batch_size=48, seed=5)
    N = ref.manifest.schema("adj").max_shape[0]
    K = ref.manifest.schema("targets").max_shape[0]
    S = ref.manifest.schema("base").max_shape[0]
    seen = []
    small = 0
    for batch in _all_batches(stream):
        assert batch["adj"].shape == (48, N, N) and batch["int"].shape == (48, K, S, N)
        for i, rid in enumerate(batch["record_id"].tolist()):
            rec = ref.record(rid)
            n, k = rec["adj"].shape[0], rec["targets"].shape[0]
            small += n < N
            assert np.array_equal(batch["adj"][i].numpy(), padded(rec["adj"], (N, N)))
            assert np.array_equal(batch["base"][i].numpy(), padded(rec["base"], (S, N)))
            assert np.array_equal(batch["int"][i].numpy(), padded(rec["int"], (K, S, N)))
            assert np.array_equal(batch["delta"][i].numpy(), padded(rec["delta"], (K, S, N)))
            assert np.array_equal(batch["targets"][i].numpy(), padded(rec["targets"], (K,), fill=-1))
            assert np.array_equal(batch["values"][i].numpy(), padded(rec["values"], (K,)))
            assert batch["node_mask"][i].tolist() == [j < n for j in range(N)]
            assert batch["int_mask"][i].tolist() == [j < k for j in range(K)]
            assert (int(batch["n"][i]), int(batch["num_int"][i])) == (n, k)
            seen.append((rid, bool(batch["is_pad"][i])))
    assert small > 0  # graphs below max n were checked
    real = sorted(r for r, pad in seen if not pad)
    assert real == list(range(ref.manifest.records))
    assert len(seen) - len(real) == (-ref.manifest.records) % 48


def test_graphs_computed_delta_is_bit_identical(causal_cache):
    a = ShardStream(causal_cache, view="graphs", batch_size=40)
    b = ShardStream(causal_cache, view="graphs", batch_size=40, delta="computed")
    for i in range(a.plan().batches):
        assert batches_equal(a.batch(i), b.batch(i))


def _graph_table(ref: Reference, N: int, K: int, S: int) -> dict[str, np.ndarray]:
    """Every graph's fields padded, stacked by record id (the reference the twin rows index)."""
    n_rec = ref.manifest.records
    t = {k: [] for k in ("base", "int", "delta", "targets", "values", "adj", "n")}
    for rid in range(n_rec):
        rec = ref.record(rid)
        t["base"].append(padded(rec["base"], (S, N)))
        t["int"].append(padded(rec["int"], (K, S, N)))
        t["delta"].append(padded(rec["delta"], (K, S, N)))
        t["targets"].append(padded(rec["targets"].astype(np.int64), (K,)))
        t["values"].append(padded(rec["values"], (K,)))
        t["adj"].append(padded(rec["adj"].astype(np.float32), (N, N)))
        t["n"].append(rec["adj"].shape[0])
    return {k: np.stack(v) if k != "n" else np.array(v) for k, v in t.items()}


def test_twins_view_equals_shards(cache):
    ref = Reference(cache)
    N = ref.manifest.schema("adj").max_shape[0]
    K = ref.manifest.schema("targets").max_shape[0]
    S = ref.manifest.schema("base").max_shape[0]
    table = _graph_table(ref, N, K, S)
    stream = ShardStream(cache, view="twins", batch_size=3000, seed=1)
    keys = []
    for batch in _all_batches(stream):
        g = batch["graph_id"].numpy()
        k = batch["int_index"].numpy()
        j = batch["row_index"].numpy()
        node = table["targets"][g, k]
        assert np.array_equal(batch["base_samples"].numpy(), table["base"][g])
        assert np.array_equal(batch["int_samples"].numpy(), table["int"][g, k])
        assert np.array_equal(batch["target_row"].numpy(), table["base"][g, j])
        assert np.array_equal(batch["int_row"].numpy(), table["int"][g, k, j])
        assert np.array_equal(batch["delta"].numpy(), table["delta"][g, k, j])
        assert np.array_equal(batch["int_node_idx"].numpy(), node)
        assert np.array_equal(batch["int_mask"].numpy(), np.eye(N, dtype=np.float32)[node])
        assert np.array_equal(batch["value"].numpy(), table["values"][g, k])
        assert np.array_equal(batch["adj"].numpy(), table["adj"][g])
        assert np.array_equal(batch["n"].numpy(), table["n"][g])
        assert np.array_equal(batch["node_mask"].numpy(), np.arange(N)[None] < table["n"][g][:, None])
        assert (node < table["n"][g]).all()
        keys += list(zip(g.tolist(), k.tolist(), j.tolist(), batch["is_pad"].tolist()))
    real = [x[:3] for x in keys if not x[3]]
    assert len(real) == len(set(real))
    ints = np.array([ref.record(r)["int"].shape[0] for r in range(ref.manifest.records)])
    assert len(real) == int(ints.sum()) * S  # every (graph, k, j) exactly once
    assert len(keys) - len(real) < 3000


def test_twins_rows_mix_many_graphs_or_few_without_mixing(causal_cache):
    stream = ShardStream(causal_cache, view="twins", batch_size=4096, seed=0)
    g = stream.batch(3)["graph_id"].numpy()
    assert (g[1:] != g[:-1]).mean() > 0.5  # consecutive rows come from different graphs
    from cachebuild.causal import parse_causal_config
    from cachebuild.format import read_manifest

    assert 150 <= len(np.unique(g)) <= stream.view.g_max  # a pool of all 200 graphs, chunks of 8 rows
    plain = ShardStream(causal_cache, view="twins", batch_size=4096, seed=0, mix=None)
    g = plain.batch(3)["graph_id"].numpy()
    assert (g[1:] != g[:-1]).mean() > 0.5  # still mixed inside the batch
    cfg = parse_causal_config(read_manifest(causal_cache).config)  # the default recipe's fewest rows per graph
    k_min = min(cfg.num_interventions(n) for n in range(cfg.graph.n_min, cfg.graph.n_max + 1))
    assert len(np.unique(g)) <= 4096 // (k_min * cfg.samples.base) + 2  # consecutive rows of the graph order: a few graphs


@pytest.mark.parametrize("mix,smaller", [(1024, 4), (None, 10)])
def test_twins_compact_expands_to_the_default_view(cache, mix, smaller):
    full = ShardStream(cache, view="twins", batch_size=2500, seed=4, mix=mix)
    compact = ShardStream(cache, view="twins", batch_size=2500, seed=4, compact=True, mix=mix)
    if mix is None:
        compact = ShardStream(cache, view="twins", batch_size=2500, seed=4, compact=True, mix=None, chunk=64)
        full = ShardStream(cache, view="twins", batch_size=2500, seed=4, mix=None, chunk=64)
    assert compact.layout.nbytes * smaller < full.layout.nbytes
    for b in range(full.plan().batches):
        want, got = full.batch(b), compact.batch(b)
        G = int(got["ctx_mask"].sum())
        assert G == len(np.unique(want["graph_id"].numpy()))
        assert (got["ctx_record_id"][G:] == -1).all() and (got["ctx_base"][G:] == 0).all()
        assert int(got["graph_index"].max()) < G
        V = int(got["world_index"].max()) + 1
        assert V == len(np.unique(want["graph_id"].numpy() * 100 + want["int_index"].numpy()))
        assert (got["ctx_int"][V:] == 0).all()
        exp = expand_compact(got)
        for key in want:
            assert torch.equal(exp[key], want[key]), key


def test_twins_computed_delta_is_bit_identical(causal_cache):
    a = ShardStream(causal_cache, view="twins", batch_size=3000)
    b = ShardStream(causal_cache, view="twins", batch_size=3000, delta="computed")
    for i in range(a.plan().batches):
        assert batches_equal(a.batch(i), b.batch(i))


@pytest.mark.parametrize("fixture", ["toy_cache", "toy_cache_raw"])
def test_records_view_on_a_toy_cache(fixture, request):
    root = request.getfixturevalue(fixture)
    ref = Reference(root)
    stream = ShardStream(root, view="records", batch_size=100, seed=2)
    mat = ref.manifest.schema("mat")
    M = mat.max_shape
    assert "vec_shape" not in stream.layout.fields and "mat_mask" in stream.layout.fields
    seen = []
    for batch in _all_batches(stream):
        for i, rid in enumerate(batch["record_id"].tolist()):
            rec = ref.record(rid)
            n = rec["mat"].shape[0]
            assert np.array_equal(batch["mat"][i].numpy(), padded(rec["mat"], M))
            assert batch["mat_shape"][i].tolist() == [n, n]
            assert np.array_equal(batch["mat_mask"][i].numpy(), padded(np.ones((n, n), bool), M))
            assert np.array_equal(batch["vec"][i].numpy(), rec["vec"])
            assert int(batch["ident"][i]) == rid == int(rec["ident"])
            seen.append((rid, bool(batch["is_pad"][i])))
    assert sorted(r for r, p in seen if not p) == list(range(ref.manifest.records))


def test_view_registry_is_open():
    class Idents(RecordsView):
        name = "idents"

        def __init__(self, manifest, batch_size):
            super().__init__(manifest, batch_size, fields=["ident"], masks=False)

    register_view("idents", Idents)
    try:
        assert "idents" in VIEWS
        with pytest.raises(ValueError, match="already registered"):
            register_view("idents", RecordsView)
    finally:
        VIEWS.pop("idents")


def test_view_errors(causal_cache, toy_cache):
    from cachebuild.format import read_manifest

    with pytest.raises(ValueError, match="unknown view 'nope'"):
        make_view("nope", read_manifest(causal_cache), 4)
    with pytest.raises(ValueError, match="needs field"):
        ShardStream(toy_cache, view="graphs", batch_size=4)
    with pytest.raises(ValueError, match=r"batch_size must be a whole number, got 2\.5"):
        ShardStream(causal_cache, view="graphs", batch_size=2.5)
    with pytest.raises(ValueError, match=r"seed must be a whole number, got 1\.5"):
        ShardStream(causal_cache, view="graphs", batch_size=4, seed=1.5)
    with pytest.raises(TypeError, match="twins"):
        ShardStream(causal_cache, view="twins", batch_size=4, compcat=True)
    with pytest.raises(ValueError, match=r"compact must be True, False or 'pool', got 'yes'"):
        ShardStream(causal_cache, view="twins", batch_size=4, compact="yes")
    with pytest.raises(ValueError, match="JSON"):
        ShardStream(toy_cache, view="records", batch_size=4, fields=["json"])
