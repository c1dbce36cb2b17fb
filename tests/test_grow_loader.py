"""A loader over a growing cache: each epoch reads one whole generation (the newest when it starts),
resumes exactly across a generation change, and holds what it reads against ``--keep``/``prune``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from cachebuild import build
from cachebuild.errors import ManifestError
from grow_fixtures import REPO, cli, shard_files, toy_recipe, toy_source
from loaders import ShardStream, loader_state, make_loader

pytestmark = pytest.mark.timeout(300)

BATCH = 32


def _toy(out: Path, records: int = 200, **kw) -> None:
    build(toy_source(), out, records=records, seed=5, shard_mb=0.02, progress=False, workers=1, **kw)


def _idents(batches: list) -> list[int]:
    return [int(v) for b in batches for v in b["ident"][~b["is_pad"]].tolist()]


def _stream(root: Path) -> ShardStream:
    return ShardStream(root, view="records", batch_size=BATCH, seed=1)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_reads_one_generation_and_the_next_the_newest(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "c"
    _toy(root)
    stream = _stream(root)
    loader = make_loader(stream, num_workers=workers)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    _toy(root, records=120, append=True)  # committed mid-epoch
    epoch0 = first + list(it)
    assert sorted(_idents(epoch0)) == list(range(200)), "an epoch mixed two generations"
    it = iter(loader)
    epoch1 = [next(it)]
    assert loader.state_dict()["generation"] == 1 and stream.generation == 1
    epoch1 += list(it)
    assert sorted(_idents(epoch1)) == list(range(320))
    # the plan is a function of (generation, seed, epoch): a fresh stream on generation 1 agrees
    other = _stream(root)
    other.set_epoch(1)
    assert _idents(list(other)) == _idents(epoch1)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_across_a_generation_change_is_exact(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "c"
    _toy(root)
    reference = _idents(list(_stream(root)))
    run = make_loader(_stream(root), num_workers=workers)
    it = iter(run)
    taken = [next(it) for _ in range(4)]
    state = run.state_dict()
    assert state["generation"] == 0
    del it, run
    _toy(root, records=120, append=True)
    fresh = _stream(root)
    assert fresh.generation == 1
    resumed = make_loader(fresh, num_workers=workers)
    resumed.load_state_dict(state)  # reads generation 0's shard list although generation 1 exists
    rest = list(resumed)
    assert _idents(taken) + _idents(rest) == reference
    assert sorted(_idents(list(resumed))) == list(range(320))  # the epoch after: the newest generation


def test_plain_dataloader_picks_up_a_generation_at_set_epoch(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root)
    stream = _stream(root)
    loader = DataLoader(stream, batch_size=None, num_workers=2, persistent_workers=True)
    stream.set_epoch(0)
    assert sorted(_idents([b for b in loader])) == list(range(200))
    _toy(root, records=120, append=True)
    stream.set_epoch(1)
    it = iter(loader)
    batches = [next(it)]
    assert loader_state(loader)["generation"] == 1
    assert sorted(_idents(batches + [b for b in it])) == list(range(320))  # (list() would ask torch for a stale len)


_READER = """
import json, sys, time
from pathlib import Path
from loaders import ShardStream
root, ready, go, out = map(Path, sys.argv[1:5])
stream = ShardStream(root, view="records", batch_size=32, seed=1)
it = iter(stream)
batches = [next(it)]
state = stream.state_dict()
ready.write_text(json.dumps(state))
if go.name == "-":
    sys.exit(0)  # only the state: this process (and its lease) ends here
while not go.exists():
    time.sleep(0.02)
batches += list(it)
ids = [int(v) for b in batches for v in b["ident"][~b["is_pad"]].tolist()]
out.write_text(json.dumps({"generation": stream.generation, "ids": ids}))
"""


def _reader(tmp_path: Path, root: Path, go: str = "go") -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    ready = tmp_path / "ready.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(ready), str(tmp_path / go), str(tmp_path / "out.json")], env=env)
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the reader did not start"
    return proc, ready


def test_keep_never_deletes_a_generation_a_reader_holds(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    root = tmp_path / "c"
    cli("build", "--config", str(recipe), "--out", str(root), "-q")
    gen0 = set(shard_files(root))
    proc, _ = _reader(tmp_path, root)  # another process, in the middle of an epoch on generation 0
    try:
        cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100", "--keep", "1")
        gen1 = set(shard_files(root)) - gen0
        out = cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100", "--keep", "1").stdout
        assert "generations 2" in out
        files = set(shard_files(root))
        assert gen0 <= files, "--keep deleted shards of a generation a reader holds"
        assert not gen1 & files, "generation 1 (no reader) was kept"
        assert "kept for readers: 0" in cli("prune", str(root)).stdout
    finally:
        (tmp_path / "go").write_text("")
        assert proc.wait(timeout=120) == 0
    done = json.loads((tmp_path / "out.json").read_text())
    assert done["generation"] == 0 and sorted(done["ids"]) == list(range(200))
    cli("prune", str(root))  # the reader is gone: generation 0 goes now
    assert not gen0 & set(shard_files(root))
    assert sorted(p.name for p in (root / "generations").glob("*.json")) == ["gen-00002.json"]


def test_a_state_of_a_pruned_generation_is_a_clear_error(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    root = tmp_path / "c"
    cli("build", "--config", str(recipe), "--out", str(root), "-q")
    proc, ready = _reader(tmp_path, root, go="-")
    assert proc.wait(timeout=60) == 0
    state = json.loads(ready.read_text())
    cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100", "--keep", "1")
    stream = _stream(root)
    with pytest.raises(ManifestError, match="generation 0 of the cache .* is not on disk any more"):
        stream.load_state_dict(state)
    assert stream.generation == 1 and sorted(_idents(list(stream))) == list(range(200, 300))


_BUILDER = """
for i in $(seq {rounds}); do
  "{python}" -m cachebuild.cli build --config "{recipe}" --out "{root}" -q --append --records 60 --keep 2 || exit 1
  sleep 0.3
