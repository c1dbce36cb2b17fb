"""Shared by the stranger's-packed-cache tests (``test_stranger_packed.py``, ``test_stranger_tar.py``):
two small packed caches built once per session, and the edits an attacker makes to them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from hostile_fixtures import load_doc, rehash, save_doc

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"seg": "float16", "label": "int16", "tokens": "int32", "meta": "json"}


def block(rng: np.random.Generator, start: int, stop: int) -> dict:
    """Stacked ``seg``, a 0-d ``label``, ragged (flat) ``tokens`` and JSON Lines ``meta``."""
    n = stop - start
    lengths = rng.integers(1, 40, n)
    return {
        "seg": rng.standard_normal((n, 8, 16)).astype(np.float16),
        "label": list((np.arange(start, stop) % 7).astype(np.int16)),
        "tokens": [rng.integers(0, 1000, int(k)).astype(np.int32) for k in lengths],
        "meta": [{"id": int(i)} for i in range(start, stop)],
    }


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Packed caches of 40 records in 2 shards, groups of 7 (the last ones short): ``zstd`` (format v3:
    every entry its own frame), ``none`` (raw) and ``shared`` (format v4: zstd, small entries sharing
    frames of at most 512 bytes, so a group holds several frames of several entries)."""
    base = tmp_path_factory.mktemp("stranger-packed")
    out = {}
    for key, codec, share in (("zstd", "zstd", 0), ("none", "none", None), ("shared", "zstd", 512)):
        out[key] = base / key
        build(FunctionSource.per_block(block, FIELDS), out[key], records=40, pack=7, share=share, codec=codec, progress=False, shard_mb=0.01, backend="threading")
    return out


def copy_packed(src: Path, dst: Path) -> tuple[Path, dict]:
    shutil.copytree(src, dst)
    return dst, load_doc(dst)


def frame_declaring(size: int) -> bytes:
    """A tiny zstd frame whose header declares ``size`` decoded bytes and holds one (RFC 8878: magic,
    single-segment header with an 8-byte content size, one last raw block of one byte)."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + size.to_bytes(8, "little") + bytes([0x09, 0, 0]) + b"\0"


def read_packed_index(root: Path, doc: dict, i: int) -> np.ndarray:
    import io

    import zstandard

    return np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress((root / doc["shards"][i]["index"]).read_bytes())), allow_pickle=False).copy()


def write_packed_index(root: Path, doc: dict, i: int, index: np.ndarray) -> None:
    from cachebuild.format.index import compress_index, index_bytes

    (root / doc["shards"][i]["index"]).write_bytes(compress_index(index_bytes(index)))
    rehash(root, doc, i)


def loader_error(root: Path) -> str:
    """What the loader's own pass (records view, 0 workers: no header checks) says about ``root``."""
    from cachebuild.errors import ShardCorruptError
    from loaders import ShardStream

    with pytest.raises(ShardCorruptError) as info:
        for _ in ShardStream(root, view="records", batch_size=8, shuffle=False):
            pass
    return str(info.value)


def patch_tar(root: Path, doc: dict, at: int, data: bytes) -> None:
    tar = root / doc["shards"][0]["name"]
    b = bytearray(tar.read_bytes())
    b[at : at + len(data)] = data
    tar.write_bytes(bytes(b))
    rehash(root, doc, 0)
    save_doc(root, doc)


def with_checksum(header: bytes) -> bytes:
    h = bytearray(header)
    h[148:156] = b"        "
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)
