"""Build hostile caches from a good one: the attacker edits names, numbers and payloads and
recomputes every size and hash in the manifest, so only the format's own checks stand between
them and the reader. Used by ``test_hostile_cache.py``."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import zstandard

from cachebuild.format.index import INDEX_DTYPE, index_bytes
from cachebuild.format.tarball import END_OF_ARCHIVE, padding, tar_header

Edit = Callable[[Path, dict], None]


def copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def load_doc(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def save_doc(root: Path, doc: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(doc, indent=1))


def rehash(root: Path, doc: dict, i: int) -> None:
    """Make shard ``i``'s manifest entry match its files again (what an attacker would do)."""
    e = doc["shards"][i]
    tar, idx = (root / e["name"]).read_bytes(), (root / e["index"]).read_bytes()
    e.update(bytes=len(tar), sha256=hashlib.sha256(tar).hexdigest(), index_bytes=len(idx), index_sha256=hashlib.sha256(idx).hexdigest())


def read_index(root: Path, doc: dict, i: int) -> np.ndarray:
    return np.load(root / doc["shards"][i]["index"], allow_pickle=False)


def write_index(root: Path, doc: dict, i: int, index: np.ndarray) -> None:
    (root / doc["shards"][i]["index"]).write_bytes(index_bytes(index))
    rehash(root, doc, i)


def rewrite_shard(root: Path, doc: dict, i: int, payloads: dict[tuple[int, int], bytes]) -> np.ndarray:
    """Rebuild shard ``i``'s tar with some members' payloads replaced (same names), fix the index
    offsets and sizes (``nbytes`` kept: what the index claims the member decodes to)."""
    e = doc["shards"][i]
    tar = (root / e["name"]).read_bytes()
    index = read_index(root, doc, i)
    out, new = io.BytesIO(), index.copy()
    for r in range(index.shape[0]):
        for j in range(index.shape[1]):
            off, size = int(index[r, j]["offset"]), int(index[r, j]["size"])
            name = tar[off - 512 : off - 412].split(b"\0", 1)[0].decode()
            data = payloads.get((r, j), tar[off : off + size])
            out.write(tar_header(name, len(data)))
            new[r, j]["offset"], new[r, j]["size"] = out.tell(), len(data)
            out.write(data)
            out.write(padding(len(data)))
    out.write(END_OF_ARCHIVE)
    (root / e["name"]).write_bytes(out.getvalue())
    write_index(root, doc, i, new)
    return new


def zstd_bomb(decoded_bytes: int) -> bytes:
    """A small zstd frame that declares (and decodes to) ``decoded_bytes`` of spaces."""
    buf = io.BytesIO()
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=True)
    chunk = b" " * (1 << 20)
    with cctx.stream_writer(buf, size=decoded_bytes, closefd=False) as w:
        for _ in range(decoded_bytes // len(chunk)):
            w.write(chunk)
    return buf.getvalue()


def field_pos(doc: dict, name: str) -> int:
    return list(doc["fields"]).index(name)


assert INDEX_DTYPE.names[0] == "offset"
