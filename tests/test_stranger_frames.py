"""A zstd member whose frame is followed by more bytes inside the member (acceptance audit of issue 10):
a second frame there is ignored by our decoder, but ``tar -x`` plus ``zstd -d`` (the format's promise to
plain tools) decodes both, so the plain tools read another file than the loader: here a 1 GiB bomb
behind a good frame. ``verify`` and ``stage`` walk each frame's block headers and refuse it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import build_toy
from cachebuild.errors import ShardCorruptError
from cachebuild.tools.stage import stage_cache
from cachebuild.tools.verify import verify_cache
from hostile_fixtures import copy_cache, field_pos, load_doc, read_index, rewrite_shard, save_doc, zstd_bomb

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
