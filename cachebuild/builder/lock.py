"""One builder at a time per output folder: an exclusive ``flock`` on a lock file inside it.

A second ``cachebuild generate``/``mel`` on the same ``--out`` is refused at
once with a message naming the holder (pid, host, start time) instead of the two
builds deleting each other's temporary files. The kernel drops a ``flock`` when
its holder dies, so a lock file left by a killed build is simply taken over; the
holder removes the file when it finishes. Remote outputs (``s3://``) are not
locked: object stores have no such lock (run one build per prefix).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cachebuild.errors import OutputError

__all__ = ["LOCK_NAME", "build_lock"]

LOCK_NAME = ".cachebuild-build.lock"


def _holder(fd: int) -> str:
    """Who holds the lock; the holder writes its record just after locking, so a
    refusal that lands in between waits up to ~0.5 s for it."""
    for _ in range(50):
        try:
            doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return f"pid {doc['pid']} on {doc['host']}, started {doc['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.01)
    return "another process"


def _acquire(folder: Path) -> int:
    """Open and lock ``folder/LOCK_NAME``; retry when the file was replaced while we waited for it."""
    path = folder / LOCK_NAME
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a link there (a stranger's cache) is never followed
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputError(f"{path} is a symbolic link, not cachebuild's build lock (a plain file it writes): delete it, then rerun") from exc
            raise OutputError(f"cannot create the build lock {path}: {exc.strerror}") from exc
        if os.fstat(fd).st_nlink > 1:  # a hard link to another file (the holder record is written into it)
            os.close(fd)
            raise OutputError(f"{path} is a hard link to another file, not cachebuild's build lock (a plain file it writes): delete it, then rerun")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            who = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{folder} is being built by another cachebuild ({who}); wait for it to finish, or stop it and rerun") from exc
            raise OutputError(f"cannot lock {path}: {exc.strerror}") from exc
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the previous holder removed it: lock the new file instead
    raise OutputError(f"cannot lock {path}: it keeps being replaced")


@contextmanager
def build_lock(folder: str | Path) -> Iterator[None]:
    """Hold the build lock of ``folder`` (created if needed) for the ``with`` block."""
    folder = Path(folder)
    fd = _acquire(folder)
    try:
        doc = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(doc).encode(), 0)
        except OSError:
            pass  # a full disk: the flock holds without its record (which only names the holder), so `prune` still frees space
        yield
    finally:
        try:
            os.unlink(folder / LOCK_NAME)  # while still holding it: a waiter re-checks the inode
        except OSError:
            pass
        os.close(fd)
