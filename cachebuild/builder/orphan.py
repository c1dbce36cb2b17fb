"""A loky worker process whose build died exits, instead of finishing its shard and idling for minutes.

loky's workers do not watch the process that started them. After the build's
process was killed (``kill -9``, the OOM killer, a closed terminal's SIGHUP to
the build alone), each worker finished the shard it was writing, published it
into a folder whose build lock was gone (a rerun could be writing the same
shard), then waited for more work until loky's idle timeout (300 s), holding
its memory. The first shard job a worker runs starts :func:`exit_with_parent`:
a daemon thread that looks at the worker's parent every :data:`ORPHAN_CHECK_S`
and ends the process (``os._exit``) once it has changed (the worker was
re-parented to init or a subreaper). A shard being written then leaves only its
temporary file, as a killed build does: every file reaches its final name by an
atomic rename, a shard counts as built only once its done marker is written
(last), and the next build of the folder removes the temporary files.

Only for loky, whose workers are the build's own children: a Dask worker's
parent is its nanny (or a shell), a Ray worker's its raylet, and each has its
own rules for outliving them.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["ORPHAN_CHECK_S", "ORPHAN_EXIT_CODE", "exit_with_parent"]

ORPHAN_CHECK_S = 0.5
ORPHAN_EXIT_CODE = 70
"""The status an orphaned worker exits with (no one is left to read it)."""

_LOCK = threading.Lock()
_watching = False


def exit_with_parent() -> None:
    """Start, once per process, the thread that ends this process when its parent process has gone."""
    global _watching
    with _LOCK:
        if _watching:
            return
        _watching = True
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="cachebuild-orphan-check", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(ORPHAN_EXIT_CODE)
