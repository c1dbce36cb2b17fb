"""The local side of a remote cache: a size-limited folder of complete, checked files
(:class:`LocalShardCache`), shared by every process of a node under one ``flock``.

A download reserves its size before it starts (its temp name ``.part-<size>-<pid>-...``
says how much and whose), so the folder never exceeds its limit, even with concurrent
downloads; least recently used complete files not in use by the caller are evicted to make
room. A file another process (or thread) of the node is downloading is waited for, not
downloaded twice (:meth:`LocalShardCache.claim`). A temp file whose process is gone (killed
mid-download) is removed on the next reservation. The folder must belong to the current user: its files are trusted as checked.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from cachebuild.errors import RemoteError
from cachebuild.format.atomic import open_tmp

__all__ = ["LocalShardCache", "TMP_PREFIX", "open_reserved"]

TMP_PREFIX = ".part-"
_TMP = TMP_PREFIX


class LocalShardCache:
    """A size-limited folder of complete files with LRU eviction, safe across processes."""

    def __init__(self, folder: Path, limit_bytes: int):
        self.folder = Path(folder)
        self.limit = int(limit_bytes)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            owner = self.folder.stat().st_uid
        except OSError as exc:
            raise RemoteError(f"local cache folder {self.folder}: cannot create it ({exc.strerror}); set RemoteOptions(cache_dir=...)") from exc
        if owner != os.getuid():
            raise RemoteError(
                f"local cache folder {self.folder}: owned by uid {owner}, not by this user (uid {os.getuid()}); its files would be "
                "trusted as checked downloads, so it is refused: set RemoteOptions(cache_dir=...) to a folder of your own"
            )
        self._lock_path = self.folder / ".lock"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a link there is never followed
        with os.fdopen(fd, "r+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _entries(self) -> list[tuple[Path, os.stat_result]]:
        out: list[tuple[Path, os.stat_result]] = []
        for p in self.folder.iterdir():
            if p.name == ".lock":
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((p, st))
        return out

    def used_bytes(self) -> int:
        """Bytes held now: complete files plus reservations of downloads in flight."""
        total = 0
        for p, st in self._entries():
            total += _reserved_size(p) if p.name.startswith(_TMP) else st.st_size
        return total

    def path(self, name: str) -> Path:
        return self.folder / name

    def lookup(self, name: str, size: int) -> Path | None:
        """The complete local copy of ``name`` (touched as recently used), or None. Only a plain file
        counts: what this folder holds under that name was renamed into place after its checks, a
        link planted there was not (it is replaced by the download)."""
        p = self.folder / name
        try:
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_size == size:
                os.utime(p)
                return p
        except FileNotFoundError:
            pass
        return None

    def check_fits(self, name: str, size: int) -> None:
        """Refuse a file that could never fit (a fault of the options or the manifest: not retried)."""
        if size > self.limit:
            raise RemoteError(f"file {self.folder / name} ({size} bytes) is larger than the local cache limit ({self.limit} bytes); raise cache_limit_bytes")

    def reserve(self, name: str, size: int, keep: set[str]) -> Path:
        """Make room for ``size`` bytes, evicting LRU files not in ``keep``; return a temp path."""
        self.check_fits(name, size)
        with self._locked():
            return self._reserve(name, size, keep, [(p, st) for p, st in self._entries() if not _stale_download(p)])

    def claim(self, name: str, size: int, keep: set[str]) -> Path | None:
        """:meth:`reserve`, or None when ``name`` is already here or another live download of it is
        in flight (another process or thread of this node): then :meth:`wait_for` it, not a second
        download of the same bytes (2 ranks x 2 workers downloaded each shard 2.8 times)."""
        self.check_fits(name, size)
        with self._locked():
            entries = [(p, st) for p, st in self._entries() if not _stale_download(p)]
            if any(p.name == name or (p.name.startswith(_TMP) and p.name.endswith(f"-{name}")) for p, _ in entries):
                return None
            return self._reserve(name, size, keep, entries)

    def wait_for(self, name: str, size: int, stall_s: float) -> Path | None:
        """The local copy of ``name`` once the download in flight lands, or None when there is none any
        more (it failed, or the file was evicted again) or it received nothing for ``stall_s``."""
        last, since = -1, time.monotonic()
        while True:
            hit = self.lookup(name, size)
            if hit is not None:
                return hit
            parts = [p for p in self.folder.glob(f"{_TMP}*-{name}") if not p.is_symlink() and _download_alive(p)]
            got = sum(_size_or_0(p) for p in parts)
            if not parts:
                return self.lookup(name, size)  # (renamed into place between the two looks)
            if got != last:
                last, since = got, time.monotonic()
            elif time.monotonic() - since > stall_s:
                return None
            time.sleep(0.02)

    def _reserve(self, name: str, size: int, keep: set[str], entries: list[tuple[Path, os.stat_result]]) -> Path:
        """Reserve with the folder's lock held (``entries``: its files, stale downloads removed)."""
        used = sum(_reserved_size(p) if p.name.startswith(_TMP) else st.st_size for p, st in entries)
        victims = sorted((st.st_mtime, p, st.st_size) for p, st in entries if not p.name.startswith(_TMP) and p.name not in keep)
        while used + size > self.limit and victims:
            _, p, sz = victims.pop(0)
            p.unlink(missing_ok=True)
            used -= sz
        if used + size > self.limit:
            raise RemoteError(f"local cache {self.folder} is full ({used} of {self.limit} bytes held by shards in use or downloads in flight); raise cache_limit_bytes")
        tmp = self.folder / f"{_TMP}{size}-{os.getpid()}-{threading.get_ident()}-{name}"
        open_tmp(tmp).close()  # a new plain file: a link planted at its name is removed, not followed
        return tmp

    def commit(self, tmp: Path, name: str) -> Path:
        """Rename a finished download into place, under the lock: a concurrent
        ``reserve`` listing the folder must see it under one of its two names."""
        final = self.folder / name
        with self._locked():
            os.replace(tmp, final)
        return final


