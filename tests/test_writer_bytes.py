"""The shard writer's bytes are pinned: faster writing must give the very same shards.

``tests/data/writer_golden.json`` holds the sha256 of every shard, index and
manifest of a fixed set of small builds (causal graphs and awkward fields, zstd
and raw) as main's writer of commit 1d3ec8c made them. The bytes also depend on
numpy (its SIMD kernels) and zstd, so the comparison runs where those match the
recorded environment; the per-record and per-block paths of the writer are
compared with each other everywhere.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from writer_golden import AWKWARD_FIELDS, awkward_record, environment, golden_builds

from cachebuild.builder.plan import block_rng
from cachebuild.format.codec import Codec
from cachebuild.format.shard_writer import ShardWriter

GOLDEN = json.loads((Path(__file__).parent / "data" / "writer_golden.json").read_text())


def test_builds_give_the_pinned_bytes(tmp_path: Path) -> None:
    if environment() != GOLDEN["environment"]:
        pytest.skip(f"bytes pinned for {GOLDEN['environment']}, this is {environment()}")
    got = golden_builds(tmp_path, workers=2)
    want = GOLDEN["hashes"]
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


@pytest.mark.parametrize("codec", [Codec("zstd", 1), Codec("none", 0)], ids=["zstd", "none"])
def test_record_and_block_paths_write_the_same_bytes(tmp_path: Path, codec: Codec) -> None:
    rng = block_rng(1, 0, 0)
    records = [awkward_record(rng, i) for i in range(97)]
    fields = list(AWKWARD_FIELDS.items())
    one = ShardWriter(tmp_path, "shard-00000.tar", fields, codec, first_record=40)
    for r in records:
        one.add(r)
    a = one.close(sync=False)
    (tmp_path / "a").mkdir()
    for name in (a.name, a.index):
        (tmp_path / name).rename(tmp_path / "a" / name)
    blocks = ShardWriter(tmp_path, "shard-00000.tar", fields, codec, first_record=40)
    for start in (0, 1, 31, 60):
        stop = {0: 1, 1: 31, 31: 60, 60: 97}[start]
        blocks.add_block(records[start:stop])
    b = blocks.close(sync=False)
    assert a == b
    for name in (a.name, a.index):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / name).read_bytes()
    with tarfile.open(tmp_path / a.name) as tf:
        members = tf.getmembers()
    assert len(members) == 97 * len(fields) and members[0].name.startswith("0000000040.")
    assert members[-1].size == np.load(tmp_path / a.index)[-1, -1]["size"]


class _OneFrameAtATime:
    """A compressor without the batch call (as the cffi binding of zstandard)."""

    def __init__(self, cctx) -> None:
        self.compress = cctx.compress


def test_batch_and_frame_by_frame_compression_agree(tmp_path: Path) -> None:
    from cachebuild.format.member_block import FieldSpec, encode_run

    rng = block_rng(2, 0, 0)
    records = [awkward_record(rng, i) for i in range(40)]
    specs = [FieldSpec(f, d, "") for f, d in AWKWARD_FIELDS.items()]
    cctx = Codec("zstd", 3).compressor()
    batched = encode_run(records, specs, cctx, str)
    single = encode_run(records, specs, _OneFrameAtATime(cctx), str)
    assert [bytes(f) for f in batched.bodies] == [bytes(f) for f in single.bodies]
    assert batched.sizes.tolist() == single.sizes.tolist() and (batched.rows == single.rows).all()


def _bad_at_seven(rng: np.random.Generator, index: int, kind: str) -> dict:
    record = {"x": np.zeros(3, np.float32), "meta": {"i": index}}
    if index == 7 and kind == "dtype":
        record["x"] = np.zeros(3, np.float16)
    if index == 7 and kind == "json":
        record["meta"] = {"i": object()}
    if index == 7 and kind == "dims":
        record["x"] = np.zeros((1,) * 6, np.float32)
    if index == 7 and kind == "rank":  # every reader refuses a field whose number of dims varies (found in review)
        record["x"] = np.zeros((3, 1), np.float32)
    if index == 7 and kind == "json_size":  # readers refuse a JSON entry over 16 MiB: the writer must too (found in review)
        record["meta"] = {"blob": "x" * (16 << 20)}
    return record


@pytest.mark.parametrize(
    "kind,words",
    [
        ("dtype", "expected dtype float32, got float16"),
        ("json", "not JSON-able"),
        ("dims", "6 dims > 5"),
        ("rank", "field 'x' of record 0000000007: 2 dims, but record 0000000000 has 1"),
        ("json_size", "field 'meta' of record 0000000007: JSON of 16777227 bytes is over the 16777216 bytes a reader accepts"),
    ],
)
def test_a_bad_record_inside_a_block_is_named(tmp_path: Path, kind: str, words: str) -> None:
    from cachebuild.builder import BuildOptions, build_cache
    from cachebuild.errors import SourceError
    from cachebuild.function_source import FunctionSource

    source = FunctionSource.per_record(_bad_at_seven, {"x": "float32", "meta": "json"}, block_records=20, params={"kind": kind})
    opts = BuildOptions(out=tmp_path / "c", records=20, workers=1, progress=False, sync=False)
    with pytest.raises(SourceError) as err:
        build_cache(source, opts)
    assert "shard 0 record 7 " in str(err.value) and words in str(err.value)
    assert not any(p.name.endswith(".tar") for p in (tmp_path / "c").iterdir())


def _rank_from_ten(rng: np.random.Generator, index: int) -> dict:
    return {"x": np.zeros((2,) * (1 + (index >= 10)), np.float32)}


def test_a_field_whose_dims_change_between_shards_is_refused(tmp_path: Path) -> None:
    """Each shard alone is consistent; the manifest's one rank per field is not (found in review)."""
    from cachebuild.builder import BuildOptions, build_cache
    from cachebuild.errors import SourceError
    from cachebuild.function_source import FunctionSource

    source = FunctionSource.per_record(_rank_from_ten, {"x": "float32"}, block_records=5)
    opts = BuildOptions(out=tmp_path / "c", records=20, workers=1, progress=False, sync=False, shard_bytes=40)
    with pytest.raises(SourceError, match=r"field 'x': shard-00002.tar has records of 2 dims, shard-00000.tar of 1"):
        build_cache(source, opts)
    assert not (tmp_path / "c" / "manifest.json").exists()


