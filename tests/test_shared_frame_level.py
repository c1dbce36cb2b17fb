"""Which zstd level a frame of several entries is written at: level -1 in a build of the default
``share`` (1 KiB: small labels and JSON, read at random), the build's own level where ``share`` is
larger (a cache for pooled reads, where level -1 would store float16 records at a ratio of ~1.0)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import zstandard

from cachebuild import FunctionSource, build


def _record(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    return {"x": (rng.standard_normal(200) * 3).round().astype(np.float16), "label": np.array(index % 7, np.int16)}


def _frames(data: bytes) -> list[bytes]:
    """The zstd frames of one member's body, one after another."""
    frames = []
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data)
        rest = d.unused_data
        frames.append(data[: len(data) - len(rest)])
        data = rest
    return frames


def _levels_of_shared_frames(root: Path, levels: tuple[int, ...]) -> list[set[int]]:
    """Per frame of several entries (more bytes than one record's), the levels of ``levels`` that
    reproduce it byte for byte."""
    found = []
    with tarfile.open(root / "shard-00000.tar") as tar:
        for member in tar.getmembers():
            body = tar.extractfile(member).read()  # type: ignore[union-attr]
            one = 400 if ".x." in member.name else 2
            for frame in _frames(body):
                raw = zstandard.ZstdDecompressor().decompress(frame)
                if len(raw) > one + 128:  # (more than one record and a .npy header: a shared frame)
                    found.append({lv for lv in levels if zstandard.ZstdCompressor(level=lv, write_checksum=True, write_content_size=True).compress(raw) == frame})
    return found


@pytest.mark.parametrize("share, level", [(None, -1), (65536, 3)])
def test_shared_frames_level(tmp_path: Path, share: int | None, level: int) -> None:
    source = FunctionSource.per_record(_record, {"x": "float16", "label": "int16"})
    out = tmp_path / "cache"
    build(source, out, records=3000, workers=1, progress=False, level=3, share=share, seed=1)
    frames = _levels_of_shared_frames(out, (-1, 1, 3))
    assert len(frames) >= 2
    assert all(level in same for same in frames)
    assert any(same == {level} for same in frames)  # (some frame that no other level gives)
