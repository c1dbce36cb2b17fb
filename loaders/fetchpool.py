"""Threads for :class:`loaders.remote.ShardFetcher`'s downloads that never hold a process at exit."""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, TypeVar

from loaders.localcache import TMP_PREFIX as _TMP

__all__ = ["DaemonPool"]

T = TypeVar("T")


class DaemonPool:
    """Download threads that never hold the process at exit: ``ThreadPoolExecutor`` joins its threads
    (and runs its queued work) when the interpreter exits, so a trainer that stopped while prefetches
    stalled on a server waited for each to time out, minutes at the defaults. At exit (of the main
    process or of a DataLoader worker: ``threading``'s exit hooks run in both) queued work is
    cancelled and the temp files of downloads still running are removed; idle threads end with
    their pool."""

    def __init__(self, threads: int, name: str, folder: Path):
        self.folder = folder
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=_pool_worker, args=(self._queue,), name=f"{name}-{k}", daemon=True) for k in range(threads)]
        for t in self._threads:
            t.start()
        weakref.finalize(self, _stop_workers, self._queue, threads)
        _live_pools().add(self)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._queue.put((fut, fn))
        return fut

    def shutdown(self) -> None:
        """Cancel what has not started; running downloads finish (or time out) on their own."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        _stop_workers(self._queue, len(self._threads))

    def abandon(self) -> None:
        """At exit: :meth:`shutdown`, and remove the temp files of this pool's running downloads."""
        self.shutdown()
        for t in self._threads:
            for p in self.folder.glob(f"{_TMP}*-{os.getpid()}-{t.ident}-*"):
                p.unlink(missing_ok=True)


def _pool_worker(jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]) -> None:
    while (item := jobs.get()) is not None:
        fut, fn = item
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as exc:  # carried to the consumer by fut.result()
                fut.set_exception(exc)
        del item, fut, fn


def _stop_workers(jobs: queue.SimpleQueue[Any], threads: int) -> None:
    for _ in range(threads):
        jobs.put(None)


_POOLS: weakref.WeakSet[DaemonPool] | None = None


def _live_pools() -> weakref.WeakSet[DaemonPool]:
    """The pools of this process; the first call registers the exit hook (with ``threading``'s own,
    as ``concurrent.futures`` does: they run before a process's non-daemon threads are joined)."""
    global _POOLS
    if _POOLS is None:
        _POOLS = weakref.WeakSet()
        getattr(threading, "_register_atexit", atexit.register)(_abandon_pools)
    return _POOLS


def _abandon_pools() -> None:
    for pool in list(_POOLS or ()):
        pool.abandon()
