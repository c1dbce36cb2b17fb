"""One reader of the format: ``verify``, ``inspect`` and the loader open shards the same way and decode
with the same function, so a fault is found by all of them and reported in the same words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format import open_cache, read_record
from cachebuild.format.records import record_blocks
from cachebuild.tools.inspect import inspect_cache
from cachebuild.tools.verify import verify_cache
from hostile_fixtures import copy_cache, field_pos, load_doc, read_index, rehash, rewrite_shard, save_doc
from loader_fixtures import Reference
from loaders import ShardStream


def _flip(root: Path, doc: dict, shard: int, record: int, field: str, codec: str) -> int:
    """Flip one byte of a member's stored bytes (its array data; for zstd, inside the compressed
    block, past the frame header), fix the manifest's hashes as an attacker would; return its record id."""
    e = read_index(root, doc, shard)[record, field_pos(doc, field)]
    off, size = int(e["offset"]), int(e["size"])
    pos = off + size - 1 if codec == "raw" else off + size - 6  # zstd: before the 4-byte content checksum
    tar = bytearray((root / doc["shards"][shard]["name"]).read_bytes())
    tar[pos] ^= 0x5A
    (root / doc["shards"][shard]["name"]).write_bytes(bytes(tar))
    rehash(root, doc, shard)
    save_doc(root, doc)
    return doc["shards"][shard]["first_record"] + record


def _loader_error(root: Path) -> str:
    with pytest.raises(ShardCorruptError) as info:
        for _ in ShardStream(root, view="records", batch_size=16, shuffle=False):
            pass
    return str(info.value)


@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_verify_inspect_and_loader_report_a_corrupt_member_identically(tmp_path, toy_cache, toy_cache_raw, codec):
    root = copy_cache(toy_cache if codec == "zstd" else toy_cache_raw, tmp_path / "c")
    doc = load_doc(root)
    rid = _flip(root, doc, 1, 2, "mat", codec)

    loader = _loader_error(root)
    assert f"record {rid:010d}, field 'mat': " in loader
    assert ("zstd: " if codec == "zstd" else "crc32 mismatch") in loader
    assert verify_cache(root).faults == [loader]
    with pytest.raises(ShardCorruptError) as info:
        inspect_cache(root, rid)
    assert str(info.value) == loader


def test_a_corrupt_frame_in_a_later_zstd_call_names_its_own_record(tmp_path, toy_cache, monkeypatch):
    """A block decoded in several zstd calls: zstd numbers the bad item within its call, the error still
    names the record of that frame."""
    from cachebuild.format import zstd_output

    monkeypatch.setattr(zstd_output, "CHUNK_BYTES", 1)  # one frame per call
    root = copy_cache(toy_cache, tmp_path / "c")
    doc = load_doc(root)
    rid = _flip(root, doc, 1, 2, "mat", "zstd")
    assert f"record {rid:010d}, field 'mat': zstd: " in _loader_error(root)


def test_verify_lists_every_corrupt_member_of_a_block(tmp_path, toy_cache_raw):
    root = copy_cache(toy_cache_raw, tmp_path / "c")
    doc = load_doc(root)
    bad = [_flip(root, doc, 0, r, f, "raw") for r, f in ((1, "vec"), (4, "mat"), (4, "ident"))]
    report = verify_cache(root)
    assert len(report.faults) == 3 and report.records == load_doc(root)["records"]
    for rid, f, fault in zip(bad, ("vec", "mat", "ident"), report.faults):
        assert f"record {rid:010d}, field '{f}': crc32 mismatch" in fault


def test_verify_checks_npy_headers_inside_zstd_frames(tmp_path, toy_cache):
    """A header the loader never reads (it takes the index's word) but ``zstd -d`` users do: verify and
    inspect refuse it, the loader still reads the array data."""
    root = copy_cache(toy_cache, tmp_path / "c")
    doc = load_doc(root)
    j = field_pos(doc, "vec")
    e = read_index(root, doc, 0)[0, j]
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    member = zstandard.ZstdDecompressor().decompress(tar[int(e["offset"]) : int(e["offset"]) + int(e["size"])])
    assert b"'<f8'" in member
    forged = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(member.replace(b"'<f8'", b"'|O' ", 1))
    rewrite_shard(root, doc, 0, {(0, j): forged})
    save_doc(root, doc)

    report = verify_cache(root)
    assert len(report.faults) == 1 and "record 0000000000, field 'vec': .npy header says dtype |O" in report.faults[0]
    with pytest.raises(ShardCorruptError, match=r"record 0000000000, field 'vec': \.npy header says dtype \|O"):
        inspect_cache(root, 0)
    for _ in ShardStream(root, view="records", batch_size=64, shuffle=False):
        pass


@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_read_record_equals_a_plain_tar_reader(codec, toy_cache, toy_cache_raw):
    root = toy_cache if codec == "zstd" else toy_cache_raw
    ref = Reference(root)
    with open_cache(root) as shards:
        for rid in (0, 1, ref.manifest.records // 2, ref.manifest.records - 1):
            ours, plain = read_record(shards, rid, strict=True), ref.record(rid)
            assert list(ours) == list(plain)
            for name, value in plain.items():
                if isinstance(value, dict):
                    assert ours[name] == value
                else:
                    assert ours[name].dtype == value.dtype and ours[name].shape == value.shape
                    np.testing.assert_array_equal(ours[name], value)


def test_record_blocks_cover_a_shard_within_the_budget(toy_cache):
    with open_cache(toy_cache) as shards:
        m = shards.manifest
        for s, e in enumerate(m.shards):
            budget = 600
            blocks = record_blocks(shards, s, budget=budget)
            assert blocks[0][0] == e.first_record and blocks[-1][1] == e.first_record + e.records
            assert all(a < b for a, b in blocks) and all(b == a2 for (_, b), (a2, _) in zip(blocks, blocks[1:]))
            per = shards.index(s)["nbytes"].sum(axis=1) + 1
            for a, b in blocks:
                rows = per[a - e.first_record : b - e.first_record]
                assert rows.sum() <= budget + rows.max()  # the last record of a block may cross it
            assert len(record_blocks(shards, s)) == 1


def test_strict_read_refuses_stray_bytes_before_raw_json(tmp_path, toy_cache_raw):
    """The decoder takes a member's last ``nbytes`` (what the loader reads); ``strict`` (verify,
    inspect) also refuses bytes before a raw JSON text, which a plain ``json.load`` would choke on."""
    root = copy_cache(toy_cache_raw, tmp_path / "c")
    with open_cache(root) as shards:
        original = read_record(shards, 3)["json"]
    doc = load_doc(root)
    j = field_pos(doc, "json")
    e = read_index(root, doc, 0)[3, j]
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    rewrite_shard(root, doc, 0, {(3, j): b"  " + tar[int(e["offset"]) : int(e["offset"]) + int(e["size"])]})
    save_doc(root, doc)
    with open_cache(root) as shards:
        assert read_record(shards, 3)["json"] == original
        with pytest.raises(ShardCorruptError, match=r"record 0000000003, field 'json': 2 stray bytes before the JSON text"):
            read_record(shards, 3, strict=True)
    assert any("2 stray bytes" in f for f in verify_cache(root).faults)
