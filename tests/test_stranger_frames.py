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
