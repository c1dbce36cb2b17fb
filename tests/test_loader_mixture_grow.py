"""A mixture whose caches grow: each epoch reads, per cache, the generation that was newest when it
started; resume is exact across a generation change (also in a fresh process); leases keep what a
mixture reader in another process holds; worker counts do not change the batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cachebuild import build
from grow_fixtures import REPO, cli, shard_files, toy_recipe, toy_source
from loaders import Mixture, ShardStream, make_loader
from loaders.generations import GenerationWarning

pytestmark = pytest.mark.timeout(300)

BATCH = 32


def _toy(out: Path, records: int, seed: int, append: bool = False, **params: int) -> None:
    build(toy_source(**params), out, records=records, seed=seed, shard_mb=0.02, progress=False, workers=1, append=append)


def _caches(tmp_path: Path) -> dict[str, str]:
    """Two toy caches: ``a`` (200 records) and ``b`` (120), generation 0 each."""
    _toy(tmp_path / "a", 200, seed=5)
    _toy(tmp_path / "b", 120, seed=6)
    return {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}


def _stream(roots: dict[str, str], **mix: object) -> ShardStream:
    return ShardStream(Mixture(roots, **mix), view="records", batch_size=BATCH, seed=1)  # type: ignore[arg-type]


def _rows(stream: ShardStream, batches: list) -> list[tuple[int, int]]:
    """(cache, ident) of every real row, in order (the stream's mixture as of the epoch read)."""
    out: list[tuple[int, int]] = []
    assert stream.mixture is not None
    for b in batches:
        real = ~b["is_pad"]
        caches = stream.mixture.cache_of(b["record_id"][real].numpy())
        out += list(zip(caches.tolist(), b["ident"][real].tolist()))
    return out


def _once(rows: list[tuple[int, int]], sizes: list[int]) -> None:
    for c, size in enumerate(sizes):
        assert sorted(i for k, i in rows if k == c) == list(range(size)), f"cache {c}: not every record once"


def test_a_grown_cache_is_picked_up_at_the_next_epoch_with_0_or_2_workers_alike(tmp_path: Path) -> None:
    roots = _caches(tmp_path)
    streams = [_stream(roots), _stream(roots)]
    loaders = [make_loader(streams[0], num_workers=0), make_loader(streams[1], num_workers=2)]
    its = [iter(loader) for loader in loaders]
    firsts = [[next(it) for _ in range(3)] for it in its]
    _toy(tmp_path / "a", 120, seed=5, append=True)  # committed mid-epoch: generation 1 of cache a
    epoch0 = [_rows(s, f + list(it)) for s, f, it in zip(streams, firsts, its)]
    epoch1 = []
    for s, loader in zip(streams, loaders):
        it = iter(loader)
        first = [next(it)]
        state = loader.state_dict()
        assert [c["generation"] for c in state["mixture"]["caches"]] == [1, 0] and "generation" not in state
        assert s.generations == (1, 0)
        epoch1.append(_rows(s, first + list(it)))
    assert epoch0[0] == epoch0[1] and epoch1[0] == epoch1[1], "0 and 2 workers read other batches"
    _once(epoch0[0], [200, 120])  # an epoch reads the generations it started with
    _once(epoch1[0], [320, 120])  # the next, the newest: every record of the grown cache once
    # the plan is a function of (each cache's generation, weights, seed, epoch): a fresh stream agrees
    fresh = _stream(roots)
    fresh.set_epoch(1)
    assert _rows(fresh, list(fresh)) == epoch1[0]


def test_weights_with_an_epoch_size_keep_their_counts_when_a_cache_grows(tmp_path: Path) -> None:
    roots = _caches(tmp_path)
    s = _stream(roots, weights={"a": 1, "b": 1}, epoch_size=100)
    counts = []
    for epoch in range(3):
        if epoch == 1:
            _toy(tmp_path / "a", 400, seed=5, append=True)
        rows = _rows(s, list(s))
        a = [i for c, i in rows if c == 0]
        counts.append(np.bincount([c for c, _ in rows], minlength=2).tolist())
        assert len(set(a)) == len(a), "a share below the cache's size repeats a record"
        assert max(a) < (200 if epoch == 0 else 600)
    assert counts == [[50, 50]] * 3 and s.generations == (1, 0)
    assert s.mixture is not None and s.mixture.records.tolist() == [600, 120]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_across_a_generation_change_is_exact(tmp_path: Path, workers: int) -> None:
    roots = _caches(tmp_path)
    ref_stream = _stream(roots)
    reference = _rows(ref_stream, list(ref_stream))
    run_stream = _stream(roots)
    run = make_loader(run_stream, num_workers=workers)
    it = iter(run)
    taken = _rows(run_stream, [next(it) for _ in range(4)])
    state = run.state_dict()
    del it, run
    _toy(tmp_path / "a", 120, seed=5, append=True)
    _toy(tmp_path / "b", 40, seed=6, append=True)
    fresh = _stream(roots)
    assert fresh.generations == (1, 1)
    resumed = make_loader(fresh, num_workers=workers)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # reads generations (0, 0) although newer exist
    assert fresh.generations == (0, 0)
    assert taken + _rows(fresh, list(resumed)) == reference
    _once(_rows(fresh, list(resumed)), [320, 160])  # the epoch after: the newest of both
    assert fresh.generations == (1, 1)


_RESUME = """
import json, sys
from loaders import Mixture, ShardStream
roots, state, out = json.loads(sys.argv[1]), json.loads(open(sys.argv[2]).read()), sys.argv[3]
s = ShardStream(Mixture(roots), view="records", batch_size=32, seed=1)
s.load_state_dict(state)
def rows(batches):
    o = []
    for b in batches:
        real = ~b["is_pad"]
        o += [[int(c), int(i)] for c, i in zip(s.mixture.cache_of(b["record_id"][real].numpy()), b["ident"][real].tolist())]
    return o
rest = rows(list(s))
gens = list(s.generations)
nxt = rows(list(s))
json.dump({"rest": rest, "generations": gens, "next": nxt, "next_generations": list(s.generations)}, open(out, "w"))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}


def test_resume_across_a_generation_change_in_a_fresh_process(tmp_path: Path) -> None:
    roots = _caches(tmp_path)
    s = _stream(roots)
    it = iter(s)
    taken = _rows(s, [next(it) for _ in range(5)])
    (tmp_path / "state.json").write_text(json.dumps(s.state_dict()))
    rest_here = _rows(s, list(it))
    del it, s
    _toy(tmp_path / "b", 80, seed=6, append=True)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME)
    subprocess.run([sys.executable, str(script), json.dumps(roots), str(tmp_path / "state.json"), str(tmp_path / "out.json")], env=_env(), check=True, timeout=120)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["generations"] == [0, 0] and [tuple(r) for r in out["rest"]] == rest_here
    _once(taken + rest_here, [200, 120])
    assert out["next_generations"] == [0, 1]
    _once([(c, i) for c, i in out["next"]], [200, 200])


_READER = """
import json, sys, time
from pathlib import Path
from loaders import Mixture, ShardStream
roots, ready, go, out = json.loads(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
s = ShardStream(Mixture(roots), view="records", batch_size=32, seed=1)
it = iter(s)
batches = [next(it)]
ready.write_text(json.dumps(list(s.generations)))
while not go.exists():
    time.sleep(0.02)
batches += list(it)
rows = []
for b in batches:
    real = ~b["is_pad"]
    rows += [[int(c), int(i)] for c, i in zip(s.mixture.cache_of(b["record_id"][real].numpy()), b["ident"][real].tolist())]
out.write_text(json.dumps({"generations": list(s.generations), "rows": rows}))
"""


def test_keep_1_never_deletes_shards_a_mixture_reader_in_another_process_holds(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    roots = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    for root in roots.values():
        cli("build", "--config", str(recipe), "--out", root, "-q")
    a, b = Path(roots["a"]), Path(roots["b"])
    gen0 = set(shard_files(a))
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    ready, go = tmp_path / "ready.json", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(roots), str(ready), str(go), str(tmp_path / "out.json")], env=_env())
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(ready.read_text()) == [0, 0], "the reader did not start"
        cli("build", "--config", str(recipe), "--out", roots["a"], "-q", "--append", "--records", "100", "--keep", "1")
        gen1 = set(shard_files(a)) - gen0
        cli("build", "--config", str(recipe), "--out", roots["a"], "-q", "--append", "--records", "100", "--keep", "1")
        files = set(shard_files(a))
        assert gen0 <= files, "--keep deleted shards of a generation a mixture reader holds"
        assert gen1 and not gen1 & files, "generation 1 (no reader) was kept"
        assert "kept for readers: 0" in cli("prune", roots["a"]).stdout
        cli("build", "--config", str(recipe), "--out", roots["b"], "-q", "--append", "--records", "100", "--keep", "1")
        assert set(shard_files(b)) >= gen0, "--keep deleted shards of cache b the reader holds"
    finally:
        go.write_text("")
        assert proc.wait(timeout=120) == 0
    done = json.loads((tmp_path / "out.json").read_text())
    assert done["generations"] == [0, 0]
    _once([(c, i) for c, i in done["rows"]], [200, 200])
    cli("prune", roots["a"])  # the reader is gone: generation 0 goes now
    assert not gen0 & set(shard_files(a))


def test_a_generation_with_larger_shapes_keeps_that_cache_and_moves_the_others(tmp_path: Path) -> None:
    # cache a: 4..6-node matrices, generation 0 too small to hold a 6 (seed picked so); b: fixed 4x4
    _toy(tmp_path / "a", 3, seed=SMALL_SEED, n_min=4, n_max=6)
    _toy(tmp_path / "b", 50, seed=6)
    roots = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    s = _stream(roots)
    shape = s.layout.spec()
    list(s)
    _toy(tmp_path / "a", 200, seed=SMALL_SEED, append=True, n_min=4, n_max=6)
    _toy(tmp_path / "b", 30, seed=6, append=True)
    with pytest.warns(GenerationWarning, match="generation 1 of cache 'a' .* keeps generation 0 of it"):
        rows = _rows(s, list(s))
    assert s.generations == (0, 1) and s.layout.spec() == shape
    _once(rows, [3, 80])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per (cache, generation)
        list(s)


SMALL_SEED = 6


def test_plain_dataloader_workers_follow_a_grown_cache_at_set_epoch(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from loaders import loader_state

    roots = _caches(tmp_path)
    s = _stream(roots)
    loader = DataLoader(s, batch_size=None, num_workers=2, persistent_workers=True)
    s.set_epoch(0)
    _once(_rows(s, [b for b in loader]), [200, 120])
    _toy(tmp_path / "b", 60, seed=6, append=True)
    s.set_epoch(1)
    it = iter(loader)
    batches = [next(it)]
    assert [c["generation"] for c in loader_state(loader)["mixture"]["caches"]] == [0, 1]
    _once(_rows(s, batches + [b for b in it]), [200, 180])


@pytest.mark.dist
def test_ddp_ranks_agree_on_each_caches_generation(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from grow_fixtures import ddp_mixture_grow_rank
    from loader_fixtures import free_port

    _toy(tmp_path / "a", 120, seed=5)
    _toy(tmp_path / "b", 50, seed=6)
    roots = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    mp.spawn(ddp_mixture_grow_rank, args=(2, free_port(), roots, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert "error" not in r, r.get("error")
    for e in range(3):
        gens = {tuple(r["epochs"][e]["generations"]) for r in ranks}
        assert len(gens) == 1, f"epoch {e}: ranks read generations {gens}"
        rows = [tuple(x) for r in ranks for x in r["epochs"][e]["rows"]]
        _once(rows, [120 if gens == {(0, 0)} else 160, 50])
    assert ranks[0]["epochs"][0]["generations"] == [0, 0] and ranks[0]["epochs"][2]["generations"] == [1, 0]


_BUILDER = """
for i in $(seq {rounds}); do
  "{python}" -m cachebuild.cli build --config "{recipe}" --out "{root}" -q --append --records 60 --keep 2 || exit 1
  sleep 0.3
done
"""


def test_a_mixture_reads_while_a_background_builder_grows_one_cache(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    roots = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    for root in roots.values():
        cli("build", "--config", str(recipe), "--out", root, "-q")
    script = _BUILDER.format(rounds=4, python=sys.executable, recipe=recipe, root=roots["a"])
    builder = subprocess.Popen(["bash", "-c", script], env=_env())
    stream = _stream(roots)
    loader = make_loader(stream, num_workers=2)
    seen: list[int] = []
    try:
        finished = None
        while finished is None or len(seen) < 2 or seen[-1] != 4:
            if finished is None and builder.poll() is not None:
                finished = builder.returncode
            it = iter(loader)
            batches = [next(it)]
            assert stream.mixture is not None
            generation, manifest = stream.generations[0], stream.mixture.manifests[0]  # the epoch's (leased while it runs)
            rows = _rows(stream, batches + list(it))
            first = manifest.build.get("first_record", 0)
            assert sorted(i for c, i in rows if c == 0) == list(range(first, first + manifest.records)), f"cache a at generation {generation}: not that generation, once"
            assert sorted(i for c, i in rows if c == 1) == list(range(200))
            assert not seen or generation >= seen[-1]
            seen.append(generation)
            if finished is not None and seen[-1] != 4:
                raise AssertionError(f"after the builder ended the mixture still reads generation {seen[-1]} of cache a")
    finally:
        builder.wait(timeout=200)
    assert finished == 0
    assert len(set(seen)) >= 2, f"the mixture saw generations {sorted(set(seen))} of cache a only"


def test_a_mixture_state_on_a_pruned_or_invalid_generation_is_a_clear_error(tmp_path: Path) -> None:
    from cachebuild.errors import CacheMismatchError, ManifestError

    roots = _caches(tmp_path)
    s = _stream(roots)
    it = iter(s)
    next(it)
    state = s.state_dict()
    del it, s  # its leases go with it
    build(toy_source(), roots["b"], records=50, seed=6, shard_mb=0.02, progress=False, workers=1, append=True, keep=1)
    fresh = _stream(roots)
    with pytest.raises(ManifestError, match="generation 0 of the cache .*b is not on disk any more"):
        fresh.load_state_dict(state)
    bad = json.loads(json.dumps(state))
    bad["mixture"]["caches"][1]["generation"] = "1"
    with pytest.raises(ValueError, match="invalid generation for cache 'b': '1'"):
        fresh.load_state_dict(bad)
    with pytest.raises(CacheMismatchError, match="saved from a mixture of caches"):
        ShardStream(roots["a"], view="records", batch_size=BATCH, seed=1).load_state_dict(state)
    assert fresh.generations == (0, 1)
    rows = _rows(fresh, list(fresh))  # a failed load changed nothing: the newest generations, b's old one pruned
    _once(rows, [200])
    assert sorted(i for c, i in rows if c == 1) == list(range(120, 170))
