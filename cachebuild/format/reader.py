"""The one reader of the shard format: open and check a shard once, keep the open shards of a cache.

Every reader (the loader, ``verify``, ``inspect``, ``stage``) opens shards
here, through :class:`ShardSet`, and decodes them with
:func:`cachebuild.format.decode.read_block` (whole records:
:mod:`cachebuild.format.records`). Opening checks what can be checked cheaply:
the tar's size against the manifest (a truncated shard is reported with the
first record that lies past its end), the index's size and sha256 against the
manifest, every index entry against the field schemas and the tar's size (one
vectorised pass, :func:`cachebuild.format.index_check.check_index`), and the tar
member names of the first and last records against the record ids the manifest
implies (a swapped or misplaced shard). A listed file that is absent is a
:class:`ManifestError`; every other fault is a :class:`ShardCorruptError`
naming the file (and record, where one is at fault).

Where the files come from is a *locator*: :class:`LocalFiles` (a folder; the
files are used in place) here, or the loader's ``loaders.shards.RemoteFiles``
(any URL: each shard is fetched into a bounded local cache directory first).
Shards are opened lazily, on first use in the process that reads them (each
DataLoader worker has its own), and kept open until released.
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TypeVar

import numpy as np

from cachebuild.errors import ManifestError, ShardCorruptError
from cachebuild.format.index import load_index
from cachebuild.format.index_check import check_index, check_member_keys
from cachebuild.format.open_files import with_file_room
from cachebuild.format.packing import tar_order
from cachebuild.format.shared_frames import FrameLayout, coincides, frame_layout
from cachebuild.format.manifest import Manifest, ShardEntry, confined_file, read_manifest
from cachebuild.format.names import JSON_DTYPE, record_key

__all__ = ["VERIFY_MODES", "LocalFiles", "Locator", "OpenShard", "ShardSet", "check_shard_files", "confined_file", "local_path", "open_cache"]

T = TypeVar("T")

VERIFY_MODES = ("size", "crc")
"""What is checked on every read, beyond what every open checks (sizes, index sha256, the index
against the manifest and the tar, first and last member keys) and what zstd frames check
themselves (content checksum, declared size). ``crc`` (the default): every raw payload's crc32
too, so a flipped bit in a raw cache is an error, not silent wrong data; it costs ~18% of the
``graphs`` view's records/s on a raw causal cache and is within noise on mel caches (see
docs/DECISIONS.md). ``size``: skip that pass over the bytes (raw caches on trusted RAM)."""


def local_path(location: str | Path) -> Path:
    """A local folder given as a path or a ``file://`` URL."""
    s = str(location)
    return Path(s[len("file://") :]) if s.startswith("file://") else Path(s)


class Locator(Protocol):
    """Where a cache's shard files are: local paths of shard ``s``'s (tar, index), fetched if needed."""

    @property
    def root(self) -> Path | str: ...

    def open(self, s: int, opener: Callable[[Path, Path], T]) -> T: ...

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T: ...

    def plan(self, shard_order: list[int]) -> None: ...

    def close(self) -> None: ...


class LocalFiles:
    """Shards in a local folder: used in place."""

    remote = False

    def __init__(self, root: str | Path, manifest: Manifest):
        self.root = local_path(root)
        self.manifest = manifest

    def open(self, s: int, opener: Callable[[Path, Path], T]) -> T:
        e = self.manifest.shards[s]
        return opener(confined_file(self.root, e.name), confined_file(self.root, e.index))

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T:
        return reader(confined_file(self.root, self.manifest.shards[s].index))

    def plan(self, shard_order: list[int]) -> None:
        pass

    def close(self) -> None:
        pass


def _truncation_message(entry: ShardEntry, n_fields: int, path: Path, size: int, idx_path: Path) -> str:
    """The truncated-shard error, naming the first record that lies past the end when the index says
    (the index read bounded by the entry's records x ``n_fields``, like every index read)."""
    msg = f"shard {path}: {size} bytes on disk, manifest says {entry.bytes} (truncated or replaced)"
    try:
        index = load_index(idx_path, n_fields, entry.records)
    except (ShardCorruptError, OSError):
        return msg
    if len(index):
        ends = index["offset"] + index["size"]
        past = np.flatnonzero(ends.max(axis=1) > size)
        if past.size:
            order = tar_order(index.shape[0], index.shape[1], entry.pack)
            cut = int(order[np.argmax(ends.reshape(-1)[order] > size)]) // index.shape[1]  # the record whose entry the end cuts (first in tar order)
            msg += f"; record {record_key(entry.first_record + cut)} and {past.size - 1} other records lie past the end"
    return msg


