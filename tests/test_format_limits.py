"""The format's limits as pure functions: names, dtypes, JSON, manifest numbers, zstd frame headers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zstandard

from cachebuild.errors import ManifestError, ShardCorruptError
from cachebuild.format.index_check import frame_content_sizes
from cachebuild.format.limits import MAX_JSON_DEPTH, check_dtype, check_file_name, load_json_bounded
from cachebuild.format.manifest import Manifest
from cachebuild.format.shard_writer import ShardWriter
from cachebuild.format.codec import Codec


@pytest.mark.parametrize("name", ["shard-00000.tar", "shard-00000.idx.npy", "a_b+c-1.tar", "X"])
def test_plain_names_pass(name):
    assert check_file_name(name, "shards[0].name", "m") == name


@pytest.mark.parametrize(
    "name",
    ["../x.tar", "..", ".", "/etc/passwd", "a/b.tar", "a\\b.tar", ".hidden", "", "x\0.tar", "manifest.json", "shard-0.done.json", "build.json", "x" * 201, "é.tar", " x.tar", 7, None],
)
def test_other_names_are_refused_naming_field_and_value(name):
    with pytest.raises(ManifestError, match=r"m: shards\[3\]\.index = .* is not a plain file name"):
        check_file_name(name, "shards[3].index", "m")


@pytest.mark.parametrize("dtype", ["float32", "<f4", "|u1", "int64", "bool", "float16", "<u8", "json"])
def test_numeric_dtypes_pass(dtype):
    assert check_dtype(dtype, "fields.x.dtype", "m") == dtype


@pytest.mark.parametrize("dtype", ["|O", "O", "object", ">f4", "<c8", "S10", "<U4", "V8", "[('a','<f4')]", "<M8[s]", "float128", "", 3, None, "x" * 40])
def test_other_dtypes_are_refused(dtype):
    with pytest.raises(ManifestError, match=r"fields\.x\.dtype = .* is not an allowed dtype"):
        check_dtype(dtype, "fields.x.dtype", "m")


def test_writer_refuses_what_readers_refuse(tmp_path):
    for fields in ([("a.b", "float32")], [("x", ">f4")], [("x", "object")]):
        with pytest.raises(ValueError):
            ShardWriter(tmp_path, "shard-00000.tar", fields, Codec(), 0)


def test_json_limits():
    assert load_json_bounded(json.dumps({"a": [[1, 2], {"b": "[[[["}]}).encode(), "w") == {"a": [[1, 2], {"b": "[[[["}]}
    deep_ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert load_json_bounded(deep_ok, "w") is not None
    with pytest.raises(ShardCorruptError, match=f"w: JSON nested {MAX_JSON_DEPTH + 1} levels deep"):
        load_json_bounded(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "w", ShardCorruptError)
    assert load_json_bounded(json.dumps(["[" * 500]).encode(), "w") == ["[" * 500]  # brackets inside strings do not nest
    with pytest.raises(ManifestError, match="exceeds the limit of 10 bytes"):
        load_json_bounded(b"[1, 2, 3, 4, 5]", "w", max_bytes=10)
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_json_bounded(b"{nope", "w")


def _manifest_doc(toy_cache) -> dict:
    return json.loads((toy_cache / "manifest.json").read_text())


@pytest.mark.parametrize(
    "edit,pattern",
    [
        (lambda d: d["shards"][0].update(records=10**15), r"shards\[0\]\.records = 1000000000000000 is not a whole number"),
        (lambda d: d["shards"][0].update(records=10**6), r"shards\[0\]\.records = 1000000 x 4 fields cannot fit in shards\[0\]\.bytes"),
        (lambda d: d["shards"][1].update(first_record=0), r"shards\[1\]\.first_record = 0 but the shards before it hold"),
        (lambda d: d["shards"][1].update(name=d["shards"][0]["name"]), r"shards\[1\]\.name = 'shard-00000\.tar' is listed twice"),
        (lambda d: d["shards"][0].update(bytes=-1), r"shards\[0\]\.bytes = -1 is not a whole number"),
        (lambda d: d["shards"][0].update(sha256="../x"), r"shards\[0\]\.sha256 = '\.\./x' is not a sha256"),
        (lambda d: d.update(records=5), r"records = 5 but its shards hold"),
        (lambda d: d.update(seed=-3), r"seed = -3"),
        (lambda d: d["fields"]["mat"].update(ndim=9), r"fields\.mat\.ndim = 9"),
        (lambda d: d["fields"]["mat"].update(max_shape=[2**31, 2**31]), r"fields\.mat\.max_shape = \[2147483648, 2147483648\].*more than the limit"),
        (lambda d: d["fields"]["mat"].update(min_shape=[7, 7]), r"fields\.mat\.min_shape \[7, 7\] exceeds max_shape"),
        (lambda d: d["fields"].update({"../x": d["fields"].pop("vec")}), r"field name '\.\./x' is not allowed"),
        (lambda d: d.update(fields=[]), r"fields = \[\] is not a table"),
        (lambda d: d.update(shards={"a": 1}), r"shards = \{'a': 1\} is not a list"),
    ],
)
def test_absurd_manifests_are_refused_naming_the_field(toy_cache, edit, pattern):
    doc = _manifest_doc(toy_cache)
    edit(doc)
    with pytest.raises(ManifestError, match=pattern):
        Manifest.from_json(json.dumps(doc), "c")


def test_good_manifest_passes(toy_cache):
    m = Manifest.from_json(json.dumps(_manifest_doc(toy_cache)), "c")
    assert m.records == 600


def test_frame_header_parser_agrees_with_zstd():
    frames = [zstandard.ZstdCompressor(write_checksum=True).compress(b"a" * n) for n in (0, 1, 255, 256, 300, 65791, 65792, 70000, 1 << 20)]
    frames.append(zstandard.ZstdCompressor(write_content_size=False).compress(b"b" * 100))
    frames.append(b"not a zstd frame at all")
    frames.append(frames[3][:5])  # cut inside the header
    blob = b"".join(frames)
    offsets = np.cumsum([0] + [len(f) for f in frames[:-1]])
    got = frame_content_sizes(np.frombuffer(blob, np.uint8), offsets, np.array([len(f) for f in frames]))
    assert got.tolist() == [zstandard.frame_content_size(f) for f in frames[:-2]] + [-2, -2]


def test_json_of_too_many_values_is_refused_before_parsing():
    """Acceptance audit of issue 10: 200 MB of ``[],`` in a manifest (under its 256 MiB limit) parsed to
    5.1 GB and passed ``verify``. Values (containers and commas outside strings) are counted first; the
    depth pass runs in chunks, so a manifest near its byte limit peaks at about 3x its size."""
    from cachebuild.format.limits import MAX_MANIFEST_BYTES

    MAX_JSON_VALUES = 1 << 24  # cachebuild.format.limits.MAX_JSON_VALUES (spelt out, so the test also runs before it existed)
    many = b"[" + b"[]," * MAX_JSON_VALUES + b"[]]"  # 50 MB, ~1.2 GB once parsed
    with pytest.raises(ManifestError, match=f"m: JSON of about {MAX_JSON_VALUES * 2 + 2} values exceeds the limit of {MAX_JSON_VALUES}"):
        load_json_bounded(many, "m", ManifestError, MAX_MANIFEST_BYTES)
    commas = json.dumps({"s": "[" * 70 + ",", "x": [1] * 1000, "d": [[[[0]]]] * 100}).encode()  # brackets and commas inside strings are not counted
    assert load_json_bounded(commas, "m", ManifestError, MAX_MANIFEST_BYTES)["d"][0] == [[[0]]]
    chunked = b"[" * 40 + b"0," * (5 << 20) + b"[" * 30 + b"]" * 70  # nesting that spans the depth pass's 4 MiB chunks
    with pytest.raises(ManifestError, match="JSON nested 70 levels deep"):
        load_json_bounded(chunked, "m", ManifestError, MAX_MANIFEST_BYTES)
