"""Standard JSON only (cachebuild.format.json_text): a NaN or infinite number in a record's JSON field
or in a recipe value is refused by the writer, naming the field and record (or the key), and readers
refuse ``NaN``/``Infinity`` text as not valid JSON. It used to be written as bare ``NaN`` text, which
Python reads and strict JSON readers (jq, JavaScript, serde) refuse."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cachebuild import FunctionSource, build
from cachebuild.cli import main
from cachebuild.errors import ConfigError, ManifestError, ShardCorruptError, SourceError
from cachebuild.format.limits import load_json_bounded
from loaders import ShardStream


def _meta(rng: np.random.Generator, index: int, bad: str = "nan") -> dict:
    value = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}[bad] if index == 3 else 0.5
    return {"x": rng.standard_normal(2).astype(np.float32), "meta": {"n": index, "stats": [1.0, value]}}


def _ok(rng: np.random.Generator, index: int, scale: float = 1.0) -> dict:
    return {"x": np.full(2, scale, np.float32), "meta": {"n": index}}


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_nonfinite_number_in_a_json_field_is_refused_naming_field_and_record(tmp_path: Path, bad: str) -> None:
    source = FunctionSource.per_record(_meta, {"x": "float32", "meta": "json"}, params={"bad": bad})
    with pytest.raises(SourceError) as err:
        build(source, tmp_path / "c", records=10, workers=1, progress=False)
    msg = str(err.value)
    assert "field 'meta'" in msg and "record 0000000003" in msg and "stats[1]" in msg and "not a JSON number" in msg, msg
    assert "\n" not in msg
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_a_nonfinite_recipe_value_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    source = FunctionSource.per_record(_ok, {"x": "float32", "meta": "json"}, params={"scale": float("nan")})
    with pytest.raises(ConfigError, match=r"config key 'params.scale' is nan"):
        build(source, tmp_path / "c", records=10, workers=1, progress=False)
    assert not list((tmp_path / "c").glob("shard-*"))


def test_readers_refuse_nan_text_in_a_manifest(tmp_path: Path) -> None:
    """A cache whose manifest holds ``NaN`` (as an older cachebuild wrote a NaN param) is refused,
    by the CLI (exit 3) and the loader, naming the file and the constant."""
    root = tmp_path / "c"
    build(FunctionSource.per_record(_ok, {"x": "float32", "meta": "json"}, params={"scale": 2.0}), root, records=10, workers=1, progress=False)
    text = (root / "manifest.json").read_text()
    assert '"scale": 2.0' in text
    (root / "manifest.json").write_text(text.replace('"scale": 2.0', '"scale": NaN'))
    res = CliRunner().invoke(main, ["inspect", str(root)])
    assert res.exit_code == 3 and "NaN is not a JSON number" in res.output, res.output
    with pytest.raises(ManifestError, match="NaN is not a JSON number"):
        ShardStream(root, view="records", batch_size=4)


@pytest.mark.parametrize("text", [b'{"v": NaN}', b"[1, Infinity]", b'{"a": [-Infinity]}'])
def test_the_bounded_json_reader_refuses_nonstandard_constants(text: bytes) -> None:
    with pytest.raises(ShardCorruptError, match="not valid JSON"):
        load_json_bounded(text, "shard-00000.tar, record 0000000003, field 'meta'", ShardCorruptError)
    assert load_json_bounded(b'{"v": null, "w": 1e308}', "x") == {"v": None, "w": 1e308}


def test_finite_json_still_round_trips(tmp_path: Path) -> None:
    from cachebuild.format import open_cache, read_record

    root = tmp_path / "c"
    build(FunctionSource.per_record(_ok, {"x": "float32", "meta": "json"}), root, records=10, workers=1, progress=False)
    assert read_record(open_cache(root), 7)["meta"] == {"n": 7}
    assert json.loads((root / "manifest.json").read_text())["records"] == 10


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def test_the_writers_json_encoder_is_json_dumps() -> None:
    """The writer's per-batch encoder (``compact_encoder``) gives json.dumps's text for float32-exact
    doubles of every magnitude (the causal means/stds), odd strings and keys, and the same errors."""
    from cachebuild.format.json_text import compact_encoder

    encode = compact_encoder()
    rng = np.random.default_rng(0)
    f32 = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    doubles = rng.standard_normal(50_000) * 10.0 ** rng.integers(-300, 300, 50_000)
    values = [{"mean": f32[np.isfinite(f32)].astype(np.float64).tolist()}, [doubles.tolist(), {"x": 1}]]
    values += ['é\n\x00"\\', "", None, True, 0, 2**80, -0.0, 5e-324, 1.7976931348623157e308, [], {}, {2: "a", 1: "b"}, {"b": 1, "0": None}]
    for value in values:
        assert encode(value) == _dumps(value)
    for bad in [float("nan"), {"a": [float("-inf")]}, {1: 2, "a": 3}, {2: "a", "0": None}, {"s": {1, 2}}, object()]:
        with pytest.raises((TypeError, ValueError)) as want:
            _dumps(bad)
        with pytest.raises(want.type, match=re.escape(str(want.value))):
            compact_encoder()(bad)