def check_shard_files(manifest: Manifest, root: str | Path) -> None:
    """Fail early, in the calling process, if a listed shard or index of a local cache is missing
    or a shard is of the wrong size (a remote cache's files are checked on arrival instead)."""
    root = local_path(root)
    for entry in manifest.shards:
        for name in (entry.name, entry.index):
            if not confined_file(root, name).is_file():
                raise ManifestError(f"shard file {root / name} listed in {root / 'manifest.json'} is missing (incomplete copy? rerun the build or the staging)")
        size = (root / entry.name).stat().st_size
        if size != entry.bytes:
            raise ShardCorruptError(_truncation_message(entry, len(manifest.fields), root / entry.name, size, root / entry.index))


def load_checked_index(manifest: Manifest, entry: ShardEntry, idx_path: Path, tar_size: int | None = None, share: int | None = None) -> np.ndarray:
    """Shard ``entry``'s index, checked: size and sha256 against the manifest, then every entry
    against the field schemas (and the tar's size, when known) in one vectorised pass. ``share``: the
    ``codec.share`` of the shard's own cache (default the manifest's; a mixture's caches may differ)."""
    try:
        size = idx_path.stat().st_size
        if entry.index_bytes and size != entry.index_bytes:
            raise ShardCorruptError(f"index {idx_path}: {size} bytes, manifest says {entry.index_bytes} (truncated or replaced)")
        idx_bytes = idx_path.read_bytes()
    except FileNotFoundError as exc:
        raise ManifestError(f"index {idx_path} of shard {entry.name} (listed in the manifest) is missing") from exc
    if entry.index_sha256 and hashlib.sha256(idx_bytes).hexdigest() != entry.index_sha256:
        raise ShardCorruptError(f"index {idx_path}: checksum differs from the manifest's (corrupt or replaced)")
    index = load_index(idx_path, len(manifest.fields), entry.records)
    share = (manifest.codec.share or 0) if share is None else share
    try:
        check_index(index, manifest.fields, manifest.codec.name, entry.records, entry.name, entry.first_record, tar_size, entry.pack, share)
    except ShardCorruptError as exc:
        if "out of order" not in str(exc):
            raise
        if not share and coincides(index, entry.pack).any():  # entries that share zstd frames, read as a cache whose entries do not
            raise ShardCorruptError(f"{exc}; or the manifest's codec.share (0 or absent) is not the cache's: its entries share zstd frames (format v4)") from exc
        # entries that do not follow each other are also what a wrong `pack` in the manifest reads as
        pos = next((i for i, e in enumerate(manifest.shards) if e.name == entry.name), "?")
        raise ShardCorruptError(f"{exc}; or the manifest's shards[{pos}].pack = {entry.pack} is not the shard's") from exc
    return index


@dataclass
class OpenShard:
    """One open shard: its tar memory-mapped (``view``, zero-copy) and its checked index."""

    entry: ShardEntry
    path: Path
    mm: mmap.mmap | None
    view: memoryview
    index: np.ndarray

    def unmap(self) -> None:
        """Release the mapping (numpy views still alive keep it until they go)."""
        try:
            self.view.release()
            if self.mm is not None:
                self.mm.close()
        except BufferError:  # a view is still alive: the mapping goes with it
            pass

    def __enter__(self) -> OpenShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmap()


def open_shard(manifest: Manifest, entry: ShardEntry, path: Path, idx_path: Path, share: int | None = None) -> OpenShard:
    """Open shard ``entry`` (tar ``path``, index ``idx_path``) with every open-time check (module docstring);
    ``share`` as in :func:`load_checked_index`."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError as exc:
        raise ManifestError(f"shard {path} (listed in the manifest) is missing") from exc
    with fh:
        size = fh.seek(0, 2)
        if size != entry.bytes:
            raise ShardCorruptError(_truncation_message(entry, len(manifest.fields), path, size, idx_path))
        index = load_checked_index(manifest, entry, idx_path, size, share)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    sh = OpenShard(entry, path, mm, memoryview(mm) if mm is not None else memoryview(b""), index)
    if entry.records:  # cheap: a swapped or misplaced shard shows in its first and last keys
        try:
            check_member_keys(sh.view, index, manifest.fields, manifest.codec.name, entry.name, entry.first_record, sorted({0, entry.records - 1}), entry.pack)
        except ShardCorruptError:
            sh.unmap()
            raise
    return sh


class ShardSet:
    """The shards of one cache, opened lazily in the process that reads them and kept open.

    ``verify`` is one of :data:`VERIFY_MODES`. Not shared across processes:
    pickling drops the open files, and a copy inherited through ``fork``
    reopens its own in the child.
    """

    def __init__(self, manifest: Manifest, root: str | Path, verify: str = "crc", locator: Locator | None = None):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.manifest = manifest
        self.locator: Locator = locator if locator is not None else LocalFiles(root, manifest)
        self.root = self.locator.root  # a Path, or the URL of a remote cache (for messages)
        self.verify = verify
        self.starts = manifest.shard_starts()
        self.packs = np.array([e.pack for e in manifest.shards], np.int64)  # records per tar member, per shard
        self.field_pos = {f.name: j for j, f in enumerate(manifest.fields)}
        self.codec = manifest.codec.name
        self._open: dict[int, OpenShard] = {}
        self._indexes: dict[int, np.ndarray] = {}  # indexes read without their shard (bind); dropped by close()
        self.opens = np.zeros(len(manifest.shards), np.int64)  # per shard: times opened or closed (the decoder refills its entries when it moves)
        self.meta_cache: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]] = {}  # decode's per-field metadata

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"], state["_indexes"] = {}, {}
        state.pop("_entry_tables", None)  # (the decoder's, cachebuild.format.entries: rebuilt where used)
        return state

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard number, local record)`` of global record ids."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.starts[-1]):
            raise IndexError(f"record ids must be in [0, {int(self.starts[-1])}), got {int(ids.min())}..{int(ids.max())}")
        s = np.searchsorted(self.starts, ids, side="right") - 1
        return s, ids - self.starts[s]

    def shard(self, s: int) -> OpenShard:
        """Shard ``s``, opened (and checked, see :func:`open_shard`) on first use."""
        sh = self._open.get(s)
        if sh is None:
            entry = self.manifest.shards[s]
            opener = lambda: self.locator.open(s, lambda path, idx_path: open_shard(self.manifest, entry, path, idx_path, self.share(s)))  # noqa: E731
            sh = self._open[s] = with_file_room(opener, f"{self.root}/{entry.name}", len(self.manifest.shards))
            self.opens[s] += 1
        return sh

    def share(self, s: int) -> int:
        """The ``codec.share`` shard ``s``'s index is checked against: the manifest's (a mixture's
        union, whose caches may differ, gives each shard its own cache's)."""
        return self.manifest.codec.share or 0

    def layout(self, s: int) -> FrameLayout:
        """Shard ``s``'s frame layout (which entries share a zstd frame, where each record's data ends in
        it: :mod:`cachebuild.format.shared_frames`), computed from its index once per open shard."""
        sh = self.shard(s)
        layout: FrameLayout | None = sh.__dict__.get("_frame_layout")
        if layout is None:
            is_json = np.array([f.dtype == JSON_DTYPE for f in self.manifest.fields], bool)
            layout = sh.__dict__["_frame_layout"] = frame_layout(sh.index, is_json, sh.entry.pack)
        return layout

    def index(self, s: int) -> np.ndarray:
        """The index of shard ``s`` (checked), without opening (or fetching) its tar unless it is open."""
        sh = self._open.get(s)
        if sh is not None:
            return sh.index
        index = self._indexes.get(s)
        if index is None:
            entry = self.manifest.shards[s]
            reader = lambda: self.locator.open_index(s, lambda idx_path: load_checked_index(self.manifest, entry, idx_path, share=self.share(s)))  # noqa: E731
            index = self._indexes[s] = with_file_room(reader, f"{self.root}/{entry.index}", len(self.manifest.shards))
        return index

    def release(self, shards: Iterable[int] | None = None) -> None:
        """Close the mappings of ``shards`` (default: all open ones); they are reopened, or fetched again, if used later."""
        for s in list(self._open) if shards is None else shards:
            sh = self._open.pop(s, None)
            if sh is not None:
                self.opens[s] += 1
                sh.unmap()
                for table in self.__dict__.get("_entry_tables", {}).values():
                    table.forget(s)  # (the decoder's entries of this shard, cachebuild.format.entries)

    def close(self) -> None:
        """Release every open mapping (views still alive keep theirs until they go) and the locator's threads."""
        self.release()
        self._indexes.clear()
        self.locator.close()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def field_shapes(self, name: str) -> np.ndarray:
        """Shape of field ``name`` for every record of the cache, int64 ``[records, ndim]`` (index only)."""
        j = self.field_pos[name]
        ndim = self.manifest.fields[j].ndim
        parts = [self.index(s)[:, j]["shape"][:, :ndim] for s in range(len(self.manifest.shards))]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, ndim), np.int64)

    def where(self, record: int, field_name: str) -> str:
        """``shard X, record K, field 'f'`` for error messages."""
        s, _ = self.locate(np.array([record]))
        return f"shard {self.manifest.shards[int(s[0])].name}, record {record_key(record)}, field '{field_name}'"


def open_cache(root: str | Path, verify: str = "crc") -> ShardSet:
    """The shards of the local cache at ``root`` (its manifest read and checked; shards open on use)."""
    return ShardSet(read_manifest(local_path(root)), local_path(root), verify)
