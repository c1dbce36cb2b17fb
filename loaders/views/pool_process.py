"""A pooled ``records`` store's pools decoded by a process of its own, into shared memory.

In the trainer's process a :class:`loaders.views.store.RecordStore` decodes the
next pool in a thread (:mod:`loaders.views.pool_ahead`) while batches read the
current one. zstd releases the GIL, but the rest of a pool's decode (planning
the frames, laying the records out, ~1/3 of its time) takes it, from the thread
that builds the batches. Where the trainer asked for workers (a pass planned in
its process, :mod:`loaders.planned`), the store's regions live in shared memory
instead (:class:`Regions`) and one forked process decodes into them: the decode thread only sends
a request and waits on the pipe. The batches do not change (the same records
decoded into the same rows by the same code), nor does anything about the order
of decodes (:mod:`loaders.views.pool_ahead` still waits for one before the next).

The process is started once per store (forked where the platform can, as
DataLoader workers are), ignores Ctrl-C (the trainer decides, as our workers
do), gets the shard set with a request only when it changed, and ends with
:meth:`PoolProcess.close` (the loader shut down, the store dropped and garbage
collected, the trainer's exit) or within a second of the trainer's process
being killed; the regions' memory (``memfd_create``) goes with the last process
mapping it, whatever ends them. A decode that raises
is raised to the batch that needs its pool, in the reader's one line; a process
that died (killed) is replaced by decoding in this process, with a warning.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import uuid
import warnings
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Callable

import numpy as np

from cachebuild.format.malloc import tune_malloc
from cachebuild.format.reader import ShardSet

__all__ = ["PoolProcess", "Regions", "shared_room", "next_request"]

_Spec = dict[str, tuple[tuple[int, ...], str, int]]  # field -> (shape with rows, dtype, byte offset)
Decode = Callable[[ShardSet, np.ndarray, dict[str, np.ndarray], np.ndarray], None]


class Regions:
    """A store's region arrays in one anonymous shared-memory file (``memfd_create``: ``arrays``; ``fd`` and
    ``spec`` to map them elsewhere, ``name`` to tell them apart). Nothing is left behind whatever ends the
    processes (``os._exit``, a kill): the memory goes with the last descriptor and mapping. (Neither a file in
    ``/dev/shm``, which an ``os._exit`` leaves, nor :class:`multiprocessing.shared_memory.SharedMemory`, whose
    resource tracker is one more process and warns of segments another process attached.)"""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], str]], rows: int):
        self.spec: _Spec = {}
        off = 0
        for k, (shape, dtype) in fields.items():
            full = (rows,) + tuple(shape)
            self.spec[k] = (full, dtype, off)
            off += -(-int(np.prod(full, dtype=np.int64)) * np.dtype(dtype).itemsize // 64) * 64
        self.nbytes = max(off, 1)
        self.name = uuid.uuid4().hex
        self.fd = os.memfd_create("cachebuild-pool", os.MFD_CLOEXEC)
        self._free = weakref.finalize(self, os.close, self.fd)
        os.ftruncate(self.fd, self.nbytes)
        self.arrays = _arrays(_map(self.fd, self.nbytes), self.spec)

    def close(self) -> None:
        self.arrays = {}  # (the mapping goes with the last array viewing it)
        self._free()


def shared_room(nbytes: int, share: float = 0.5) -> bool:
    """Whether this platform has ``memfd_create`` and ``nbytes`` is within ``share`` of the available memory (else
    the store keeps private regions, decoded in this process)."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return False
    return nbytes <= share * free


def _map(fd: int, nbytes: int) -> np.ndarray:
    with os.fdopen(os.dup(fd), "r+b") as f:
        return np.memmap(f, np.uint8, "r+", shape=(nbytes,))


def _arrays(buf: Any, spec: _Spec) -> dict[str, np.ndarray]:
    return {k: np.ndarray(shape, dtype, buffer=buf, offset=off) for k, (shape, dtype, off) in spec.items()}


def next_request(conn: Connection, parent: int) -> tuple[Any, bool]:
    """A decode process's next request from the trainer: ``(request, False)``; ``(None, False)`` once told to
    stop or the pipe is closed; ``(None, True)`` once the trainer's process ``parent`` has ended (killed: its
    pipe may stay open in processes forked from it since, so that is checked every second)."""
    while not conn.poll(1.0):
        if os.getppid() != parent:
            return None, True
    try:
        return conn.recv(), False
    except EOFError:
        return None, False


