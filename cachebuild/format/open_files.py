"""Room for a reader's open shards under the process's open-file limit.

Each open shard is a memory map, and Python's ``mmap`` keeps a file descriptor per map (a
duplicate of the file's, until 3.13's ``trackfd``). A reader keeps a local cache's shards
open for the epoch (``window="auto"`` shuffles a local cache whole, so every batch draws
from every shard), so a process needs about one descriptor per shard: a cache of more than
~1,000 shards passed the common soft limit of 1,024 (``ulimit -n``) with ``OSError: [Errno 24]
Too many open files`` in the middle of an epoch. :func:`with_file_room` raises the soft limit
to the hard one the first time a descriptor is refused (what an unprivileged process may do,
as Ray and Dask do at start), then names the limit in one line if even that is too few.
"""

from __future__ import annotations

import errno
from typing import Callable, TypeVar

from cachebuild.errors import CacheBuildError

__all__ = ["OpenFilesError", "with_file_room"]

T = TypeVar("T")


class OpenFilesError(CacheBuildError, OSError):
    """The process may not open another file, even at its hard limit."""


def _raise_soft_limit() -> bool:
    """Raise the soft open-file limit to the hard one; False when it already was (or cannot be)."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return False
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return False
    return True


def with_file_room(action: Callable[[], T], what: str, shards: int) -> T:
    """``action()`` (opening ``what``, one of ``shards`` shards a reader may keep open), again after
    raising the soft open-file limit if a descriptor was refused; one line naming the limit if the
    hard limit is reached too."""
    try:
        return action()
    except OSError as exc:
        if exc.errno != errno.EMFILE or isinstance(exc, CacheBuildError):
            raise
    if _raise_soft_limit():
        try:
            return action()
        except OSError as exc:
            if exc.errno != errno.EMFILE or isinstance(exc, CacheBuildError):
                raise
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    err = OpenFilesError(
        f"{what}: too many open files (this process may open {soft}, hard limit {hard}); a reader keeps one open per shard "
        f"it reads, and this cache has {shards}: raise the limit (ulimit -n), or rebuild with a larger --shard-mb"
    )
    err.errno = errno.EMFILE
    raise err from None
