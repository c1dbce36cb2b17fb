"""Review of the tenth session's read path and builder changes, as users meet them (2026-11-24).

The one entry table per cache (and its per-shard fallback), ragged 1-d fields in one gather and
one masked write, fields of one shape written without a fill, and the builder's raised GC
threshold, tried where users would: ragged fields at the edges on every layout, caches that grow
under persistent workers (alone and in a Mixture), remote caches whose shards are evicted and
reopened, DDP with workers and a resume in fresh processes, and builds that fail or are
interrupted. Batches are compared with records read one by one with ``tarfile`` + ``zstd``
(:class:`loader_fixtures.Reference`), never with the decoder under test.
"""

from __future__ import annotations

import _thread
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp

from cachebuild import FunctionSource, build
from cachebuild.errors import SourceError
from cachebuild.format import entries, read_manifest, reader
from cachebuild.format.decode import read_block
from cachebuild.format.reader import open_cache
from loader_fixtures import padded
from loaders import Mixture, ShardStream, make_loader
from loaders.ragged import trim_to_batch_max
from loaders.remote import RemoteOptions
from remote_fixtures import free_port, serve_folder
from review_readpath_fixtures import EDGE_FIELDS, GROW_FIELDS, Records, check_batches, ddp_rank_main, edge_record, grow_record, kept

REPO = Path(__file__).resolve().parents[1]
EDGE = FunctionSource.per_record(edge_record, EDGE_FIELDS)
GROW = FunctionSource.per_record(grow_record, GROW_FIELDS)
LAYOUTS = {
    "pack1": {"pack": 1},
    "packed": {"pack": 32},
    "packed-share0": {"pack": 32, "share": 0},
    "raw-pack1": {"codec": "none", "pack": 1},
    "raw-packed": {"codec": "none", "pack": 32},
}


@pytest.fixture(scope="module")
def edge_caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("edges")
    for name, kw in LAYOUTS.items():
        build(EDGE, base / name, records=500, workers=1, shard_mb=0.05, progress=False, **kw)
    return {name: base / name for name in LAYOUTS}


# ---- ragged fields at the edges


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ragged_edges_equal_the_records_on_every_layout(edge_caches: dict[str, Path], layout: str) -> None:
    root = edge_caches[layout]
    ref = Records(root)
    schema = {f.name: f for f in ref.manifest.fields}
    assert schema["empty"].max_shape == (0,) and schema["dbool"].max_shape == (1,) and not schema["fixed"].varying_axes
    for masks, bucket, workers in ((True, None, 0), (False, "a8", 2), (True, "c17", 0), (False, None, 0)):
        stream = ShardStream(root, view="records", batch_size=64, seed=1, masks=masks, bucket_by=bucket)
        batches = kept(make_loader(stream, num_workers=workers))
        seen = check_batches(batches, ref, masks)
        assert sorted(seen) == list(range(500)), (masks, bucket, workers)  # each record once; 500 = 7 x 64 + 52: 12 pad rows
        assert sum(int(b["is_pad"].sum()) for b in batches) == 12
        if bucket is not None:  # trimmed to the batch's longest record: still each record's own data
            for batch in batches:
                trimmed = trim_to_batch_max({k: torch.from_numpy(v) for k, v in batch.items()})
                for i, rid in enumerate(batch["record_id"].tolist()):
                    want = ref.record(rid)[bucket]
                    row = trimmed[bucket][i].numpy()
                    assert row.tobytes() == padded(want, row.shape).tobytes(), rid
                    assert int(trimmed[f"{bucket}_lengths"][i]) == len(want)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_edges_take_both_paths_of_the_decoder(edge_caches: dict[str, Path], layout: str) -> None:
    """What the test above covers: 17 lengths read as one gather, 16 run by run, tiny ones run by run."""
    paths: dict[str, set[bool]] = {}
    with open_cache(edge_caches[layout]) as shards:
        rng = np.random.default_rng(0)
        for _ in range(10):
            got = read_block(shards, rng.choice(500, 64, replace=False), ["a8", "bmany", "b16", "c17", "dbool", "e64"])
            for name, blk in got.items():
                paths.setdefault(name, set()).add(blk.segments is not None)
    assert paths["a8"] == paths["bmany"] == paths["e64"] == {True}
    assert True in paths["c17"] and False in paths["b16"] and paths["dbool"] == {False}


# ---- caches that grow under persistent workers


