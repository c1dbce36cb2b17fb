"""A pause before DataLoader workers are forked inside a DDP rank, on Pythons whose ``fork()`` can hang there.

CPython up to 3.11 (python/cpython#112275, fixed in 3.12) can leave a forked
child waiting for ever inside ``fork()`` itself: when another thread of the
parent is creating or deleting its Python thread state at that instant, the
child inherits the interpreter's list lock held and waits on it in
``PyOS_AfterFork_Child``. In a DDP rank those threads are gloo's (or NCCL's):
they take and drop a thread state while finishing a collective, and a pass
starts with one (the cache generation, :mod:`loaders.generations`) right
before the DataLoader forks its workers. Measured here: about 1 fork in 1,000
hung right after a collective (docs/DECISIONS.md, "the DDP hang").

The fix is not ours to make, but its window is: the threads finish their
bookkeeping within microseconds of the collective, so a pass that is about to
fork workers in an initialised process group waits :data:`SETTLE_S` first.
Nothing else changes (the same workers, the same batches); no wait where the
workers are already running (persistent workers after the first pass), where
they are not forked (``spawn``, ``forkserver``), outside DDP or on 3.12+.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from typing import Any

__all__ = ["SETTLE_S", "fork_race_exposed", "settle_before_fork"]

SETTLE_S = 0.05
"""Seconds a pass waits before forking its workers in a DDP rank on an affected Python."""


def fork_race_exposed(multiprocessing_context: Any, version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether workers started with ``multiprocessing_context`` (None: the process's default) are forked,
    in an initialised ``torch.distributed`` process group, on a Python with the fork hang."""
    if version >= (3, 12):
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    ctx = multiprocessing_context
    if ctx is None:
        method = mp.get_start_method(allow_none=True) or mp.get_context().get_start_method()
    elif isinstance(ctx, str):
        method = ctx
    else:
        method = ctx.get_start_method()
    return method == "fork"


def settle_before_fork(loader: Any) -> None:
    """Before a pass of ``loader`` (a DataLoader) starts: wait :data:`SETTLE_S` if it is about to fork
    workers where the fork can hang (see the module docstring)."""
    if loader.num_workers <= 0:
        return
    if loader.persistent_workers and getattr(loader, "_iterator", None) is not None:
        return  # its workers are running: nothing is forked
    if fork_race_exposed(loader.multiprocessing_context):
        time.sleep(SETTLE_S)
