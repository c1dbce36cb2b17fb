"""The open builder: public API, `cachebuild build` with a user's module, one recipe path, bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cachebuild
from bounded_run import tails
from cachebuild.cli import main

REPO = Path(__file__).resolve().parent.parent

USER_CODE = """
import numpy as np
from cachebuild import FunctionSource

def seq(rng, index, length=8):
    return {"x": rng.standard_normal(length).astype(np.float32), "y": np.array(index, dtype=np.int64)}

def make(length=8):
    return FunctionSource.per_record(seq, {"x": "float32", "y": "int64"}, params={"length": length})

def _wrong_dtype(rng, index):
    return {"x": np.zeros(4), "y": np.array(index, dtype=np.int64)}

def _wrong_field(rng, index):
    return {"z": np.zeros(4, np.float32), "y": np.array(index, dtype=np.int64)}

def _raises(rng, index, at=0):
    if index >= at:
        raise ValueError(f"no data for {index}")
    return {"x": np.zeros(4, np.float32), "y": np.array(index, dtype=np.int64)}

FIELDS = {"x": "float32", "y": "int64"}
wrong_dtype = FunctionSource.per_record(_wrong_dtype, FIELDS)
wrong_field = FunctionSource.per_record(_wrong_field, FIELDS)
raises = FunctionSource.per_record(_raises, FIELDS)
raises_late = FunctionSource.per_record(_raises, FIELDS, params={"at": 300})
"""


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The real command line, in a folder outside the package (PYTHONPATH: the package only)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cachebuild.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture()
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "mydata.py").write_text(USER_CODE)
    (tmp_path / "recipe.toml").write_text('kind = "mydata:make"\nseed = 1\nrecords = 600\n[params]\nlength = 8\n[build]\nshard_mb = 0.01\n')
    return tmp_path


def test_public_api_is_exported_and_sorted() -> None:
    assert cachebuild.__all__ == sorted(cachebuild.__all__)
    for name in cachebuild.__all__:
        assert getattr(cachebuild, name) is not None
    assert callable(cachebuild.build) and callable(cachebuild.block_rng)


def test_shipped_sources_type_check_against_the_protocol() -> None:
    """mypy: our sources (frozen dataclasses) satisfy RecordSource (read-only kind, block_records).

    With the settings of ``make types`` (pyproject.toml, run from the root; imported modules checked
    as there): its cache (.mypy_cache), written by ``make types`` before the tests in CI, then serves
    every module but this file (under a second instead of ~25 s of checking torch, numpy and ours again)."""
    mypy = shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e .[dev])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [mypy, "--no-error-summary", "tests/typing/sources_conform.py"]
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_build_command_with_a_user_module_builds_verifies_and_streams(user_folder: Path) -> None:
    res = _cli(["build", "--config", "recipe.toml", "--set", "params.length=20", "--out", "cache", "-q", "-j", "2"], user_folder)
    assert res.returncode == 0, res.stderr
    assert "600 records" in res.stdout
    res = _cli(["verify", "cache", "-q"], user_folder)
    assert res.returncode == 0 and "600 records decoded" in res.stdout, res.stderr
    again = _cli(["build", "--config", "recipe.toml", "--set", "params.length=20", "--out", "cache", "-q"], user_folder)
    assert again.returncode == 0 and "already complete" in again.stdout, tails(again)

    from loaders import ShardStream

    stream = ShardStream(user_folder / "cache", view="records", batch_size=64, shuffle=False)
    ids = []
    for batch in stream:
        assert tuple(batch["x"].shape)[1:] == (20,) and str(batch["x"].dtype).endswith("float32")
        keep = ~np.asarray(batch["is_pad"])
        ids.append(np.asarray(batch["y"])[keep])
        np.testing.assert_array_equal(np.asarray(batch["y"]), np.asarray(batch["record_id"]))
    assert sorted(np.concatenate(ids).tolist()) == list(range(600))


def test_generate_and_mel_are_short_forms_of_build(tmp_path: Path) -> None:
    """The same recipe through `generate`/`mel` and through `build` gives the same cache."""
    runner = CliRunner()
    causal = str(REPO / "configs" / "causal-users-2026-01-15.toml")
    a = runner.invoke(main, ["generate", "-c", causal, "--graphs", "300", "-o", str(tmp_path / "g"), "-q", "-j", "1"])
    b = runner.invoke(main, ["build", "-c", causal, "--records", "300", "-o", str(tmp_path / "b"), "-q", "-j", "1"])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert (tmp_path / "g" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    mel = str(REPO / "configs" / "mel-leak.toml")
    a = runner.invoke(main, ["mel", "-c", mel, "--synthetic", "12", "--set", "num_long=4", "-o", str(tmp_path / "m1"), "-q", "-j", "1"])
    b = runner.invoke(main, ["build", "-c", mel, "--set", "source.synthetic=12", "--set", "num_long=4", "-o", str(tmp_path / "m2"), "-q", "-j", "1"])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert (tmp_path / "m1" / "manifest.json").read_bytes() == (tmp_path / "m2" / "manifest.json").read_bytes()


def test_fingerprint_records_the_block_size_the_bytes_depend_on(tmp_path: Path) -> None:
    from cachebuild.builder.causal_source import CAUSAL_BLOCK
    from cachebuild.format.manifest import read_manifest

    res = CliRunner().invoke(main, ["build", "-c", str(REPO / "configs" / "causal-users-2026-01-15.toml"), "--records", "40", "-o", str(tmp_path / "c"), "-q", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "c").build["block_records"] == CAUSAL_BLOCK


BAD = [
    ("nosuchkind", 2, ["'nosuchkind'", "module:attribute"]),
    ("not_a_module_xyz:make", 2, ["'not_a_module_xyz'", "cannot import"]),
    ("mydata:nothing_here", 2, ["has no attribute 'nothing_here'"]),
    ("mydata:wrong_dtype", 6, ["source 'mydata:_wrong_dtype'", "shard 0", "record 0", "field 'x'", "float32", "float64"]),
    ("mydata:wrong_field", 6, ["source 'mydata:_wrong_field'", "shard 0", "record 0", "field 'x': missing"]),
    ("mydata:raises", 6, ["source 'mydata:_raises'", "shard 0", "record 0", "ValueError: no data for 0"]),
]


@pytest.mark.parametrize("kind,code,words", BAD, ids=[b[0] for b in BAD])
def test_bad_source_is_one_line_and_the_existing_cache_stays(user_folder: Path, kind: str, code: int, words: list[str]) -> None:
    good = _cli(["build", "--config", "recipe.toml", "--out", "cache", "-q", "-j", "1"], user_folder)
    assert good.returncode == 0, good.stderr
    before = {p.name: p.read_bytes() for p in (user_folder / "cache").iterdir()}
    (user_folder / "bad.toml").write_text(f'kind = "{kind}"\nrecords = 600\n[build]\nshard_mb = 0.01\n')
    res = _cli(["build", "--config", "bad.toml", "--out", "cache", "--overwrite", "-q", "-j", "1"], user_folder)
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert {p.name: p.read_bytes() for p in (user_folder / "cache").iterdir()} == before
    verified = _cli(["verify", "cache", "-q"], user_folder)
    assert verified.returncode == 0, tails(verified)


def test_a_source_failing_late_names_its_record(user_folder: Path) -> None:
    import re

    (user_folder / "late.toml").write_text('kind = "mydata:raises_late"\nrecords = 600\n[build]\nshard_mb = 0.01\n')
    for workers, out in (("1", "one"), ("2", "two")):
        res = _cli(["build", "--config", "late.toml", "--out", out, "-q", "-j", workers], user_folder)
        assert res.returncode == 6, tails(res)
        line = res.stderr.strip()
        assert "\n" not in line and line.startswith("error: source 'mydata:_raises' shard "), line
        shard, record = map(int, re.search(r"shard (\d+) record (\d+) raised ValueError: no data for (\d+)", line).groups()[:2])
        assert record == 300 if workers == "1" else record >= 300  # with 2 workers, whichever failing shard ends first
        assert not (user_folder / out / "manifest.json").exists()


def test_build_api_takes_a_source_or_a_recipe(tmp_path: Path) -> None:
    from cachebuild import FunctionSource, build
    from cachebuild.errors import ConfigError

    def one(rng: np.random.Generator, index: int) -> dict:
        return {"v": rng.integers(0, 9, size=3).astype(np.uint8)}

    src = FunctionSource.per_record(one, {"v": "uint8"}, kind="tiny")
    s = build(src, tmp_path / "a", records=100, workers=1, progress=False)
    assert (s.records, s.built) == (100, s.shards)
    with pytest.raises(ConfigError, match="records=N"):
        build(src, tmp_path / "b")
    r = build({"kind": "causal", "graphs": 30, "graph": {"n_max": 6}}, tmp_path / "c", workers=1, progress=False)
    assert r.records == 30
    with pytest.raises(ConfigError, match="unknown-kind"):
        build({"kind": "unknown-kind"}, tmp_path / "d")


def test_kinds_from_an_entry_point_and_from_register_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package that declares a `cachebuild.sources` entry point (a real dist-info on sys.path)."""
    from cachebuild.sources import KINDS, SourceKind, register_kind, resolve_kind

    (tmp_path / "ep_data.py").write_text(USER_CODE)
    dist = tmp_path / "ep_data-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-data\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cachebuild.sources]\nep-seq = ep_data:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cachebuild.build({"kind": "ep-seq", "records": 50, "params": {"length": 3}}, tmp_path / "c", workers=1, progress=False)
    assert r.records == 50
    kind = SourceKind("mine", lambda recipe: (cachebuild.FunctionSource.per_record(_one_byte, {"b": "uint8"}), 7))
    register_kind(kind)
    try:
        assert resolve_kind("mine") is kind
        with pytest.raises(ValueError, match="already registered"):
            register_kind(kind)
        assert cachebuild.build({"kind": "mine"}, tmp_path / "m", workers=1, progress=False).records == 7
    finally:
        KINDS.pop("mine")