def _cli(cwd: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-m", "cachebuild", *args, "--workers", "1"], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_growing_cache_and_a_mixture_with_it_under_persistent_workers(tmp_path: Path) -> None:
    root, other = tmp_path / "grow", tmp_path / "other"
    recipe = tmp_path / "grow.toml"
    recipe.write_text('kind = "review_readpath_fixtures:grow_source"\nrecords = 300\n')
    build(GROW, root, records=300, workers=1, shard_mb=0.03, progress=False, pack=16)
    build(GROW, other, records=120, workers=1, shard_mb=0.03, progress=False, pack=16, seed=9)
    loader = make_loader(ShardStream(root, view="records", batch_size=32, seed=2), num_workers=2)
    mstream = ShardStream(Mixture({"g": str(root), "o": str(other)}), view="records", batch_size=32, seed=4)
    mloader = make_loader(mstream, num_workers=2)
    for generation, (records, shard_mb) in enumerate(((300, 0), (200, 0.03), (150, 0.05))):  # then two appends (other shard sizes)
        if generation:  # the command line's append, as a user's background builder runs it
            _cli(tmp_path, "build", "--config", str(recipe), "--out", str(root), "--append", "--records", str(records), "--shard-mb", str(shard_mb))
        ref = Records(root)
        assert sorted(check_batches(kept(loader), ref)) == list(range(ref.manifest.records))
        batches, mix = kept(mloader), mstream.mixture
        assert mix is not None and mix.generations == (generation, 0)
        refs = (ref, Records(other))
        union = {f.name: tuple(f.max_shape) for f in mix.manifest.fields}
        seen = []
        for batch in batches:
            for i, rid in enumerate(batch["record_id"].tolist()):
                c = int(mix.cache_of(np.array([rid]))[0])
                want = refs[c].record(rid - int(mix.offsets[c]))
                for name in ("tok", "m2"):
                    assert batch[name][i].tobytes() == padded(want[name], union[name]).tobytes(), (rid, name)
            seen += batch["record_id"][~batch["is_pad"]].tolist()
        assert sorted(seen) == list(range(int(mix.offsets[-1])))
    assert len(read_manifest(root).shards) > 10


# ---- remote caches whose shards are evicted and reopened


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("table", ["whole", "per_shard"])
def test_remote_eviction_ragged_packed_every_batch_once_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str) -> None:
    if table == "per_shard":
        monkeypatch.setattr(entries, "WHOLE_TABLE_BYTES", 0)
    root = tmp_path / "cache"
    build(GROW, root, records=400, workers=1, shard_mb=0.03, progress=False, pack=16)  # shared frames, 9 shards
    manifest = read_manifest(root)
    with open_cache(root) as shards:
        assert all(shards.layout(s).shared[:, shards.field_pos["tok"]].any() for s in range(len(manifest.shards)))
    ref = Records(root)
    unit = max(s.bytes + s.index_bytes for s in manifest.shards)
    fills: list[int] = []
    opened: list[str] = []
    fill, open_shard = entries.shard_table, reader.open_shard
    monkeypatch.setattr(entries, "shard_table", lambda shards, s, cols, nd: fills.append(s) or fill(shards, s, cols, nd))
    monkeypatch.setattr(reader, "open_shard", lambda m, entry, *a: opened.append(entry.name) or open_shard(m, entry, *a))
    with serve_folder(root) as (url, _):
        for workers in (0, 2):
            opts = RemoteOptions(cache_dir=str(tmp_path / f"local{workers}"), cache_limit_bytes=3 * unit, prefetch=1, timeout_s=10)

            def loader() -> object:
                return make_loader(ShardStream(url, view="records", batch_size=24, seed=3, remote=opts), num_workers=workers)

            first = loader()
            fills.clear()
            opened.clear()
            for _ in range(2):  # two epochs: shards fetched, closed after their last batch, evicted, fetched and opened again
                assert sorted(check_batches(kept(first), ref)) == list(range(400))
            if workers == 0:  # each shard's rows filled once per open, and shards were opened again within an epoch
                assert len(fills) == len(opened) > 2 * len(manifest.shards)
            head_loader = loader()
            head = kept(head_loader, 5)
            state = json.loads(json.dumps(head_loader.state_dict()))
            resumed = loader()
            resumed.load_state_dict(state)
            assert sorted(check_batches(head + kept(resumed), ref)) == list(range(400))


# ---- DDP with workers, one table per shard, resumed in fresh processes


