"""A zstd member whose frame is followed by more bytes inside the member (acceptance audit of issue 10):
a second frame there is ignored by our decoder, but ``tar -x`` plus ``zstd -d`` (the format's promise to
plain tools) decodes both, so the plain tools read another file than the loader: here a 1 GiB bomb
behind a good frame. ``verify`` and ``stage`` walk each frame's block headers and refuse it; so do
the loader and ``inspect`` (its leftovers, sixteenth session). And a frame that decodes to fewer bytes
than its ``.npy`` (or an index that says less data than its frame holds), within the allowance for a
header: every reader refuses it, where the loader and ``stage`` read the record's data shifted."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import build_toy
from cachebuild.errors import ShardCorruptError
from cachebuild.tools.stage import stage_cache
from cachebuild.tools.verify import verify_cache
from hostile_fixtures import copy_cache, field_pos, load_doc, read_index, rewrite_shard, save_doc, zstd_bomb
from stranger_fixtures import packed  # noqa: F401 (a fixture)

PATTERN = r"record 0000000000, field 'mat': zstd frame ends after \d+ of the entry's \d+ bytes \(more bytes after it"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frames") / "good"
    build_toy(root, records=120)
    return root


@pytest.mark.parametrize("tail", ["bomb", "junk"])
def test_bytes_after_a_members_frame_are_refused_by_verify_and_stage(tmp_path: Path, good: Path, tail: str) -> None:
    root = copy_cache(good, tmp_path / "cache")
    doc = load_doc(root)
    j = field_pos(doc, "mat")
    e = read_index(root, doc, 0)[0, j]
    frame = (root / doc["shards"][0]["name"]).read_bytes()[int(e["offset"]) : int(e["offset"]) + int(e["size"])]
    rewrite_shard(root, doc, 0, {(0, j): frame + (zstd_bomb(1 << 30) if tail == "bomb" else b"\0" * 7)})  # sizes and hashes recomputed
    save_doc(root, doc)
    faults = verify_cache(root).faults
    assert faults and any(__import__("re").search(PATTERN, f) for f in faults), faults  # was: "ok"
    with pytest.raises(ShardCorruptError, match=PATTERN):
        stage_cache(root, tmp_path / "staged", progress=False)  # was: staged
    assert not (tmp_path / "staged").exists()


def test_every_frame_of_a_good_cache_ends_at_its_entry(good: Path, tmp_path: Path) -> None:
    """Multi-block frames too (members of 160-360 KB, over zstd's 128 KiB block): the walk reaches each frame's end."""
    from cachebuild.builder import BuildOptions, build_cache
    from cachebuild.testing import ToySource

    big = tmp_path / "big"
    build_cache(ToySource(n_min=200, n_max=300), BuildOptions(out=big, records=6, seed=0, shard_bytes=1_000_000, workers=1, progress=False, sync=False))
    assert verify_cache(good).ok and verify_cache(big).ok
    stage_cache(big, tmp_path / "staged", progress=False)


def _read_all(root: Path, workers: int) -> None:
    """Every record through the loader (``records`` view), at ``workers`` DataLoader workers."""
    from loaders import ShardStream, make_loader
    from loaders.loader import shutdown_workers

    dl = make_loader(ShardStream(str(root), view="records", batch_size=64, shuffle=False), num_workers=workers)
    try:
        for _ in dl:
            pass
    finally:
        shutdown_workers(dl)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field", ["mat", "json"])
def test_bytes_after_a_members_frame_are_refused_by_the_loader_and_inspect(tmp_path: Path, good: Path, field: str) -> None:
    """(Acceptance audit of issue 10, leftovers.) The loader and ``inspect`` stopped at the first frame and
    read the member as if nothing followed it; they now refuse it as ``verify`` does, naming shard and record."""
    from cachebuild.tools.inspect import inspect_cache

    root = copy_cache(good, tmp_path / "cache")
    doc = load_doc(root)
    j = field_pos(doc, field)
    e = read_index(root, doc, 0)[0, j]
    frame = (root / doc["shards"][0]["name"]).read_bytes()[int(e["offset"]) : int(e["offset"]) + int(e["size"])]
    rewrite_shard(root, doc, 0, {(0, j): frame + b"\0" * 7})
    save_doc(root, doc)
    pattern = PATTERN.replace("'mat'", f"'{field}'")
    shard = doc["shards"][0]["name"].replace(".", r"\.")
    for workers in (0, 2) if field != "json" else ():  # (the records view reads array fields; JSON goes through read_json_values, as in inspect)
        with pytest.raises(ShardCorruptError, match=f"shard {shard}, " + pattern) as info:
            _read_all(root, workers)  # was: every batch read
        assert "\n" not in str(info.value)
    with pytest.raises(ShardCorruptError, match=f"shard {shard}, " + pattern):
        inspect_cache(root, record=0)  # was: the record printed


@pytest.mark.timeout(120)
def test_a_frame_shorter_than_its_npy_is_refused_by_the_loader_and_stage(tmp_path: Path, good: Path) -> None:
    """A well-formed frame (its own size and checksum) whose decoded member is 100 bytes short of the
    ``.npy`` it holds, within the index's allowance for a header: ``verify`` and ``inspect`` refused it
    (the header no longer parses), but the loader and ``stage`` took the array data from the frame's end,
    so the record's data began inside the header (shifted data). Now every reader refuses it."""
    import zstandard

    from cachebuild.tools.inspect import inspect_cache

    root = copy_cache(good, tmp_path / "cache")
    doc = load_doc(root)
    j = field_pos(doc, "mat")
    e = read_index(root, doc, 0)[0, j]
    frame = (root / doc["shards"][0]["name"]).read_bytes()[int(e["offset"]) : int(e["offset"]) + int(e["size"])]
    member = zstandard.ZstdDecompressor().decompress(frame)
    assert len(member) - 100 >= int(e["nbytes"])  # (within the index's allowance: the frame's size is not what is refused)
    short = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(member[:-100])
    rewrite_shard(root, doc, 0, {(0, j): short})
    save_doc(root, doc)
    pattern = r"record 0000000000, field 'mat': decoded \.npy member is \d+ bytes, its header says \d+ bytes of header and the index \d+ bytes of data"
    assert any("record 0000000000, field 'mat'" in f for f in verify_cache(root).faults)
    with pytest.raises(ShardCorruptError, match="record 0000000000, field 'mat'"):
        inspect_cache(root, record=0)
    for workers in (0, 2):
        with pytest.raises(ShardCorruptError, match=pattern):
            _read_all(root, workers)  # was: read, record 0's 'mat' starting 28 bytes into its .npy header
    with pytest.raises(ShardCorruptError, match=pattern):
        stage_cache(root, tmp_path / "staged", progress=False)  # was: staged
    assert not (tmp_path / "staged").exists()


@pytest.mark.parametrize("key", ["zstd", "shared"])
def test_a_packed_members_header_frame_read_short_by_its_index_is_refused(tmp_path: Path, packed: dict[str, Path], key: str) -> None:
    """The same shift in a packed member (format v3, and v4 with shared frames): the index says a group's
    first record holds 16 int32 fewer (its frame, with the group's ``.npy`` header, unchanged; the size
    difference, 64 bytes, within the allowance for a header and its 64-byte alignment). The loader took the
    record's data from the frame's end (its last 16 tokens were read as its first); now it and ``stage`` refuse it."""
    from stranger_fixtures import copy_packed, read_packed_index, write_packed_index

    root, doc = copy_packed(packed[key], tmp_path / "cache")
    index = read_packed_index(root, doc, 0)
    j = field_pos(doc, "tokens")
    r = next(r for r in range(0, len(index), 7) if index[r, j]["shape"][0] > 16)
    index[r, j]["shape"][0] -= 16
    index[r, j]["nbytes"] -= 64
    write_packed_index(root, doc, 0, index)
    save_doc(root, doc)
    from stranger_fixtures import loader_error

    member = "|".join(f"{k:010d}" for k in range(r, r + 7))  # (a shared frame is named by one of its records)
    pattern = rf"record ({member}), field 'tokens': decoded \.npy member is \d+ bytes, its header says \d+ bytes of header and the index \d+ bytes of data"
    assert __import__("re").search(pattern, loader_error(root)), loader_error(root)  # was: read, shifted by 16 tokens
    with pytest.raises(ShardCorruptError, match=pattern):
        stage_cache(root, tmp_path / "staged", progress=False)  # was: staged
    assert not (tmp_path / "staged").exists()


def test_the_writers_frames_need_no_header_check(packed: dict[str, Path], good: Path) -> None:
    """Every header-holding frame the writer writes declares its header's and data's sizes, so the decoder
    never reads a header on the hot path (only a stranger's frame that does not is marked for it)."""
    import numpy as np

    from cachebuild.format.entries import CHECK_HEADER, HI, LO, SHR, shard_table
    from cachebuild.format.reader import open_cache

    for root in (good, packed["zstd"], packed["shared"]):
        with open_cache(root) as shards:
            names = [f.name for f in shards.manifest.fields if f.dtype != "json"]
            cols = tuple(shards.field_pos[n] for n in names)
            nd = max(shards.manifest.schema(n).ndim for n in names)
            tables = [shard_table(shards, s, cols, nd) for s in range(len(shards.manifest.shards))]
        assert sum(int((t[..., HI] > t[..., LO]).sum()) for t in tables) > 0
        assert not any(np.any(t[..., SHR] & CHECK_HEADER) for t in tables), root


@pytest.mark.parametrize("verify", ["crc", "size"])
def test_a_raw_payload_shorter_than_its_npy_is_refused_by_the_loader_and_stage(tmp_path: Path, verify: str) -> None:
    """The raw twin of the short frame: a member's payload 100 bytes short of its ``.npy`` (the index's size
    and crc32 recomputed, within its allowance for a header). The loader read the data from the payload's end."""
    import zlib

    from conftest import build_toy as build
    from cachebuild.format.codec import Codec
    from hostile_fixtures import write_index
    from loaders import ShardStream

    root = tmp_path / "cache"
    build(root, records=120, codec=Codec("none", 0))
    doc = load_doc(root)
    j = field_pos(doc, "mat")
    e = read_index(root, doc, 0)[0, j]
    payload = (root / doc["shards"][0]["name"]).read_bytes()[int(e["offset"]) : int(e["offset"]) + int(e["size"])][:-100]
    assert len(payload) >= int(e["nbytes"])
    index = rewrite_shard(root, doc, 0, {(0, j): payload}).copy()
    index[0, j]["crc32"] = zlib.crc32(payload)
    write_index(root, doc, 0, index)
    save_doc(root, doc)
    pattern = r"record 0000000000, field 'mat': stored \.npy member is \d+ bytes, its header says \d+ bytes of header and the index \d+ bytes of data"
    with pytest.raises(ShardCorruptError, match=pattern):
        for _ in ShardStream(root, view="records", batch_size=64, shuffle=False, verify=verify):
            pass  # was: read, record 0's 'mat' starting inside its .npy header
    with pytest.raises(ShardCorruptError, match=pattern):
        stage_cache(root, tmp_path / "staged", progress=False)  # was: staged