def _one_byte(rng: np.random.Generator, index: int) -> dict:
    return {"b": np.array(index % 256, dtype=np.uint8)}


def _short_block(rng: np.random.Generator, start: int, stop: int) -> dict:
    return {"x": np.zeros((stop - start - 1, 2), np.float32)}


def _wrong_block_dtype(rng: np.random.Generator, start: int, stop: int) -> dict:
    return {"x": np.zeros((stop - start, 2), np.float16)}


@pytest.mark.parametrize("fn,words", [(_short_block, ["record 0 field 'x'", "needs 8 rows, got 7"]), (_wrong_block_dtype, ["record 0 field 'x'", "expected dtype float32, got float16"])])
def test_block_function_errors_name_the_field(tmp_path: Path, fn, words: list[str]) -> None:
    from cachebuild import FunctionSource, build
    from cachebuild.errors import SourceError

    src = FunctionSource.per_block(fn, {"x": "float32"}, block_records=8, record_bytes=8)
    with pytest.raises(SourceError) as err:
        build(src, tmp_path / "c", records=20, workers=1, progress=False)
    msg = str(err.value)
    assert msg.startswith(f"source '{src.kind}' shard 0 ") and "\n" not in msg
    for word in words:
        assert word in msg, msg


def _ragged_block(rng: np.random.Generator, start: int, stop: int) -> dict:
    """Ragged float32 clips of 9,000-11,000 samples (~40 KB each), given as a list, and JSON metadata."""
    n = stop - start
    return {
        "audio": [np.full(int(k), i, np.float32) for i, k in zip(range(start, stop), rng.integers(9_000, 11_001, n))],
        "meta": [{"file": f"clip-{i:06d}.wav", "tags": ["x"] * 20} for i in range(start, stop)],
    }