def _serve(conn: Connection, decode: Decode, parent: int) -> None:
    """The decode process: requests ``(name, nbytes, spec, with_fd, shards or None, ids, dest)`` (the regions'
    descriptor sent after it where ``with_fd``) until ``None``, a closed pipe, or the end of the trainer's process
    ``parent`` (checked every second)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tune_malloc()
    attached: dict[str, dict[str, np.ndarray]] = {}
    shards: ShardSet | None = None
    while True:
        msg, _ = next_request(conn, parent)
        if msg is None:
            return
        name, nbytes, spec, with_fd, new, ids, dest = msg
        shards = new if new is not None else shards
        try:
            if with_fd:
                fd = recv_handle(conn)
                attached.clear()  # (one set of regions at a time: the store's current ones)
                try:
                    attached[name] = _arrays(_map(fd, nbytes), spec)
                finally:
                    os.close(fd)
            decode(shards, ids, attached[name], dest)  # type: ignore[arg-type]
            conn.send(None)
        except Exception as exc:  # to the trainer, as raised
            conn.send(exc)


class PoolProcess:
    """Decodes a store's records into its :class:`Regions` in a process of its own (module docstring)."""

    def __init__(self, decode: Decode):
        self.decode = decode  # (the view's, run in the process; in this one where the process is gone)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, decode, os.getpid()), name="cachebuild-pool-decode", daemon=True)
        self._proc.start()
        child.close()
        self._lock = threading.Lock()  # one request at a time (the store's decodes already are)
        self._unread = 0  # replies not read yet (a wait interrupted): read before the next request
        self._shards: ShardSet | None = None
        self._mapped = ""  # the regions the process has mapped
        self.dead = False
        self.owner = os.getpid()
        self._stop = weakref.finalize(self, _stop, self._conn, self._proc, self.owner)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def __call__(self, shards: ShardSet, ids: np.ndarray, regions: Regions, dest: np.ndarray) -> None:
        """Decode records ``ids`` into rows ``dest`` of ``regions``, in the process; return when done."""
        with self._lock:
            if not self.dead and os.getpid() == self.owner:
                try:
                    return self._request(shards, ids, regions, dest)
                except (EOFError, OSError, BrokenPipeError):
                    self.dead = True
                    warnings.warn(
                        f"cachebuild: the pool decode process (pid {self._proc.pid}) ended (exit code {self._proc.exitcode}); decoding in this process from now on", RuntimeWarning, stacklevel=2
                    )
        self.decode(shards, ids, regions.arrays, dest)

    def _request(self, shards: ShardSet, ids: np.ndarray, regions: Regions, dest: np.ndarray) -> None:
        while self._unread:
            self._conn.recv()
            self._unread -= 1
        new = shards if shards is not self._shards else None
        with_fd = regions.name != self._mapped
        try:
            self._conn.send((regions.name, regions.nbytes, regions.spec, with_fd, new, ids, dest))
            if with_fd:
                send_handle(self._conn, regions.fd, self._proc.pid)
        except BaseException:  # (a Ctrl-C between the two: the pipe is out of step, so the process is given up)
            self.dead = True
            raise
        self._shards, self._mapped = shards, regions.name
        self._unread += 1
        error = self._conn.recv()
        self._unread -= 1
        if error is not None:
            raise error

    def close(self) -> None:
        """End the process (after the request in flight, if any: bounded waits)."""
        self.dead = True
        held = self._lock.acquire(timeout=5.0)  # (a request's bytes and the stop's never interleave on the pipe)
        try:
            self._stop()
        finally:
            if held:
                self._lock.release()


def _stop(conn: Connection, proc: Any, owner: int) -> None:
    """End the decode process ``proc`` of process ``owner``. In a forked child (a DataLoader worker, another
    store's decode process, a user's fork) that drops its copy of the store, only that copy's pipe end is
    closed: the stop message would end the trainer's process, and only its parent may join it."""
    if os.getpid() != owner:
        conn.close()
        return
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    proc.join(timeout=2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=2.0)
    conn.close()
