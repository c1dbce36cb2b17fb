"""Atomic file writes: temporary name in the same folder, fsync, rename."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from cachebuild.errors import OutputError

__all__ = ["atomic_write_bytes", "fsync_dir", "tmp_name", "is_tmp_name", "open_tmp", "output_error"]

_TMP_MARK = ".tmp-"


def tmp_name(final: Path) -> Path:
    """The temporary path a writer uses before renaming onto ``final``."""
    return final.with_name(f"{final.name}{_TMP_MARK}{os.getpid()}")


def is_tmp_name(path: Path) -> bool:
    """True for leftovers of an interrupted atomic write."""
    return _TMP_MARK in path.name


def open_tmp(path: Path, buffering: int = -1) -> BinaryIO:
    """Open the temporary file ``path`` for writing as a new plain file: whatever has its name (a leftover,
    or a link planted in a stranger's cache) is removed first, never followed."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "wb", buffering=buffering)


def fsync_dir(folder: Path) -> None:
    """Persist a rename by syncing its folder (best effort where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def output_error(path: Path, exc: OSError) -> OutputError:
    """Turn a low-level write failure into a message naming the path and the cause."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why = "disk full (no space left)" if exc.errno != errno.EFBIG else "file size limit reached"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "not writable"
    else:
        why = exc.strerror or str(exc)
    return OutputError(f"cannot write {path}: {why}")


def atomic_write_bytes(path: Path, data: bytes, sync: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    tmp = tmp_name(path)
    try:
        with open_tmp(tmp) as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise output_error(path, exc) from exc
    if sync:
        fsync_dir(path.parent)
