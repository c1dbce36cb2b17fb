"""One ``cachebuild stage`` at a time per destination: a blocking ``flock`` on the DST folder itself.

N training ranks that each run ``make ramdisk-stage`` at start-up used to
stage the same cache into the same folder at once: each deleted the others'
temporary files and manifest (one failed with a stray "No such file or
directory", and one that had already printed "pass to the loader" could have
its manifest removed under its loader). Now the first one copies; the others
wait here, then find the copy current and write nothing. The lock is on the
folder (no lock file: a staged copy holds only what staging made), and the
kernel drops it when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cachebuild.errors import OutputError

__all__ = ["human", "stage_lock"]


def human(n: float) -> str:
    """Bytes as a short decimal size (``2.47 GB``, ``310.5 MB``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def _lock(dst: Path) -> int:
    """Create ``dst`` if needed, and lock it; retry when it was removed while we waited for it."""
    for _ in range(100):
        dst.mkdir(parents=True, exist_ok=True)
        fd = os.open(dst, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another stage runs into dst
        try:
            if os.stat(dst).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder failed and removed the folder it had created: lock the new one
    raise OutputError(f"cannot lock {dst}: it keeps being removed")


@contextmanager
def stage_lock(dst: Path) -> Iterator[None]:
    """Hold ``dst`` (created, with its parents) for the ``with`` block; folders created here are removed again
    when the block fails and leaves them empty, so a refused stage leaves nothing behind."""
    created = [p for p in (dst, *dst.parents) if not p.exists()]  # deepest first
    fd = _lock(dst)
    try:
        yield
    except BaseException:
        for p in created:
            try:
                p.rmdir()
            except OSError:
                break
        raise
    finally:
        os.close(fd)
