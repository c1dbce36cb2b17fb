"""Growing a cache: ``--append`` adds a generation (same recipe, fresh determined seeds, atomic commit,
resumable), ``--keep N`` and ``cachebuild prune`` bound the disk; every bad input is one error, nothing changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cachebuild import build
from cachebuild.errors import CacheMismatchError, ConfigError, ManifestError
from cachebuild.format.generations import generation_of, generation_seed, read_generation, snapshot_path
from cachebuild.format.manifest import Manifest, read_manifest
from cachebuild.testing import ToySource
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet
from cachebuild.format.records import read_record
from cachebuild.tools.verify import verify_cache
from bounded_run import tails
from grow_fixtures import cli, folder_bytes, shard_files, toy_recipe

TOY = ToySource(n_min=4, n_max=4)


def _toy(out: Path, records: int = 200, **kw) -> object:
    return build(TOY, out, records=records, seed=5, shard_mb=0.02, progress=False, workers=1, **kw)


def _idents(root: Path) -> list[int]:
    m = read_manifest(root)
    with ShardSet(m, root) as shards:
        return [int(v) for v in read_block(shards, np.arange(m.records), ["ident"])["ident"].dense().reshape(-1)]


def test_append_to_an_unpacked_cache_is_version_2(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root, pack=1)
    _toy(root, records=120, append=True)  # (default pack: the cache's own, 1, is kept)
    m = read_manifest(root)
    assert generation_of(m) == 1 and m.version == 2 and {s.pack for s in m.shards} == {1}
    assert _idents(root) == list(range(320)) and verify_cache(root).ok


def test_append_keeps_the_cache_pack_and_refuses_another(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root, pack=8)
    before = folder_bytes(root)
    with pytest.raises(ConfigError, match=r"build\.pack = 3: .* packs 8 records per tar member"):
        _toy(root, records=50, append=True, pack=3)
    assert folder_bytes(root) == before  # nothing written
    _toy(root, records=50, append=True, pack=8)  # the cache's own value, given again, is fine
    assert {s.pack for s in read_manifest(root).shards} == {8}


def test_append_refuses_an_explicit_default_pack_too(tmp_path: Path) -> None:
    """Asking for 256 (the default's value) is still asking: refused on a pack-1 cache, API and command line."""
    root = tmp_path / "c"
    _toy(root, pack=1)
    before = folder_bytes(root)
    with pytest.raises(ConfigError, match=r"build\.pack = 256: .* packs 1 record per tar member"):
        _toy(root, records=50, append=True, pack=256)
    recipe = toy_recipe(tmp_path)
    refused = cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "50", "--set", "build.pack=256", check=False)
    assert refused.returncode == 2 and "build.pack = 256" in refused.stderr and "Traceback" not in refused.stderr, tails(refused)
    assert folder_bytes(root) == before


def test_append_adds_a_generation_and_touches_nothing_there(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root)
    before = shard_files(root)
    old_manifest = (root / "manifest.json").read_bytes()
    s = _toy(root, records=120, append=True)
    assert s.generation == 1 and s.records == 120 and s.built == s.shards
    after = shard_files(root)
    assert {k: after[k] for k in before} == before, "an append changed an existing shard"
    m = read_manifest(root)
    assert generation_of(m) == 1 and m.records == 320 and m.version == 4  # (4: its shards pack records and share frames of small entries; 2 for pack=1)
    assert _idents(root) == list(range(320))  # record ids continue the cache's
    assert snapshot_path(root, 0).read_bytes() == old_manifest  # generation 0 as it was committed
    assert read_generation(root, 0).records == 200 and read_generation(root, 1).records == 320
    assert [g["generation"] for g in m.build["generations"]] == [0, 1]
    assert m.build["generations"][1]["seed"] == generation_seed(5, 1) != 5
    report = verify_cache(root)
    assert report.ok and report.records == 320
    # fresh data: the new records are not copies of old ones
    with ShardSet(m, root) as shards:
        first, last = read_record(shards, 0), read_record(shards, int(m.shard_starts()[-2]))
    assert not np.array_equal(first["vec"], last["vec"])


