"""How long the GPU sat idle between training steps, read from CUDA events on the trainer's stream.

The wall-clock wait of a training loop (time blocked in ``next()``) says whether
the *CPU* waited; with an asynchronous GPU it overstates starvation: a loop that
runs ahead of its GPU must block somewhere, and blocking in ``next()`` while the
GPU still has queued work costs nothing. What costs is the GPU running out of
work. :class:`GpuIdleMeter` measures exactly that, on the device's own clock:

* ``done()`` records an event on the current stream when the trainer asks for the
  next batch (after step i's kernels were enqueued);
* ``ready()`` records one when the batch arrives (before step i+1 is enqueued;
  ``to_device`` has already made the stream wait for the batch's copy).

The device time between ``done_i`` and ``ready_{i+1}`` is the GPU's idle gap
before step i+1: about zero when step i+1's work was queued before the GPU
finished step i, the full stall when the GPU had to wait for data. Their sum over
the device time of the measured window is ``idle_fraction``.

Cost: two ``cudaEventRecord`` per step (a few microseconds) and no
synchronisation: completed pairs are folded in every ``fold_every`` steps with
non-blocking ``query()``; :meth:`result` reads only completed events, so the
numbers lag the loop by the GPU's queue at most.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any

import numpy as np

__all__ = ["GpuIdleMeter"]


class GpuIdleMeter:
    """Sum of the GPU's idle gaps between steps on the current CUDA stream (see the module docstring)."""

    def __init__(self, torch_module: Any, fold_every: int = 32) -> None:
        self._torch = torch_module
        self._fold_every = fold_every
        self._pending: deque[tuple[Any, Any]] = deque()  # (done_i, ready_{i+1}) not yet read
        self._first: Any = None  # ready event that opens the window
        self._last_done: Any = None
        self._open_done: Any = None  # done event waiting for its ready
        self._window_end: Any = None  # the ready event of the latest folded pair
        self._last_event: Any = None  # the latest event recorded
        self.gap_ms = array("d")  # every folded gap, in step order
        self.idle_ms = 0.0
        self.gaps = 0
        self._since_fold = 0

    def _event(self) -> Any:
        ev = self._last_event = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ready(self) -> None:
        """The batch of the next step has arrived (call before enqueueing the step)."""
        ev = self._event()
        if self._first is None:
            self._first = ev
        if self._open_done is not None:
            self._pending.append((self._open_done, ev))
            self._open_done = None
        self._since_fold += 1
        if self._since_fold >= self._fold_every:
            self._since_fold = 0
            self._fold()

    def done(self) -> None:
        """The trainer finished enqueueing its step and asks for the next batch."""
        if self._first is not None:
            self._open_done = self._last_done = self._event()

    def _fold(self) -> None:
        while self._pending and self._pending[0][1].query():
            done, ready = self._pending.popleft()
            gap = max(0.0, done.elapsed_time(ready))
            self.idle_ms += gap
            self.gap_ms.append(gap)
            self.gaps += 1
            self._window_end = ready

    def result(self, wait: bool = False) -> tuple[float | None, float | None]:
        """``(idle_fraction, idle_ms_per_step)`` over the completed part of the window (None before two steps).

        ``wait=True`` first waits for the last recorded event (at the end of an epoch).
        """
        if wait and self._last_event is not None:
            self._last_event.synchronize()
        self._fold()
        end = self._last_event if wait and self._last_event is not None else self._window_end
        if self._first is None or end is None or not self.gaps:
            return None, None
        span = self._first.elapsed_time(end)
        return (self.idle_ms / span if span > 0 else None), self.idle_ms / self.gaps

    def gap_stats(self) -> dict[str, float]:
        """Where the idle time sits: median, p99 and largest gap, and the idle time in gaps over 5 ms (ms)."""
        g = np.frombuffer(self.gap_ms, dtype=np.float64)
        if not len(g):
            return {}
        return {
            "gap_p50_ms": float(np.percentile(g, 50)),
            "gap_p99_ms": float(np.percentile(g, 99)),
            "gap_max_ms": float(g.max()),
            "idle_in_gaps_over_5ms_ms": float(g[g > 5.0].sum()),
            "gaps": int(len(g)),
        }
