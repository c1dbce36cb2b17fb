"""The shard format: round trip, interop with tar/zstd/tarfile/WebDataset, corruption."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import ManifestError, ShardCorruptError
from cachebuild.format import open_cache, read_block, read_manifest, read_record
from cachebuild.format.npy import npy_header
from cachebuild.format.tarball import tar_header
from cachebuild.testing import ToySource


def _expected_records(manifest):
    """Regenerate every record from the source, shard by shard, as the builder did."""
    src = ToySource(**manifest.config)
    out = []
    for i, s in enumerate(manifest.shards):
        for block in src.blocks(manifest.seed, i, s.first_record, s.first_record + s.records):
            out.extend(block)
    return out


def _readers(root: Path):
    """The cache's shards, every one opened (and so checked) now."""
    shards = open_cache(root)
    for s in range(len(shards.manifest.shards)):
        shards.shard(s)
    return shards.manifest, shards


@pytest.mark.parametrize("cache", ["toy_cache", "toy_cache_raw"])
def test_round_trip_every_record(cache, request):
    root = request.getfixturevalue(cache)
    m, shards = _readers(root)
    expected = _expected_records(m)
    got = [read_record(shards, rid) for rid in range(m.records)]
    assert len(got) == len(expected) == m.records == 600
    block = read_block(shards, np.arange(m.records)[::-1], ["vec", "ident"])  # many records at once, any order
    np.testing.assert_array_equal(block["ident"].dense(), np.arange(m.records)[::-1])
    np.testing.assert_array_equal(block["vec"].dense(), np.stack([e["vec"] for e in expected[::-1]]))
    assert len(m.shards) > 3
    for gid, (g, e) in enumerate(zip(got, expected)):
        assert int(g["ident"]) == gid
        for k in ("mat", "vec", "ident"):
            assert g[k].dtype == e[k].dtype and g[k].shape == e[k].shape
            np.testing.assert_array_equal(g[k], e[k])
        assert g["json"] == e["json"]


def test_schema_records_varying_axes(toy_cache):
    m = read_manifest(toy_cache)
    mat = m.schema("mat")
    assert mat.max_shape == (6, 6) and mat.min_shape == (2, 2) and mat.varying_axes == (0, 1)
    assert m.schema("vec").varying_axes == ()
    assert m.schema("ident").ndim == 0


def test_npy_header_matches_numpy():
    for arr in [np.zeros((3, 4), np.float32), np.zeros((), np.int64), np.zeros((2, 0, 5), np.uint8), np.zeros(7, ">f8")]:
        buf = io.BytesIO()
        np.save(buf, arr)
        assert buf.getvalue()[: len(npy_header(arr))] == npy_header(arr)


def test_tar_header_matches_tarfile_reader():
    data = tar_header("0000000001.adj.npy.zst", 12345)
    info = tarfile.TarInfo.frombuf(data + b"", tarfile.ENCODING, "surrogateescape")
    assert info.name == "0000000001.adj.npy.zst" and info.size == 12345 and info.isfile()


def test_python_tarfile_lists_members_in_order(toy_cache):
    m = read_manifest(toy_cache)
    with tarfile.open(toy_cache / m.shards[0].name) as tf:
        names = tf.getnames()
    assert names[:4] == ["0000000000.mat.npy.zst", "0000000000.vec.npy.zst", "0000000000.ident.npy.zst", "0000000000.json.zst"]
    assert len(names) == 4 * m.shards[0].records