def test_two_appends_on_two_copies_give_identical_new_shards(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _toy(one)
    shutil.copytree(one, two)
    old = set(shard_files(one))
    for root in (one, two):
        _toy(root, records=150, append=True)
        _toy(root, records=90, append=True)
    new_one = {k: v for k, v in shard_files(one).items() if k not in old}
    assert new_one and new_one == {k: v for k, v in shard_files(two).items() if k not in old}
    m1, m2 = (json.loads((r / "manifest.json").read_bytes()) for r in (one, two))
    assert m1["shards"] == m2["shards"] and m1["build"]["generations"] == m2["build"]["generations"]


def test_cli_append_and_keep(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    root = tmp_path / "c"
    cli("build", "--config", str(recipe), "--out", str(root), "-q")
    gen0 = set(shard_files(root))
    out = cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100").stdout
    assert "appended generation 1" in out and "generations 0..1" in out
    out = cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100", "--keep", "2").stdout
    assert "appended generation 2" in out and "generations 1..2" in out
    m = read_manifest(root)
    assert generation_of(m) == 2 and m.records == 200 and m.build["first_record"] == 200
    assert not gen0 & set(shard_files(root)), "generation 0's shards outlived --keep 2 with no reader"
    assert not snapshot_path(root, 0).exists() and snapshot_path(root, 2).exists()
    assert verify_cache(root).ok
    assert "generation 2" in cli("verify", "-q", str(root)).stdout
    text = cli("inspect", str(root)).stdout
    assert "generation 2 (lists generations 1 (100), 2 (100); record ids from 200)" in text
    # disk stays bounded while appends go on
    sizes = []
    for _ in range(3):
        cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "100", "--keep", "2")
        sizes.append(sum(p.stat().st_size for p in root.glob("shard-*")))
    assert max(sizes) - min(sizes) < 0.1 * max(sizes)
    assert read_manifest(root).records == 200 and generation_of(read_manifest(root)) == 5


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--seed", "6"], 4, "seed: cache 5, this build 6"),
        (["--set", "params.n_max=5"], 4, "config.n_max: cache 4, this build 5"),
        (["--keep", "0"], 2, "'keep' has invalid value 0"),
        (["--keep", "-2"], 2, "'keep' has invalid value -2"),
        (["--set", "build.pack=3"], 2, "build.pack = 3: the cache at"),  # never silently ignored
    ],
)
def test_bad_appends_are_one_error_and_change_nothing(tmp_path: Path, args: list[str], code: int, words: str) -> None:
    recipe = toy_recipe(tmp_path)
    root = tmp_path / "c"
    cli("build", "--config", str(recipe), "--out", str(root), "-q")
    before = folder_bytes(root)
    proc = cli("build", "--config", str(recipe), "--out", str(root), "-q", "--append", "--records", "50", *args, check=False)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and words in proc.stderr, proc.stderr
    assert folder_bytes(root) == before


def test_append_where_there_is_no_cache(tmp_path: Path) -> None:
    recipe = toy_recipe(tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for target, words in ((tmp_path / "missing", "does not exist"), (foreign, "is not a cachebuild cache")):
        proc = cli("build", "--config", str(recipe), "--out", str(target), "-q", "--append", check=False)
        assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "missing").exists()
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    proc = cli("build", "--config", str(recipe), "--out", str(tmp_path / "x"), "-q", "--keep", "2", check=False)
    assert proc.returncode == 2 and "add --append" in proc.stderr and not (tmp_path / "x").exists(), tails(proc)


def test_append_refuses_another_kind_and_api_errors(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root)
    before = folder_bytes(root)
    with pytest.raises(CacheMismatchError, match="n_max: cache 4, this build 6"):
        build(ToySource(n_min=4, n_max=6), root, records=50, seed=5, shard_mb=0.02, progress=False, append=True)
    with pytest.raises(ConfigError, match="contradict"):
        _toy(root, append=True, overwrite=True)
    with pytest.raises(ConfigError, match="local cache folder"):
        _toy("s3://bucket/prefix", append=True)
    assert folder_bytes(root) == before


class _Flaky:
    """The toy source, failing at one record id (a build that dies half-way)."""

    def __init__(self, fail_at: int):
        self.inner, self.fail_at = TOY, fail_at
        self.kind, self.block_records = TOY.kind, TOY.block_records

    def fields(self):
        return self.inner.fields()

    def config_dict(self):
        return self.inner.config_dict()

    def estimated_record_bytes(self):
        return self.inner.estimated_record_bytes()

    def blocks(self, seed, shard, start, stop):
        if start <= self.fail_at < stop:
            raise RuntimeError("killed")
        yield from self.inner.blocks(seed, shard, start, stop)