def _ragged_record(rng: np.random.Generator, index: int) -> dict:
    return {"audio": list(range(10_000)), "meta": {"file": f"clip-{index:06d}.wav", "tags": ["x"] * 20}}


def test_a_ragged_source_is_sized_by_its_records_bytes_not_its_lists_lengths(tmp_path: Path) -> None:
    """The size estimate that cuts shards (``shard_mb``) and members (16 MB) counts a ragged
    column's arrays and a JSON column's text: it took a list of per-record values for 64 bytes,
    so a cache of 40 KB clips got shards ~600x past ``shard_mb``."""
    import json

    from cachebuild import FunctionSource, build

    block_src = FunctionSource.per_block(_ragged_block, {"audio": "float32", "meta": "json"})
    meta_bytes = len(json.dumps(_ragged_block(np.random.default_rng(0), 0, 1)["meta"][0], separators=(",", ":")))
    assert 9_000 * 4 + meta_bytes <= block_src.estimated_record_bytes() <= 11_000 * 4 + meta_bytes
    record_src = FunctionSource.per_record(_ragged_record, {"audio": "int64", "meta": "json"})
    assert record_src.estimated_record_bytes() == 10_000 * 8 + meta_bytes
    build(block_src, tmp_path / "c", records=300, shard_mb=0.5, progress=False, workers=1)
    doc = json.loads((tmp_path / "c" / "manifest.json").read_text())
    per_shard = [s["records"] for s in doc["shards"]]
    assert len(per_shard) >= 20 and max(per_shard) <= 15, per_shard  # about 0.5 MB of 40 KB records: 12 or 13
