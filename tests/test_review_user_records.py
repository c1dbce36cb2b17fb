"""Found in review, as a user of the open builder: a field named like a key the ``records`` view adds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import ConfigError
from loaders import ShardStream

REPO = Path(__file__).resolve().parent.parent


def _clashing(rng: np.random.Generator, index: int) -> dict:
    return {"x": np.zeros(1 + index % 3, np.float32), "x_shape": np.zeros(2, np.int64), "record_id": np.int64(index)}


@pytest.fixture(scope="module")
def clashing_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clash") / "c"
    source = FunctionSource.per_record(_clashing, {"x": "float32", "x_shape": "int64", "record_id": "int64"})
    build(source, root, records=20, workers=1, progress=False)
    return root


def test_a_field_named_like_a_records_view_key_is_refused_naming_it(clashing_cache: Path) -> None:
    with pytest.raises(ConfigError) as err:  # was: IndexError deep in the batch assembly
        ShardStream(clashing_cache, view="records", batch_size=4)
    assert "'record_id'" in str(err.value) and "fields=" in str(err.value)
    with pytest.raises(ConfigError, match="'x_shape'"):
        ShardStream(clashing_cache, view="records", batch_size=4, fields=["x", "x_shape"])


def test_leaving_the_clashing_fields_out_streams_the_rest(clashing_cache: Path) -> None:
    stream = ShardStream(clashing_cache, view="records", batch_size=4, fields=["x"], shuffle=False)
    ids = np.concatenate([b["record_id"].numpy() for b in stream])
    assert sorted(ids.tolist()) == list(range(20))


BAD_SCHEMA_CODE = """
import numpy as np
from cachebuild import FunctionSource

def rec(rng, index):
    return {"a.b": np.zeros(2, np.float32)}

dotted = FunctionSource.per_record(rec, {"a.b": "float32"})
complex_ = FunctionSource.per_record(rec, {"ab": "complex64"})
"""


@pytest.mark.parametrize(
    "kind,words",
    [("dotted", ["field name 'a.b' is not allowed"]), ("complex_", ["field 'ab' dtype = 'complex64' is not an allowed dtype"])],
)
def test_a_schema_no_reader_accepts_is_one_line_before_anything_is_written(tmp_path: Path, kind: str, words: list[str]) -> None:
    (tmp_path / "badschema.py").write_text(BAD_SCHEMA_CODE)
    (tmp_path / "bad.toml").write_text(f'kind = "badschema:{kind}"\nrecords = 10\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "cachebuild.cli", "build", "--config", "bad.toml", "--out", "c", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr  # was: a ValueError traceback from a build worker, exit 1
    assert lines[0].startswith("error: source 'badschema:rec': ") and all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").glob("shard-*"))


GOOD_CODE = """
import numpy as np
from cachebuild import FunctionSource

def rec(rng, index):
    return {"x": rng.standard_normal(4).astype(np.float32)}

source = FunctionSource.per_record(rec, {"x": "float32"})
"""


def test_build_takes_pack_like_generate_and_mel(tmp_path: Path) -> None:
    """README: records per member are ``--pack`` or ``build.pack``; ``build`` had only the latter."""
    import json

    (tmp_path / "goodsrc.py").write_text(GOOD_CODE)
    (tmp_path / "r.toml").write_text('kind = "goodsrc:source"\nrecords = 40\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for pack, version in ((1, 1), (3, 4)):  # (4: a packed zstd cache shares frames of small entries)
        args = ["build", "--config", "r.toml", "--out", f"c{pack}", "--pack", str(pack), "-q", "-j", "1"]
        res = subprocess.run([sys.executable, "-m", "cachebuild.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        manifest = json.loads((tmp_path / f"c{pack}" / "manifest.json").read_text())
        assert manifest["version"] == version and manifest["codec"].get("pack", 1) == pack


def _small(rng: np.random.Generator, index: int) -> dict:
    return {"x": rng.standard_normal(3).astype(np.float32)}


def test_a_packed_cache_s_low_ratio_does_not_advise_pack(tmp_path: Path) -> None:
    """A tiny packed cache stores less than its data (tar framing, indexes); the summary and
    ``inspect`` used to advise ``--pack N`` to a cache that already packs records (4096 per member
    for these 12-byte records)."""
    from cachebuild.tools.inspect import inspect_cache

    source = FunctionSource.per_record(_small, {"x": "float32"})
    lines = build(source, tmp_path / "c", records=40, workers=1, progress=False).lines()
    said = [line for line in lines if "ratio" in line][0]
    assert "tar headers and padding" in said and "--pack" not in said and "one per 40 records and field)" in said, said  # (one shard: its members hold the 40)
    shown = [line for line in inspect_cache(tmp_path / "c", 0) if "ratio" in line][0]
    assert "--pack" not in shown and "one per 40 records and field)" in shown, shown
    lines = build(source, tmp_path / "one", records=40, workers=1, progress=False, pack=1).lines()
    assert "--pack N lets N records share one" in [line for line in lines if "ratio" in line][0]


def test_a_rerun_that_builds_nothing_says_so_rather_than_zero_per_second(tmp_path: Path) -> None:
    source = FunctionSource.per_record(_small, {"x": "float32"})
    build(source, tmp_path / "c", records=40, workers=1, progress=False)
    (tmp_path / "c" / "manifest.json").unlink()  # every shard done, the manifest lost: the rerun only writes it
    last = build(source, tmp_path / "c", records=40, workers=1, progress=False).lines()[-1]
    assert "0 records/s" not in last and "the 0 shards" not in last and "every shard was already built" in last, last