@pytest.mark.skipif(shutil.which("tar") is None or shutil.which("zstd") is None, reason="needs the tar and zstd commands")
def test_real_tar_and_zstd_recover_npy(toy_cache, tmp_path):
    m, shards = _readers(toy_cache)
    shard = toy_cache / m.shards[1].name
    listing = subprocess.run(["tar", "-tf", str(shard)], check=True, capture_output=True, text=True).stdout.split()
    assert listing[0] == f"{m.shards[1].first_record:010d}.mat.npy.zst"
    subprocess.run(["tar", "-xf", str(shard), "-C", str(tmp_path)], check=True)
    member = tmp_path / listing[0]
    subprocess.run(["zstd", "-q", "-d", str(member), "-o", str(tmp_path / "x.npy")], check=True)
    arr = np.load(tmp_path / "x.npy", allow_pickle=False)
    np.testing.assert_array_equal(arr, read_record(shards, m.shards[1].first_record)["mat"])


def test_webdataset_with_zst_decoder_yields_same_arrays(toy_cache):
    wds = pytest.importorskip("webdataset")
    import zstandard

    m, shards = _readers(toy_cache)
    dctx = zstandard.ZstdDecompressor()

    def unzst(sample):
        out = {}
        for k, v in sample.items():
            if k.endswith(".zst"):
                raw = dctx.decompress(v)
                k = k[:-4]
                v = np.load(io.BytesIO(raw), allow_pickle=False) if k.endswith(".npy") else raw
            out[k] = v
        return out

    urls = [str(toy_cache / s.name) for s in m.shards]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(unzst)
    count = 0
    for sample in ds:
        gid = int(sample["__key__"])
        ours = read_record(shards, gid)
        np.testing.assert_array_equal(sample["mat.npy"], ours["mat"])
        np.testing.assert_array_equal(sample["vec.npy"], ours["vec"])
        count += 1
    assert count == m.records


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_truncated_shard_is_named(toy_cache, tmp_path):
    root = _copy(toy_cache, tmp_path / "c")
    m = read_manifest(root)
    tar = root / m.shards[2].name
    tar.write_bytes(tar.read_bytes()[:-3000])
    with pytest.raises(ShardCorruptError, match=m.shards[2].name):
        _readers(root)


def test_corrupt_payload_names_shard_record_field(toy_cache, tmp_path):
    root = _copy(toy_cache, tmp_path / "c")
    m, shards = _readers(root)
    e = shards.index(0)[3, 0]
    shards.close()
    buf = bytearray((root / m.shards[0].name).read_bytes())
    buf[int(e["offset"]) + int(e["size"]) // 2] ^= 0xFF
    (root / m.shards[0].name).write_bytes(bytes(buf))
    _, shards = _readers(root)
    with pytest.raises(ShardCorruptError, match=r"shard-00000.tar, record 0000000003, field 'mat'"):
        read_record(shards, 3)


def test_corrupt_raw_payload_detected_by_crc(toy_cache_raw, tmp_path):
    root = _copy(toy_cache_raw, tmp_path / "c")
    m, shards = _readers(root)
    e = shards.index(0)[5, 1]
    shards.close()
    buf = bytearray((root / m.shards[0].name).read_bytes())
    buf[int(e["offset"]) + int(e["size"]) - 3] ^= 0x01
    (root / m.shards[0].name).write_bytes(bytes(buf))
    _, shards = _readers(root)
    with pytest.raises(ShardCorruptError, match=r"record 0000000005, field 'vec': crc32 mismatch"):
        read_record(shards, 5)


def test_missing_and_malformed_manifest(tmp_path, toy_cache):
    with pytest.raises(ManifestError, match=r"no cache manifest .* \(the folder does not exist\)"):
        read_manifest(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a cache")
    with pytest.raises(ManifestError, match=r"\(not a cachebuild cache: build one with"):
        read_manifest(tmp_path / "plain")
    (tmp_path / "plain" / "build.json").write_text("{}")  # a build that stopped before publishing its manifest
    with pytest.raises(ManifestError, match=r"\(incomplete build\? rerun the same command"):
        read_manifest(tmp_path / "plain")
    root = _copy(toy_cache, tmp_path / "c")
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(root)
    (root / "manifest.json").write_text('{"format": "cachebuild-shards", "version": 99}')
    with pytest.raises(ManifestError, match="version 99"):
        read_manifest(root)
