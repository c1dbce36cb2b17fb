"""The shards of a cache as one process sees them: memory-mapped tars and their sidecar indexes.

Shards are opened lazily, on first use in the process that reads them
(each DataLoader worker has its own), and kept open. Opening checks what can
be checked cheaply: the tar's size against the manifest (a truncated shard is
reported with the first record that lies past its end), the index's sha256
against the manifest, and its record count. A listed file that is absent is a
:class:`ManifestError`; every other fault is a :class:`ShardCorruptError`
naming the file (and record, where one is at fault).
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cachebuild.errors import ManifestError, ShardCorruptError
from cachebuild.format.index import load_index
from cachebuild.format.manifest import Manifest, ShardEntry
from cachebuild.format.shard_writer import record_key

__all__ = ["VERIFY_MODES", "ShardSet", "check_shard_files"]

VERIFY_MODES = ("size", "crc")
"""``size``: at open, a shard's byte size and its index checksum must match the
manifest (zstd frames always verify their own content checksum). ``crc``: also
check every raw payload's crc32 on each read (costs a pass over the bytes)."""


def _truncation_message(entry: ShardEntry, path: Path, size: int, index: np.ndarray | None, first_record: int) -> str:
    msg = f"shard {path}: {size} bytes on disk, manifest says {entry.bytes} (truncated or replaced)"
    if index is not None and len(index):
        ends = (index["offset"] + index["size"]).max(axis=1)
        past = np.flatnonzero(ends > size)
        if past.size:
            msg += f"; record {record_key(first_record + int(past[0]))} and {past.size - 1} later records lie past the end"
    return msg


def check_shard_files(manifest: Manifest, root: str | Path) -> None:
    """Fail early, in the calling process, if a listed shard or index is missing or of the wrong size."""
    root = Path(root)
    for entry in manifest.shards:
        for name in (entry.name, entry.index):
            if not (root / name).is_file():
                raise ManifestError(f"shard file {root / name} listed in {root / 'manifest.json'} is missing (incomplete copy? rerun the build or the staging)")
        size = (root / entry.name).stat().st_size
        if size != entry.bytes:
            try:
                index = load_index(root / entry.index)
            except ShardCorruptError:
                index = None
            raise ShardCorruptError(_truncation_message(entry, root / entry.name, size, index, entry.first_record))


@dataclass
class _Shard:
    """One open shard: its mmap (as bytes and as a numpy array) and its index."""

    entry: ShardEntry
    path: Path
    mm: mmap.mmap | None
    view: memoryview
    index: np.ndarray


class ShardSet:
    """The shards of one cache, opened lazily in the process that reads them and kept open.

    Not shared across processes: pickling drops the open files, and a copy
    inherited through ``fork`` reopens its own in the child.
    """

    def __init__(self, manifest: Manifest, root: str | Path, verify: str = "size"):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.manifest = manifest
        self.root = Path(root)
        self.verify = verify
        self.starts = manifest.shard_starts()
        self.field_pos = {f.name: j for j, f in enumerate(manifest.fields)}
        self.codec = manifest.codec.name
        self._open: dict[int, _Shard] = {}
        self.meta_cache: dict[tuple[str, ...], Any] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = {}
        return state

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard number, local record)`` of global record ids."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.starts[-1]):
            raise IndexError(f"record ids must be in [0, {int(self.starts[-1])}), got {int(ids.min())}..{int(ids.max())}")
        s = np.searchsorted(self.starts, ids, side="right") - 1
        return s, ids - self.starts[s]

    def shard(self, s: int) -> _Shard:
        """Shard ``s``, opened (mmap + index, sizes and index checksum verified) on first use."""
        sh = self._open.get(s)
        if sh is None:
            sh = self._open[s] = self._open_shard(s)
        return sh

    def _open_shard(self, s: int) -> _Shard:
        entry = self.manifest.shards[s]
        path, idx_path = self.root / entry.name, self.root / entry.index
        try:
            idx_bytes = idx_path.read_bytes()
        except FileNotFoundError as exc:
            raise ManifestError(f"index {idx_path} of shard {entry.name} (listed in the manifest) is missing") from exc
        if entry.index_sha256 and hashlib.sha256(idx_bytes).hexdigest() != entry.index_sha256:
            raise ShardCorruptError(f"index {idx_path}: checksum differs from the manifest's (corrupt or replaced)")
        index = load_index(idx_path, len(self.manifest.fields))
        if len(index) != entry.records:
            raise ShardCorruptError(f"index {idx_path}: {len(index)} records, manifest says {entry.records}")
        try:
            fh = open(path, "rb")
        except FileNotFoundError as exc:
            raise ManifestError(f"shard {path} (listed in the manifest) is missing") from exc
        with fh:
            size = fh.seek(0, 2)
            if size != entry.bytes:
                raise ShardCorruptError(_truncation_message(entry, path, size, index, entry.first_record))
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        view = memoryview(mm) if mm is not None else memoryview(b"")
        return _Shard(entry, path, mm, view, index)

    def close(self) -> None:
        """Release every open mapping (views still alive keep theirs until they go)."""
        for sh in self._open.values():
            try:
                sh.view.release()
                if sh.mm is not None:
                    sh.mm.close()
            except BufferError:
                pass
        self._open.clear()

    def field_shapes(self, name: str) -> np.ndarray:
        """Shape of field ``name`` for every record of the cache, int64 ``[records, ndim]`` (index only)."""
        j = self.field_pos[name]
        ndim = self.manifest.fields[j].ndim
        parts = [self.shard(s).index[:, j]["shape"][:, :ndim] for s in range(len(self.manifest.shards))]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, ndim), np.int64)

    def where(self, record: int, field_name: str) -> str:
        """``shard X, record K, field 'f'`` for error messages."""
        s, _ = self.locate(np.array([record]))
        return f"shard {self.manifest.shards[int(s[0])].name}, record {record_key(record)}, field '{field_name}'"
