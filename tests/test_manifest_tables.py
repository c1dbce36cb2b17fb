"""A manifest whose tables are missing or of the wrong type is one line naming the key.

The review of 2026-11-24 (thirteenth session) edited a real cache's ``manifest.json`` as a
careless tool or a stranger would: ``"fields": null``, a field schema that is ``null``, a
shard entry that is ``null`` or lacks a key, ``"records": "2000"``. Each used to surface as
``malformed (AttributeError: 'NoneType' object has no attribute 'items')`` (or a
``TypeError`` about ``ShardEntry.__init__``), or as ``records = '2000' but its shards hold
2000 records``: none named the key at fault. Now ``cachebuild verify`` (a real process)
exits 3 with one line naming file, key and value, and the loader raises the same
:class:`ManifestError`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import build_toy
from cachebuild.errors import ManifestError
from cachebuild.format.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]


def _drop(key):
    return lambda doc: doc.pop(key)


def _set(path, value):
    def edit(doc):
        *parents, last = path
        for p in parents:
            doc = doc[p]
        doc[last] = value

    return edit


def _first_field(doc):
    return next(iter(doc["fields"]))


CASES = {
    "fields null": (_set(["fields"], None), ["fields = None", "not a table"]),
    "fields a list": (_set(["fields"], []), ["fields = []", "not a table"]),
    "shards a table": (_set(["shards"], {}), ["shards = {}", "not a list"]),
    "field schema null": (lambda d: d["fields"].__setitem__(_first_field(d), None), ["fields.", "= None", "not a table"]),
    "field without dtype": (lambda d: d["fields"][_first_field(d)].pop("dtype"), ["fields.", "has no 'dtype'"]),
    "max_shape a number": (lambda d: d["fields"][_first_field(d)].__setitem__("max_shape", 5), ["fields.", ".max_shape = 5", "not a list"]),
    "shard entry null": (_set(["shards", 1], None), ["shards[1] = None", "not a table"]),
    "shard without sha256": (lambda d: d["shards"][1].pop("sha256"), ["shards[1] has no 'sha256'"]),
    "shard with an unknown key": (lambda d: d["shards"][0].__setitem__("colour", "red"), ["shards[0]", "'colour'"]),
    "no kind": (_drop("kind"), ["no 'kind'"]),
    "no seed": (_drop("seed"), ["no 'seed'"]),
    "kind a number": (_set(["kind"], 5), ["kind = 5", "not a string"]),
    "config a list": (_set(["config"], [1]), ["config = [1]", "not a table"]),
    "records a string": (lambda d: d.__setitem__("records", str(d["records"])), ["records = '", "not a whole number"]),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tables") / "cache"
    build_toy(out, records=600)
    return out


def _edited(good: Path, tmp_path: Path, edit) -> Path:
    cache = tmp_path / "cache"
    shutil.copytree(good, cache)
    path = cache / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return cache


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_names_the_key(good, tmp_path, case):
    edit, expected = CASES[case]
    cache = _edited(good, tmp_path, edit)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "cachebuild", "verify", "-q", str(cache)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{cache}/manifest.json" in lines[0], lines[0]
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert "malformed" not in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("case", ["fields null", "shard entry null", "records a string"])
def test_the_reader_raises_the_same_line(good, tmp_path, case):
    edit, expected = CASES[case]
    cache = _edited(good, tmp_path, edit)
    with pytest.raises(ManifestError) as info:
        read_manifest(cache)
    for part in expected:
        assert part in str(info.value)


def test_a_good_manifest_still_reads(good):
    assert read_manifest(good).records == 600