@pytest.mark.parametrize("pack", [1, 3])
@pytest.mark.parametrize("codec", [Codec("zstd", 1), Codec("none", 0)], ids=["zstd", "none"])
def test_every_tar_header_is_the_one_by_one_header(tmp_path: Path, codec: Codec, pack: int) -> None:
    """The writer names its members with numpy (``member_name_bytes``) and writes the headers in place; each
    header must be exactly ``tar_header(name, size)``, the one-member form, also where record ids pass 10
    digits mid-run (those runs take the one-by-one path) and where the pinned-bytes test is skipped."""
    from cachebuild.format.names import member_name_bytes, record_key
    from cachebuild.format.tarball import tar_header

    rng = block_rng(2, 0, 0)
    records = [awkward_record(rng, i) for i in range(40)]
    fields = list(AWKWARD_FIELDS.items())
    for first in (0, 10**10 - 7):
        folder = tmp_path / str(first)
        folder.mkdir()
        writer = ShardWriter(folder, "shard-00000.tar", fields, Codec(codec.name, codec.level, pack=pack), first_record=first)
        writer.add_block(records[:13])
        writer.add_block(records[13:])
        shard = writer.close(sync=False)
        data = (folder / shard.name).read_bytes()
        with tarfile.open(folder / shard.name) as tf:
            members = tf.getmembers()
        assert len(members) == -(-40 // pack) * len(fields)
        assert members[0].name.startswith(record_key(first) + ".") and members[-1].name.startswith(record_key(first + 39 - 39 % pack) + ".")
        for m in members:
            assert data[m.offset : m.offset + 512] == tar_header(m.name, m.size), m.name
    names, sums = member_name_bytes(np.array([0, 7, 10**10 - 1]), [".a.npy.zst", ".b"]) or (None, None)
    want = [record_key(k) + s for k in (0, 7, 10**10 - 1) for s in (".a.npy.zst", ".b")]
    assert [bytes(row).rstrip(b"\0").decode() for row in names] == want
    assert sums.tolist() == [sum(w.encode()) for w in want]
    assert member_name_bytes(np.array([10**10]), [".a"]) is None and member_name_bytes(np.array([1]), ["." + "x" * 90]) is None
    assert member_name_bytes(np.array([1]), [".é"]) is None