def test_an_interrupted_append_resumes_or_is_discarded(tmp_path: Path) -> None:
    clean, resumed, other = tmp_path / "clean", tmp_path / "resumed", tmp_path / "other"
    _toy(clean)
    shutil.copytree(clean, resumed)
    shutil.copytree(clean, other)
    committed = (clean / "manifest.json").read_bytes()
    _toy(clean, records=150, append=True)
    for root in (resumed, other):
        with pytest.raises(Exception, match="killed"):
            build(_Flaky(fail_at=330), root, records=150, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)
        assert (root / "manifest.json").read_bytes() == committed  # nothing committed: readers still see generation 0
        assert (root / "generations" / "append.json").exists() and list(root.glob("shard-*.done.json"))
    again = _toy(resumed, records=150, append=True)  # the same append: finishes what is missing
    assert again.skipped >= 1 and again.built >= 1
    assert shard_files(resumed) == shard_files(clean)
    assert (resumed / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()
    assert not (resumed / "generations" / "append.json").exists()
    # another append discards the unfinished one first; `prune` would too
    _toy(other, records=60, append=True)
    ref = tmp_path / "ref"
    _toy(ref)
    _toy(ref, records=60, append=True)
    assert shard_files(other) == shard_files(ref)


def test_a_sigkilled_append_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from grow_fixtures import REPO

    recipe = toy_recipe(tmp_path)
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    cli("build", "--config", str(recipe), "--out", str(clean), "-q")
    shutil.copytree(clean, killed)
    before = set(killed.glob("*.done.json"))
    committed = (killed / "manifest.json").read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    args = ["build", "--config", str(recipe), "-q", "-j", "1", "--append", "--records", "8000"]
    proc = subprocess.Popen([sys.executable, "-m", "cachebuild.cli", *args, "--out", str(killed)], env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and len(set(killed.glob("*.done.json")) - before) < 2:
        time.sleep(0.01)
    assert proc.poll() is None, f"the append ended before it could be killed (rc {proc.returncode})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (killed / "manifest.json").read_bytes() == committed, "a killed append changed what readers see"
    out = cli(*args, "--out", str(killed)).stdout
    assert "already done" in out and " 0 already done" not in out, out
    cli(*args, "--out", str(clean))
    assert shard_files(killed) == shard_files(clean)
    assert (killed / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()


def test_prune_discards_an_unfinished_append(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root)
    kept = shard_files(root)
    with pytest.raises(Exception, match="killed"):
        build(_Flaky(fail_at=330), root, records=150, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)
    out = cli("prune", str(root)).stdout
    assert "files deleted" in out
    assert shard_files(root) == kept and not (root / "generations" / "append.json").exists()
    assert verify_cache(root).ok


def test_old_caches_read_as_generation_zero(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root, pack=1)  # the layout of format version 1
    m = read_manifest(root)
    assert "generation" not in m.build and m.version == 1 and generation_of(m) == 0
    assert read_generation(root, 0).records == 200
    with pytest.raises(ManifestError, match="generation 3 of the cache"):
        read_generation(root, 3)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("first_record", -1, "build.first_record = -1"),
        ("first_record", 7, "shards[0].first_record = 0"),
        ("generation", "2", "build.generation = '2'"),
    ],
)
def test_hostile_generation_fields_are_refused(tmp_path: Path, key: str, value: object, words: str) -> None:
    root = tmp_path / "c"
    _toy(root)
    doc = json.loads((root / "manifest.json").read_bytes())
    doc["build"][key] = value
    with pytest.raises(ManifestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_json(json.dumps(doc).encode(), str(root))


def test_inspect_of_malformed_generation_bookkeeping_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _toy(root)
    _toy(root, records=50, append=True)
    doc = json.loads((root / "manifest.json").read_bytes())
    doc["build"]["generations"] = [{"generation": "x"}]
    (root / "manifest.json").write_text(json.dumps(doc))
    proc = cli("inspect", str(root))
    assert "generation 1 (build.generations is malformed" in proc.stdout