def _launch(world: int, root: Path, out_dir: Path, phase: str, steps: int) -> list[dict]:
    ctx = tmp.start_processes(ddp_rank_main, args=(world, free_port(), str(root), str(out_dir), phase, steps), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + 150
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("DDP ranks did not finish within 150 s (hang?)")
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    errors = [f"rank {r}:\n{res['error']}" for r, res in enumerate(results) if "error" in res]
    assert not errors, "\n".join(errors)
    return results


@pytest.mark.dist
@pytest.mark.timeout(360)
def test_ddp_workers_per_shard_tables_and_a_resume_in_fresh_processes(edge_caches: dict[str, Path], tmp_path: Path) -> None:
    root = edge_caches["packed"]
    saved = _launch(2, root, tmp_path, "save", 4)
    resumed = _launch(2, root, tmp_path, "resume", 0)
    epoch0 = [r for res in saved for r in res["epochs"]["0"]]
    epoch1 = [r for res in saved + resumed for r in res["epochs"]["1"]]
    assert sorted(epoch0) == sorted(epoch1) == list(range(500))


# ---- the GC threshold a build leaves behind


def _slow_record(rng: np.random.Generator, index: int, fail_at: int = -1, interrupt: bool = False) -> dict:
    if index == fail_at:
        raise KeyboardInterrupt if interrupt else ValueError(f"record {index} is bad")
    time.sleep(0.003)
    return {"x": rng.standard_normal(8).astype(np.float32)}


@pytest.fixture
def own_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(555, 7, 3)
    yield (555, 7, 3)
    gc.set_threshold(*before)


@pytest.mark.parametrize("backend,workers", [("loky", 1), ("threading", 2)])
@pytest.mark.parametrize("how", ["done", "error", "source-interrupt", "ctrl-c"])
def test_a_build_leaves_the_gc_threshold_and_nothing_running(tmp_path: Path, own_thresholds, backend: str, workers: int, how: str) -> None:
    """A shard failing (or Ctrl-C) while another thread writes one: the build returns only once no
    thread writes, with the caller's thresholds (joblib's threading backend returned at once, its
    threads writing on outside the build lock, generation 0's threshold still raised for them)."""
    out = tmp_path / "c"
    params = {"fail_at": 40 if how in ("error", "source-interrupt") else -1, "interrupt": how == "source-interrupt"}
    src = FunctionSource.per_record(_slow_record, {"x": "float32"}, params=params)
    timer = threading.Timer(0.3, _thread.interrupt_main) if how == "ctrl-c" else None
    expected = {"done": None, "error": SourceError, "source-interrupt": KeyboardInterrupt, "ctrl-c": KeyboardInterrupt}[how]
    try:
        if timer is not None:
            timer.start()
        if expected is None:
            build(src, out, records=500, workers=workers, backend=backend, shard_mb=0.01, progress=False)
        else:
            with pytest.raises(expected):
                build(src, out, records=500, workers=workers, backend=backend, shard_mb=0.01, progress=False)
                time.sleep(5)  # (ctrl-c: a build that finished first is still interrupted, here)
    finally:
        if timer is not None:
            timer.cancel()
    assert gc.get_threshold() == own_thresholds
    files = sorted(p.name for p in out.iterdir())
    time.sleep(0.6)  # a shard takes ~0.4 s: one still being written would show
    assert sorted(p.name for p in out.iterdir()) == files
    assert gc.get_threshold() == own_thresholds


# ---- the per-shard tables go with their shards


def test_per_shard_tables_go_with_their_shards(edge_caches: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache over WHOLE_TABLE_BYTES read shard by shard and released (``verify``, a remote cache's
    eviction) holds the entries of its open shards only, as before the one-table change (they
    lived on the open shard): every shard's table kept was the whole table's memory again."""
    monkeypatch.setattr(entries, "WHOLE_TABLE_BYTES", 0)
    root = edge_caches["packed"]
    ref = Records(root)
    names = ["a8", "c17", "m2"]
    with open_cache(root) as shards:
        starts = shards.starts
        for again in range(2):  # the second pass reopens every shard: refilled, and still right
            for s in range(len(shards.manifest.shards)):
                ids = np.arange(starts[s], starts[s + 1])
                got = read_block(shards, ids, names)
                for name in names:
                    out = np.zeros((len(ids),) + tuple(shards.manifest.schema(name).max_shape), shards.manifest.schema(name).dtype)
                    got[name].scatter(out)
                    want = [padded(ref.record(int(r))[name], out.shape[1:]) for r in ids]
                    assert out.tobytes() == np.stack(want).tobytes(), (again, s, name)
                shards.release([s])
                (table,) = shards.__dict__["_entry_tables"].values()
                assert table.rows is None and list(table.parts) == [], (again, s)
