"""A background thread that takes batches from the DataLoader ahead of the trainer.

Receiving a batch from a DataLoader worker costs the main process about a
millisecond (queue hand-over, unpickling a shared-memory handle, copying the
batch out of the worker's slot). Done in the trainer's ``next()``, that is
wait time on every step; done on this thread, it overlaps the trainer's step
(which on a GPU mostly waits for kernels, with the GIL released).

One protocol (as torchdata's ``_populate_queue``): a bounded queue, a stop
event checked with a timeout, exceptions carried to the consumer and re-raised
there, and an explicit ``close()`` that joins the thread, so nothing else ever
touches the source iterator while the thread may. The join is bounded (see
:meth:`Handover.close`): shutting down never hangs, in whatever order the user
stops the workers and closes the iterator.

With ``shared=True`` the consumer may take an item from the source itself when
the queue is empty, rather than wait for the thread to hand one over: both take
items under one lock, the thread putting each in the queue before it lets go,
so the order is the source's. For a source that is this process's own work (a
pass planned here, not workers' batches arriving): a trainer that outruns the
thread does the work with no hand-off latency, and one whose step gives the
thread time finds the items ready.

With ``patience_s`` too, the thread works only while the consumer stays away
(between two ``next()`` calls) longer than that on average (the mean of its
last few absences): a consumer that is back at once (a loop with no step, or
steps shorter than that) takes every item itself on its own thread and never
wakes the thread (the two threads passing the GIL and the lock back and forth
for each batch cost the pooled ``records`` view a fifth of its speed); a
trainer in longer steps finds items ready.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

__all__ = ["Handover", "clean_worker_error"]

_DONE = object()
CLOSE_TIMEOUT_S = 10.0


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Handover:
    """Iterate ``source`` on a thread, applying ``prepare`` to each item, ``depth`` items ahead."""

    def __init__(self, source: Iterator[Any], prepare: Callable[[Any], Any], depth: int = 2, shared: bool = False, patience_s: float = 0.0):
        self._source = source
        self._prepare = prepare
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._lock = threading.Lock() if shared else None
        self._space = threading.Semaphore(max(1, depth))  # (shared) free places in the queue: the thread waits for one before it takes an item
        self._ended = False  # (shared) the source is exhausted or raised: nothing more to take from it
        self._patience = float(patience_s) if shared else 0.0
        self._work = threading.Event()  # the thread takes items while it is set (always, without patience)
        if not self._patience:
            self._work.set()
        self._left: float | None = None  # (patience) when the consumer last returned
        self._away = 0.0  # (patience) the mean of its last few absences, in seconds
        self._thread = threading.Thread(target=self._run, name="cachebuild-handover", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # a Ctrl-C while start() waits for the thread: no one holds this object to close it
            self._stop.set()
            raise

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        if self._lock is not None:
            return self._run_shared(self._lock)
        try:
            for item in self._source:
                if not self._put(self._prepare(item)):
                    return
            self._put(_DONE)
        except BaseException as exc:  # carried to the consumer, re-raised there
            self._put(_Raised(exc))

    def _take(self) -> Any:
        """The next item of the source, prepared (the caller holds the lock); ``_DONE`` or ``_Raised`` at its end."""
        if self._ended:
            return _DONE
        try:
            return self._prepare(next(self._source))
        except StopIteration:
            self._ended = True
            return _DONE
        except BaseException as exc:  # carried to the consumer, re-raised there
            self._ended = True
            return _Raised(exc)

    def _run_shared(self, lock: threading.Lock) -> None:
        while not self._stop.is_set():
            if not self._space.acquire(timeout=0.1):  # never wait for room while holding the lock
                continue
            if not self._work.wait(0.1) or self._stop.is_set():
                self._space.release()
                continue
            with lock:  # put before letting go: an item the consumer takes itself comes after it
                if self._ended:
                    return
                item = self._take()
                self._queue.put_nowait(item)  # (room was reserved; only this thread puts)
                if item is _DONE or isinstance(item, _Raised):
                    return

    def _back(self) -> None:
        """(patience) The consumer is back: let the thread work while its mean absence exceeds ``patience_s``."""
        now = time.monotonic()
        if self._left is not None:
            self._away += 0.25 * (now - self._left - self._away)
        if self._away <= self._patience:
            self._work.clear()
        elif not self._work.is_set():
            self._work.set()

    def __iter__(self) -> Iterator[Any]:
        while True:
            if self._patience:
                self._back()
            item = self._next()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.exc
            self._left = time.monotonic()
            yield item

    def _next(self) -> Any:
        if self._lock is None:
            return self._queue.get()
        item = self._ready()
        if item is not None:
            return item
        with self._lock:  # the thread is not mid-item now: what it took is in the queue
            item = self._ready()
            return self._take() if item is None else item

    def _ready(self) -> Any:
        """(shared) An item the thread put in the queue, or None."""
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return None
        self._space.release()
        return item

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Stop the thread and wait for it to let go of the source; True when it did.

        The wait is bounded: it ends when the thread finishes the item it is
        fetching, at once when the source was shut down under it (a torch
        iterator whose workers were stopped never yields again), or after
        ``timeout`` seconds. A thread left behind is a daemon blocked on a dead
        source: it holds no lock the caller needs and does not delay exit.
        """
        self._stop.set()
        self._work.set()  # (shared: wake a thread waiting for work or room, at once rather than at its 0.1 s timeout)
        self._space.release()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()  # unblock a put
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
            if self._thread.is_alive() and (getattr(self._source, "_shutdown", False) or time.monotonic() > deadline):
                return False
        return True


def clean_worker_error(exc: BaseException) -> BaseException:
    """A cachebuild error raised in a DataLoader worker, with its own one-line message again.

    torch re-raises a worker's exception as the same type with the worker's whole
    traceback as its message; for our own errors (whose message already names the
    shard, record and field) that buries the one line a user needs. Anything else
    is returned unchanged.
    """
    from cachebuild.errors import CacheBuildError

    text = str(exc)
    if not isinstance(exc, CacheBuildError) or not text.startswith("Caught ") or "Traceback" not in text:
        return exc
    prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    last = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    if not last:
        return exc
    try:
        return type(exc)(last[-1][len(prefix) :])
    except Exception:  # a subclass with another constructor: keep torch's message
        return exc
