"""The shards of a cache as one process sees them: memory-mapped tars and their sidecar indexes.

Shards are opened lazily, on first use in the process that reads them
(each DataLoader worker has its own), and kept open. Opening checks what can
be checked cheaply: the tar's size against the manifest (a truncated shard is
reported with the first record that lies past its end), the index's size and
sha256 against the manifest, every index entry against the field schemas and
the tar's size (one vectorised pass, :mod:`cachebuild.format.index_check`),
and the tar member names of the first and last records against the record ids
the manifest implies (a swapped or misplaced shard). A listed file that is absent is a
:class:`ManifestError`; every other fault is a :class:`ShardCorruptError`
naming the file (and record, where one is at fault).

Where the files come from is a *locator*: :class:`LocalFiles` (a folder; the
files are used in place) or :class:`RemoteFiles` (``http(s)://``, ``s3://``,
any fsspec URL: each shard is fetched into a bounded local cache directory,
checksummed on arrival, by :class:`loaders.remote.ShardFetcher`).
"""

from __future__ import annotations

import hashlib
import mmap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TypeVar

import numpy as np

from cachebuild.errors import ManifestError, RemoteError, ShardCorruptError
from cachebuild.format.index import load_index
from cachebuild.format.index_check import check_index, check_member_keys
from cachebuild.format.manifest import Manifest, ShardEntry
from cachebuild.format.shard_writer import record_key
from loaders.remote import RemoteOptions, ShardFetcher, is_remote

__all__ = ["VERIFY_MODES", "ShardSet", "check_shard_files", "LocalFiles", "RemoteFiles", "is_remote", "local_path"]

T = TypeVar("T")

_EVICTED_ATTEMPTS = 5  # x the fetcher's own 3 (loaders.remote.ShardFetcher.open)

VERIFY_MODES = ("size", "crc")
"""What is checked on every read, beyond what every open checks (sizes, index sha256, the index
against the manifest and the tar, first and last member keys) and what zstd frames check
themselves (content checksum, declared size). ``crc`` (the default): every raw payload's crc32
too, so a flipped bit in a raw cache is an error, not silent wrong data; it costs ~18% of the
``graphs`` view's records/s on a raw causal cache and is within noise on mel caches (see
docs/DECISIONS.md). ``size``: skip that pass over the bytes (raw caches on trusted RAM)."""


def _truncation_message(entry: ShardEntry, path: Path, size: int, index: np.ndarray | None, first_record: int) -> str:
    msg = f"shard {path}: {size} bytes on disk, manifest says {entry.bytes} (truncated or replaced)"
    if index is not None and len(index):
        ends = (index["offset"] + index["size"]).max(axis=1)
        past = np.flatnonzero(ends > size)
        if past.size:
            msg += f"; record {record_key(first_record + int(past[0]))} and {past.size - 1} later records lie past the end"
    return msg


def local_path(location: str | Path) -> Path:
    """A local folder given as a path or a ``file://`` URL."""
    s = str(location)
    return Path(s[len("file://") :]) if s.startswith("file://") else Path(s)


class Locator(Protocol):
    """Where a cache's shard files are: local paths of shard ``s``'s (tar, index), fetched if needed."""

    @property
    def root(self) -> Path | str:
        """A local folder, or the URL of a remote cache (for messages)."""

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
        return opener(self.root / e.name, self.root / e.index)

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T:
        return reader(self.root / self.manifest.shards[s].index)

    def plan(self, shard_order: list[int]) -> None:
        pass

    def close(self) -> None:
        pass


class RemoteFiles:
    """Shards at a URL, fetched (ahead of use, in plan order) into a bounded local cache directory.

    Built in the process that reads (its fetcher's threads do not survive a fork).
    """

    remote = True

    def __init__(self, url: str, manifest: Manifest, options: RemoteOptions | None = None):
        self.root = str(url).rstrip("/")
        self.manifest = manifest
        self.fetcher = ShardFetcher(self.root, manifest, options or RemoteOptions())

    def open(self, s: int, opener: Callable[[Path, Path], T]) -> T:
        return self._evictable(s, lambda: self.fetcher.open(s, opener))

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T:
        """``reader(index)`` on shard ``s``'s index alone (fetched and checked, not its tar): what views' ``bind`` reads."""
        return self._evictable(s, lambda: reader(self.fetcher.fetch_index(s)))

    def _evictable(self, s: int, action: Callable[[], T]) -> T:
        """``action()``, again while another process sharing the local cache evicts the files between fetch and open."""
        for attempt in range(_EVICTED_ATTEMPTS):
            try:
                return action()
            except FileNotFoundError as exc:
                if attempt == _EVICTED_ATTEMPTS - 1:
                    cache = self.fetcher.cache
                    raise RemoteError(
                        f"{self.root}/{self.manifest.shards[s].name}: evicted from the local cache {cache.folder} before it could be "
                        f"opened, {_EVICTED_ATTEMPTS} times in a row; its limit ({cache.limit} bytes) is too small for the processes "
                        f"sharing it (allow at least processes x (prefetch + 1) x shard size)"
                    ) from exc
                time.sleep(0.02 * (attempt + 1))
        raise AssertionError("unreachable")

    def plan(self, shard_order: list[int]) -> None:
        self.fetcher.plan(shard_order)

    def close(self) -> None:
        self.fetcher.close()