def open_reserved(tmp: Path) -> BinaryIO:
    """The file :meth:`LocalShardCache.reserve` made, opened for the download's bytes: the same file, never
    removed and made again (for that moment other processes' reservations did not count it, and the folder
    went past its limit: 20.8 MB in a 20 MB folder under 2 ranks x 2 workers). A link is never followed; a
    reservation that is gone (its process was taken for dead) is an ``OSError``, retried as a download fault."""
    fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    return os.fdopen(fd, "wb")


def _stale_download(p: Path) -> bool:
    """Remove and report a temp file left by a download whose process is gone (killed: its
    ``finally`` never ran), so that its reservation does not hold the folder's room for ever.
    Its name says its process: ``.part-<size>-<pid>-...``. Called under the folder's lock."""
    if not p.name.startswith(_TMP):
        return False
    try:
        pid = int(p.name[len(_TMP) :].split("-")[1])
        os.kill(pid, 0)
        return False
    except PermissionError:  # alive, another user's
        return False
    except ProcessLookupError:
        p.unlink(missing_ok=True)
        return True
    except (ValueError, IndexError):  # not one of ours: counted at its size
        return False


def _download_alive(p: Path) -> bool:
    """Whether the process a temp name ``.part-<size>-<pid>-...`` names is alive (a killed download's file
    is not waited for; the next reservation removes it)."""
    try:
        os.kill(int(p.name[len(_TMP) :].split("-")[1]), 0)
    except PermissionError:
        return True
    except (ProcessLookupError, ValueError, IndexError):
        return False
    return True


def _size_or_0(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def _reserved_size(p: Path) -> int:
    """A download's reservation is encoded in its temp name: ``.part-<size>-...``."""
    try:
        return int(p.name[len(_TMP) :].split("-", 1)[0])
    except ValueError:
        return p.stat().st_size
