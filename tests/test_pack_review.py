"""Packed caches as a new user meets them (review of issue 15, item 2): a packed shard's
``.idx.npy.zst`` recompressed by the ``zstd`` tool from a pipe (a frame that does not declare
its decoded size) still reads, bounded; one that decodes past its bound is one clear error."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import zstandard

from cachebuild import FunctionSource, build
from cachebuild.errors import CacheMismatchError, ShardCorruptError
from cachebuild.format.reader import open_cache
from cachebuild.format.records import read_record
from cachebuild.tools.verify import verify_cache
from hostile_fixtures import load_doc, rehash, save_doc


def _block(rng: np.random.Generator, start: int, stop: int) -> dict:
    return {"x": rng.standard_normal((stop - start, 6)).astype(np.float32), "meta": [{"i": i} for i in range(start, stop)]}


def _streamed(data: bytes) -> bytes:
    """``data`` as one zstd frame written by a stream (what ``cat f | zstd`` writes): no content size."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as w:
        w.write(data)
    frame = out.getvalue()
    assert zstandard.frame_content_size(frame) == -1  # (python-zstandard: -1 for "not declared")
    return frame


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    root = tmp_path / "c"
    build(FunctionSource.per_block(_block, {"x": "float32", "meta": "json"}), root, records=37, pack=5, shard_mb=0.0005, progress=False, backend="threading")
    return root


def test_streamed_index_frame_reads(cache: Path) -> None:
    doc = load_doc(cache)
    idx = cache / doc["shards"][0]["index"]
    assert idx.name.endswith(".idx.npy.zst")
    before = read_record(open_cache(cache), 3, strict=True)
    idx.write_bytes(_streamed(zstandard.ZstdDecompressor().decompress(idx.read_bytes())))
    rehash(cache, doc, 0)
    save_doc(cache, doc)
    after = read_record(open_cache(cache), 3, strict=True)
    np.testing.assert_array_equal(after["x"], before["x"])
    assert after["meta"] == before["meta"] and verify_cache(cache).ok


def test_streamed_index_frame_past_its_bound_is_refused(cache: Path) -> None:
    doc = load_doc(cache)
    idx = cache / doc["shards"][0]["index"]
    idx.write_bytes(_streamed(b"\0" * (64 << 20)))
    rehash(cache, doc, 0)
    save_doc(cache, doc)
    with pytest.raises(ShardCorruptError, match=r"index .*shard-00000\.idx\.npy\.zst: zstd frame decodes to more than \d+ bytes"):
        read_record(open_cache(cache), 0)


@pytest.mark.parametrize("pack", [3, 4])
def test_a_wrong_pack_in_the_manifest_is_named(cache: Path, pack: int) -> None:
    """A hand-edited ``pack`` (the cache's and every shard's alike, else the manifest is refused
    outright) reads as entries out of order; the one-line error names the manifest field and value
    as the likely cause. (Removing it, pack 1, is caught earlier here: the shard's bytes cannot hold
    one member per record and field.)"""
    doc = load_doc(cache)
    doc["codec"]["pack"] = pack
    for shard in doc["shards"]:
        shard["pack"] = pack
    save_doc(cache, doc)
    first = doc["shards"][1]["first_record"]
    with pytest.raises(ShardCorruptError, match=rf"out of order.*; or the manifest's shards\[1\]\.pack = {pack} is not the shard's"):
        read_record(open_cache(cache), first)
    report = verify_cache(cache)
    assert not report.ok and any("shards[1].pack" in line for line in report.faults)


def test_a_rebuild_mismatch_on_a_packed_cache_names_only_what_differs(cache: Path) -> None:
    """The manifest says version 3 (packed), the build hashes the format version 1: not a difference to report."""
    with pytest.raises(CacheMismatchError) as info:
        build(FunctionSource.per_block(_block, {"x": "float32", "meta": "json"}), cache, records=37, pack=5, seed=9, shard_mb=0.0005, progress=False)
    assert "seed: cache 0, this build 9" in str(info.value) and "version" not in str(info.value)