def check_shard_files(manifest: Manifest, root: str | Path) -> None:
    """Fail early, in the calling process, if a listed shard or index is missing or of the wrong size.

    Remote caches are not checked here: every file is checked (size and sha256) on arrival.
    """
    if is_remote(root):
        return
    root = local_path(root)
    for entry in manifest.shards:
        for name in (entry.name, entry.index):
            if not (root / name).is_file():
                raise ManifestError(f"shard file {root / name} listed in {root / 'manifest.json'} is missing (incomplete copy? rerun the build or the staging)")
        size = (root / entry.name).stat().st_size
        if size != entry.bytes:
            try:
                index = load_index(root / entry.index)
            except (ShardCorruptError, OSError):
                index = None
            raise ShardCorruptError(_truncation_message(entry, root / entry.name, size, index, entry.first_record))


def _unmap(sh: "_Shard") -> None:
    try:
        sh.view.release()
        if sh.mm is not None:
            sh.mm.close()
    except BufferError:  # a view is still alive: the mapping goes with it
        pass


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

    def __init__(self, manifest: Manifest, root: str | Path, verify: str = "crc", locator: Locator | None = None):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.manifest = manifest
        self.locator = locator if locator is not None else LocalFiles(root, manifest)
        self.root = self.locator.root  # a Path, or the URL of a remote cache (for messages)
        self.verify = verify
        self.starts = manifest.shard_starts()
        self.field_pos = {f.name: j for j, f in enumerate(manifest.fields)}
        self.codec = manifest.codec.name
        self._open: dict[int, _Shard] = {}
        self._indexes: dict[int, np.ndarray] = {}  # indexes read without their shard (bind); dropped by close()
        self.meta_cache: dict[tuple[str, ...], Any] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"], state["_indexes"] = {}, {}
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

    def index(self, s: int) -> np.ndarray:
        """The index of shard ``s`` (verified), without opening (or fetching) its tar unless it is open."""
        sh = self._open.get(s)
        if sh is not None:
            return sh.index
        index = self._indexes.get(s)
        if index is None:
            entry = self.manifest.shards[s]
            index = self._indexes[s] = self.locator.open_index(s, lambda idx_path: self._load_index(entry, idx_path))
        return index

    def _load_index(self, entry: ShardEntry, idx_path: Path, tar_size: int | None = None) -> np.ndarray:
        """The shard's index, checked: size and sha256 against the manifest, then every entry
        against the field schemas (and the tar's size, when known) in one vectorised pass."""
        try:
            size = idx_path.stat().st_size
            if entry.index_bytes and size != entry.index_bytes:
                raise ShardCorruptError(f"index {idx_path}: {size} bytes, manifest says {entry.index_bytes} (truncated or replaced)")
            idx_bytes = idx_path.read_bytes()
        except FileNotFoundError as exc:
            raise ManifestError(f"index {idx_path} of shard {entry.name} (listed in the manifest) is missing") from exc
        if entry.index_sha256 and hashlib.sha256(idx_bytes).hexdigest() != entry.index_sha256:
            raise ShardCorruptError(f"index {idx_path}: checksum differs from the manifest's (corrupt or replaced)")
        index = load_index(idx_path, len(self.manifest.fields), entry.records)
        check_index(index, self.manifest.fields, self.codec, entry.records, entry.name, entry.first_record, tar_size)
        return index

    def _open_shard(self, s: int) -> _Shard:
        entry = self.manifest.shards[s]
        return self.locator.open(s, lambda path, idx_path: self._open_files(entry, path, idx_path))

    def _open_files(self, entry: ShardEntry, path: Path, idx_path: Path) -> _Shard:
        try:
            fh = open(path, "rb")
        except FileNotFoundError as exc:
            raise ManifestError(f"shard {path} (listed in the manifest) is missing") from exc
        with fh:
            size = fh.seek(0, 2)
            if size != entry.bytes:
                try:
                    index = load_index(idx_path)
                except (ShardCorruptError, OSError):
                    index = None
                raise ShardCorruptError(_truncation_message(entry, path, size, index, entry.first_record))
            index = self._load_index(entry, idx_path, size)
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        view = memoryview(mm) if mm is not None else memoryview(b"")
        if entry.records:  # cheap: a swapped or misplaced shard shows in its first and last keys
            try:
                check_member_keys(view, index, self.manifest.fields, self.codec, entry.name, entry.first_record, sorted({0, entry.records - 1}))
            except ShardCorruptError:
                _unmap(_Shard(entry, path, mm, view, index))
                raise
        return _Shard(entry, path, mm, view, index)

    def release(self, shards: Iterable[int] | None = None) -> None:
        """Close the mappings of ``shards`` (default: all open ones); they are reopened, or fetched again, if used later."""
        for s in list(self._open) if shards is None else shards:
            sh = self._open.pop(s, None)
            if sh is not None:
                _unmap(sh)

    def close(self) -> None:
        """Release every open mapping (views still alive keep theirs until they go) and the locator's threads."""
        for sh in self._open.values():
            _unmap(sh)
        self._open.clear()
        self._indexes.clear()
        self.locator.close()

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
