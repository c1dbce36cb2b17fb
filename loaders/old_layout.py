"""Removing the remote cache's local folders of the old layout: one ``<cache_dir>/<16 hex>/`` per URL.

Until 2026-11-24 remote streaming kept each URL's fetched files in a folder of
its own, named after the URL (``sha256(url)[:16]``); now one folder,
``<cache_dir>/shards``, holds them all (:meth:`loaders.remote.RemoteOptions.resolved_cache_dir`),
and nothing reads or evicts the old folders any more: on the default
``cache_dir`` in ``/dev/shm`` they hold RAM for ever. When a fetcher opens its
local cache, :func:`sweep_old_layout` removes the old folders next to
``shards/`` that are certainly ours, once per process and ``cache_dir``, and
one :class:`OldLayoutWarning` says what it removed.

"Certainly ours" is what the old code wrote (read from its history), and
nothing else:

* the name is exactly 16 lowercase hex digits;
* a real folder (opened with ``O_NOFOLLOW``: a link is never followed, and
  everything below is done relative to that handle), owned by this user;
* holding only plain files of this user (no folder, no link), each named as
  the old code named them: ``.lock`` (empty: the old code only ``flock``-ed
  it), a fetched shard or index (``<16 hex>-<name>``, or ``<name>`` in the
  first layout, where ``<name>`` ends in ``.tar``, ``.idx.npy`` or
  ``.idx.npy.zst``), or a download's temp
  ``.part-<size>-<pid>-<thread>-<fetched name>`` of a process that is gone;
* idle: nothing in it changed or used for :data:`IDLE_S` (a process of the
  old version still streaming through it touches each file it looks up; it
  would fail on its next download if the folder vanished under it).

Anything else is left as it is, and nothing is said about it.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
import warnings
from pathlib import Path

__all__ = ["OldLayoutWarning", "sweep_old_layout", "IDLE_S"]

IDLE_S = 3600.0
"""An old folder is removed only when nothing in it changed or was used for this long (seconds)."""

_FOLDER = re.compile(r"[0-9a-f]{16}")
_FETCHED = re.compile(r"[^/]+\.(?:tar|idx\.npy|idx\.npy\.zst)")  # <16 hex>-<name> or <name>: a shard or an index
_PART = re.compile(r"\.part-\d+-(\d+)-\d+-(.+)")

_swept: set[str] = set()
_swept_lock = threading.Lock()


class OldLayoutWarning(UserWarning):
    """Local folders of the old per-URL layout were removed (said once per process and ``cache_dir``)."""


def sweep_old_layout(base: Path) -> list[str]:
    """Remove the old-layout folders in ``base`` (see the module docstring); the names removed.

    Runs once per process and ``base``; never raises (a folder that cannot be
    read or removed is left).
    """
    with _swept_lock:
        if str(base) in _swept:
            return []
        _swept.add(str(base))
    try:
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    removed, freed = [], 0
    try:
        for name in sorted(os.listdir(base_fd)):
            if _FOLDER.fullmatch(name) is not None:
                size = _remove_if_old(base_fd, name)
                if size is not None:
                    removed.append(name)
                    freed += size
    except OSError:
        pass
    finally:
        os.close(base_fd)
    if removed:
        warnings.warn(
            f"removed {len(removed)} local folder(s) of the old per-URL layout from {base} ({freed / 2**20:.1f} MiB): {', '.join(removed)}; fetched files now live in {base / 'shards'}",
            OldLayoutWarning,
            stacklevel=2,
        )
    return removed


def _remove_if_old(base_fd: int, name: str) -> int | None:
    """Remove folder ``name`` (in ``base_fd``) if it is an idle old-layout folder of ours; its bytes, else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=base_fd)
    except OSError:  # a link (ELOOP, ENOTDIR), a file, gone, unreadable
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            return None
        entries, latest = [], st.st_mtime
        for entry in os.listdir(fd):
            est = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(est.st_mode) or est.st_uid != os.getuid() or not _old_entry(entry, est.st_size):
                return None
            entries.append((entry, est.st_size))
            latest = max(latest, est.st_mtime)
        if time.time() - latest < IDLE_S:
            return None
        for entry, _ in entries:
            os.unlink(entry, dir_fd=fd)  # a file swapped for a link meanwhile: the link goes, not its target
        os.rmdir(name, dir_fd=base_fd)  # refused if anything appeared meanwhile, or the name is now a link
    except OSError:
        return None
    finally:
        os.close(fd)
    return sum(size for _, size in entries)


def _old_entry(entry: str, size: int) -> bool:
    """A file name (and size) the old code wrote into a per-URL folder; a download's temp only if its process is gone."""
    if entry == ".lock":
        return size == 0
    part = _PART.fullmatch(entry)
    if part is not None:
        return _FETCHED.fullmatch(part.group(2)) is not None and not _alive(int(part.group(1)))
    return _FETCHED.fullmatch(entry) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's, or not a pid we can ask about: kept
    return True
