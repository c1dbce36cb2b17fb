"""Where a :class:`loaders.TwinsContext` decodes its pools: a thread of the trainer's process, or a process of its own.

Both decode one pool at a time into rows of the context's host regions and
hand back a handle whose ``result()`` waits for it (raising the decode's error,
a one-line :class:`~cachebuild.errors.CacheBuildError` as the reader raised it).

* :class:`ThreadDecoder`: one background thread (zstd releases the GIL; the
  rest of a decode, its planning and copies, shares the GIL with the trainer's
  loop). Regions are ordinary (or pinned) host memory.
* :class:`ProcessDecoder`: one process or more (``processes``; forked where the platform can, as
  DataLoader workers are; started once) decoding into regions in shared memory, so no GIL is shared: on
  a trainer whose loop keeps the GIL busy, the decode runs beside it; with several, each decodes its own
  contiguous share of every pool's graphs. A
  process gets the shard set with a request only when it changed (another
  generation); they end with the context (``close``, or the context dropped
  and garbage collected), at the trainer's exit (an exception, Ctrl-C), or
  within a second of the trainer's process being killed; their ``/dev/shm``
  segment goes with them in each case.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Protocol

import numpy as np

from cachebuild.errors import SharedMemoryError
from cachebuild.format.malloc import settle_heap, tune_malloc
from cachebuild.format.reader import ShardSet
from loaders.loader import shm_free_bytes
from loaders.views.pool_process import next_request
from loaders.views.twins import decode_twins

__all__ = ["Pending", "ThreadDecoder", "ProcessDecoder", "decode_rows", "DECODERS"]

DECODERS = ("thread", "process")
_Spec = dict[str, tuple[tuple[int, ...], str, int]]  # field -> (shape with rows, dtype, byte offset)


class Pending(Protocol):
    """A pool being decoded: ``result()`` waits for it (and raises its error)."""

    def result(self) -> Any: ...

    def done(self) -> bool: ...


def decode_rows(shards: ShardSet, ids: np.ndarray, decode: list[str], threads: int, host: dict[str, np.ndarray], lo: int, zero: list[str], copied: Any = None) -> None:
    """Decode the graphs ``ids`` (one pool) into rows ``lo, lo+1, ...`` of ``host`` (its padded fields ``zero``
    cleared of what the rows' last graphs left: :mod:`loaders.views.twins_regions`), with their record ids; after
    ``copied`` (the CUDA copy of those rows before), if any. One block read for the pool (zstd itself is called
    per 4 MiB of output: ``zstd_output.CHUNK_BYTES``)."""
    if copied is not None:
        copied.synchronize()
    hi = lo + len(ids)
    decode_twins(shards, ids, decode, threads, host, np.arange(lo, hi, dtype=np.int64), zero)
    host["record_id"][lo:hi] = ids


class ThreadDecoder:
    """Decodes on one thread of this process into ``host`` (arrays the caller owns)."""

    def __init__(self, host: dict[str, np.ndarray], decode: list[str], threads: int):
        self.host, self.decode, self.threads = host, decode, threads
        settle_heap()  # the trainer's process
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="twins-context")

    def submit(self, shards: ShardSet, ids: np.ndarray, lo: int, zero: list[str], copied: Any = None) -> Future[None]:
        return self._thread.submit(decode_rows, shards, ids, self.decode, self.threads, self.host, lo, zero, copied)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


def _arrays(buf: Any, spec: _Spec) -> dict[str, np.ndarray]:
    return {k: np.ndarray(shape, dtype, buffer=buf, offset=off) for k, (shape, dtype, off) in spec.items()}


def _serve(conn: Connection, name: str, spec: _Spec, decode: list[str], threads: int, parent: int) -> None:
    """The decode process: requests ``(shards or None, ids, lo, zero)`` until ``None``, a closed pipe, or the
    end of the trainer's process ``parent`` (killed: its pipe may stay open in processes forked from it since,
    so that is checked every second; the shared memory is then unlinked here, as ``close`` would have)."""
    tune_malloc()  # a process of the context's own
    shm = SharedMemory(name=name)
    try:
        host, shards = _arrays(shm.buf, spec), None
        while True:
            msg, orphaned = next_request(conn, parent)
            if orphaned:
                try:
                    shm.unlink()
                except FileNotFoundError:  # another decode process of the same context was first
                    pass
            if msg is None:
                return
            new, ids, lo, zero = msg
            shards = new if new is not None else shards
            try:
                decode_rows(shards, ids, decode, threads, host, lo, zero)  # type: ignore[arg-type]
                conn.send(None)
            except Exception as exc:  # to the trainer, as raised
                conn.send(exc)
            del ids
        del host
    finally:
        shm.close()


class _Reply:
    """The replies of the decode processes sent one request: ``result()`` reads each (so every pipe stays in
    step with its process, even if a wait is interrupted: what is left is read next time) and then raises
    the first error, if any."""

    def __init__(self, conns: list[Connection], procs: list[Any], broken: list[str]):
        self.conns, self.procs, self.broken, self.error = conns, procs, broken, None  # (not the decoder: no cycle)
        self.waiting: list[int] = []  # the processes sent the request whose reply is not read yet

    def done(self) -> bool:
        """Every process has replied (or ended): :meth:`result` will not wait."""
        return all(self.conns[i].poll() for i in self.waiting)

    def result(self) -> None:
        while self.waiting:
            i = self.waiting[0]
            try:
                error = self.conns[i].recv()
            except (EOFError, OSError):
                error = _ended(self.procs, i, self.broken)
            self.waiting.pop(0)
            self.error = self.error or error
        if self.error is not None:
            raise self.error


class ProcessDecoder:
    """Decodes in ``processes`` processes into shared memory of ``rows`` rows of ``fields`` (``name -> (shape,
    dtype)``); each process decodes its own contiguous share of each pool's graphs (none if the pool has
    fewer graphs than processes), so a pool's decode takes ``1 / processes`` of the time where cores are
    free. A process that ended (killed) breaks the decoder: each later request raises the same one line."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], str]], rows: int, decode: list[str], threads: int, processes: int = 1):
        spec, pos = {}, 0
        for k, (shape, dtype) in fields.items():
            full = (rows,) + tuple(shape)
            spec[k] = (full, dtype, pos)
            pos += -(-int(np.prod(full, dtype=np.int64)) * np.dtype(dtype).itemsize // 64) * 64
        free = shm_free_bytes()
        if free is not None and pos > free // 2:
            raise SharedMemoryError(f"TwinsContext(decoder='process') needs {pos / 1e6:.0f} MB of shared memory for its pools, and /dev/shm has {free / 1e6:.0f} MB free: use decoder='thread'")
        self._shm = SharedMemory(create=True, size=max(pos, 64))
        self.host = _arrays(self._shm.buf, spec)
        # forked as the DataLoader's workers are (the child touches no CUDA: numpy and zstd only); spawn would
        # re-run a user's script that has no ``if __name__ == "__main__"`` guard
        ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for i in range(processes):
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, self._shm.name, spec, decode, threads, os.getpid()), daemon=True, name=f"twins-context-decoder-{i}")
            proc.start()
            child.close()
            self._conns.append(conn)
            self._procs.append(proc)
        self._sent: list[ShardSet | None] = [None] * processes  # the shard set each process has
        self._last: _Reply | None = None
        self._broken: list[str] = []  # the one line of the process that ended, if one did
        # a context dropped without close(), or still open when the interpreter exits (an exception, Ctrl-C):
        # the processes are stopped and the segment unlinked all the same
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs, self._shm, os.getpid())

    def submit(self, shards: ShardSet, ids: np.ndarray, lo: int, zero: list[str], copied: Any = None) -> _Reply:
        if copied is not None:
            copied.synchronize()
        if self._last is not None:
            try:
                self._last.result()  # one request at a time (the context waits for each anyway)
            except Exception:  # (one the context forgot, interrupted: only its end matters here)
                pass
        for i, proc in enumerate(self._procs):
            if not self._broken and not proc.is_alive():
                _ended(self._procs, i, self._broken)
        if self._broken:
            raise RuntimeError(self._broken[0])
        reply, start = _Reply(self._conns, self._procs, self._broken), 0
        self._last = reply
        for i, part in enumerate(np.array_split(ids, len(self._conns))):
            if len(part):  # (a process with no graphs of this pool is not asked: an empty block is no decode)
                new = shards if shards is not self._sent[i] else None
                try:
                    self._conns[i].send((new, part, lo + start, zero))
                except OSError:
                    raise _ended(self._procs, i, self._broken) from None
                self._sent[i] = shards
                reply.waiting.append(i)
            start += len(part)
        return reply

    def close(self) -> None:
        try:
            if self._last is not None:
                self._last.result()
        except Exception:  # a process already gone: nothing to stop
            pass
        self.host = {}
        self._finalizer()


def _ended(procs: list[Any], i: int, broken: list[str]) -> RuntimeError:
    """Decode process ``i`` is gone: the decoder is broken from now on (``broken`` gets the one line, returned)."""
    proc = procs[i]
    proc.join(timeout=1)
    if not broken:
        broken.append(
            f"TwinsContext decode process {i + 1} of {len(procs)} (pid {proc.pid}) ended (exit code {proc.exitcode}) before its share of a pool "
            f"was decoded (killed? out of memory?): this context decodes no more; close it and make a new TwinsContext"
        )
    return RuntimeError(broken[0])


def _stop(conns: list[Connection], procs: list[Any], shm: SharedMemory, owner: int) -> None:
    """Stop the decode processes and free their shared memory (once: ``close``, garbage collection or exit), in
    the process that started them only (not in a DataLoader worker forked with a copy of the context)."""
    if os.getpid() != owner:
        return
    for conn in conns:
        try:
            conn.send(None)
        except Exception:  # a process already gone: nothing to stop
            pass
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    for conn in conns:
        conn.close()
    try:
        shm.close()
    except BufferError:  # arrays still view it (at exit): the mapping goes with the process
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass
