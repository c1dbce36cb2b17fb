"""Telling a shard job that its build has stopped (another shard failed, or the build was interrupted).

A backend whose jobs can outlive the build's call (Dask: a task on a cluster's
worker runs to its end even when cancelled) runs each job under
:func:`stop_check`. The job asks :func:`raise_if_stopped` between blocks (an
answer at most every :data:`CHECK_EVERY_S`: each may be a round trip to the
cluster) and, freshly, right before its shard is closed and renamed into place;
a stopped build makes it raise :class:`BuildStopped`, its writer removes the
temporary file, and nothing is published. Jobs without a check (loky's worker
processes, terminated with the build; threads, which the build waits for) are
never stopped this way.

A build that waits for running jobs after it stopped says so first, in one line
on the ``cachebuild`` logger (:func:`announce_wait`; the CLI prints it on stderr,
``-q`` or not): how many are running, what becomes of them, and that Ctrl-C
leaves at once. On Ray the wait can be as long as a shard takes (about a minute
at 256 MB), and it was silent.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

__all__ = ["BuildStopped", "CHECK_EVERY_S", "QUIET_WAIT_S", "announce_wait", "ctrl_c_held", "stop_check", "raise_if_stopped"]

CHECK_EVERY_S = 0.5
QUIET_WAIT_S = 0.5
"""A stopped build's wait that ends within this is not announced (a shard that was finishing anyway); every backend."""


class BuildStopped(Exception):
    """The build this job belongs to has stopped: the shard is dropped unpublished (never shown to users)."""


class _Check:
    def __init__(self, check: Callable[[], bool]):
        self.check = check
        self.asked = time.monotonic()  # the first answer CHECK_EVERY_S in: a short job asks once, freshly, at its end
        self.stopped = False

    def __call__(self, fresh: bool) -> bool:
        now = time.monotonic()
        if not self.stopped and (fresh or now - self.asked >= CHECK_EVERY_S):
            self.stopped, self.asked = bool(self.check()), now
        return self.stopped


_current: ContextVar[_Check | None] = ContextVar("cachebuild_stop_check", default=None)


@contextmanager
def stop_check(check: Callable[[], bool]) -> Iterator[None]:
    """Run the block with ``check()`` (True: the build has stopped) as this job's stop check (asked first
    :data:`CHECK_EVERY_S` into the block, or when a fresh answer is wanted)."""
    token = _current.set(_Check(check))
    try:
        yield
    finally:
        _current.reset(token)


def raise_if_stopped(fresh: bool = False) -> None:
    """Raise :class:`BuildStopped` if this job's build has stopped (``fresh``: ask now, not a recent answer)."""
    check = _current.get()
    if check is not None and check(fresh):
        raise BuildStopped("the build stopped")


_log = logging.getLogger("cachebuild")


def announce_wait(running: int, until: str, if_left: str = "") -> None:
    """Say that a stopped build waits for ``running`` shards still being written (``until``: what ends the wait,
    ``if_left``: what Ctrl-C then costs) and that Ctrl-C leaves at once."""
    shards = f"{running} running shard{'' if running == 1 else 's'}"
    _log.warning(f"stopping: waiting for {shards} {until}; press Ctrl-C to leave now{if_left}. A rerun of the same command resumes.")


@contextmanager
def ctrl_c_held(hold: bool = True, say: str = "") -> Iterator[list[int]]:
    """Run the block with Ctrl-C held back: a first SIGINT meanwhile is noted in the list yielded (the caller
    raises ``KeyboardInterrupt`` for it after the block, where its clean-up will run) and ``say`` is logged
    (it tells the user what is awaited); a second one raises at once (the user would rather leave). For steps
    that a ``KeyboardInterrupt`` leaves half done: a local Ray's start (interrupted, the build could die with
    SIGSEGV or SIGINT, or print a traceback, at its exit) and a task's submission (a task submitted but not
    yet counted was neither waited for nor killed). Only where Python's own handler is in place, in the main
    thread (a program's own SIGINT handler is left alone); ``hold`` False: the block runs as it is."""
    came: list[int] = []
    if not hold or threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield came
        return

    def note(signum: int, frame: Any) -> None:
        if came:
            raise KeyboardInterrupt
        came.append(signum)
        if say:
            _log.warning(say)

    signal.signal(signal.SIGINT, note)
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