done
"""


def test_a_loader_reads_while_a_builder_appends(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    root = tmp_path / "c"
    cli("build", "--config", str(recipe), "--out", str(root), "-q")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    script = _BUILDER.format(rounds=5, python=sys.executable, recipe=recipe, root=root)
    builder = subprocess.Popen(["bash", "-c", script], env=env)
    stream = _stream(root)
    loader = make_loader(stream, num_workers=2)
    seen: list[int] = []
    try:
        finished = None
        while finished is None or len(seen) < 2 or seen[-1] != 5:
            if finished is None and builder.poll() is not None:
                finished = builder.returncode
            it = iter(loader)
            batches = [next(it)]
            generation = loader.state_dict()["generation"]
            manifest = stream.manifest  # the epoch's generation (its lease is held while it runs)
            batches += list(it)
            first = manifest.build.get("first_record", 0)
            assert sorted(_idents(batches)) == list(range(first, first + manifest.records)), f"epoch on generation {generation} is not that generation, once"
            assert not seen or generation >= seen[-1]
            seen.append(generation)
            if finished is not None and seen[-1] != 5:
                raise AssertionError(f"after the builder ended the loader still reads generation {seen[-1]}")
    finally:
        builder.wait(timeout=200)
    assert finished == 0
    assert len(set(seen)) >= 3, f"the loader saw generations {sorted(set(seen))} only"
    assert np.all(np.diff(seen) >= 0)


@pytest.mark.dist
def test_ddp_ranks_agree_on_the_generation_of_each_epoch(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from grow_fixtures import ddp_grow_rank
    from loader_fixtures import free_port

    root = tmp_path / "c"
    _toy(root, records=120)
    mp.spawn(ddp_grow_rank, args=(2, free_port(), str(root), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert "error" not in r, r.get("error")
    for e in range(3):
        gens = {r["epochs"][e]["generation"] for r in ranks}
        assert len(gens) == 1, f"epoch {e}: ranks read generations {gens}"
        total = 120 if gens == {0} else 160
        assert sorted(ranks[0]["epochs"][e]["ids"] + ranks[1]["epochs"][e]["ids"]) == list(range(total))
    assert ranks[0]["epochs"][0]["generation"] == 0 and ranks[0]["epochs"][2]["generation"] == 1


def test_a_mixture_holds_the_generation_it_reads_of_each_cache(tmp_path: Path) -> None:
    """A mixture reads each cache at the generation it had when opened; ``--keep`` must leave those shards
    alone while the stream lives (before, it held no lease: a DataLoader whose workers reopen the shards
    each epoch failed with 'shard ... is missing' after an append with ``--keep 1``)."""
    from loaders import Mixture

    a, b = tmp_path / "a", tmp_path / "b"
    _toy(a)
    _toy(b, records=100)
    stream = ShardStream(Mixture({"a": str(a), "b": str(b)}), view="records", batch_size=BATCH, seed=1)

    def epoch(s: ShardStream) -> list[int]:
        return sorted(int(v) for x in DataLoader(s, batch_size=None, num_workers=2) for v in x["record_id"][~x["is_pad"]].tolist())

    first = epoch(stream)
    assert first == list(range(300))
    gen0 = set(shard_files(a))
    _toy(a, records=100, append=True, keep=1)
    assert gen0 <= set(shard_files(a)), "--keep deleted shards a running mixture reads"
    assert epoch(stream) == first  # still generation 0 of 'a': a mixture does not switch generations
    del stream
    cli("prune", str(a))  # the stream is gone: its lease with it
    assert not gen0 & set(shard_files(a))
