"""A DataLoader worker of ours leaves Ctrl-C to the trainer's process.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the
trainer and its DataLoader workers. The trainer gets a ``KeyboardInterrupt``
and may go on (a notebook cell run again, a training loop that catches it to
save a checkpoint); the workers, without this, died with the signal, and a
loader with ``persistent_workers=True`` then failed every later pass with
torch's "DataLoader worker (pid(s) ...) exited unexpectedly". Workers ignore
SIGINT instead (as the build's own Dask workers do), so the trainer decides:
the next pass resumes them, a loader dropped or a process ending shuts them
down as always (torch's shutdown does not rely on SIGINT).
"""

from __future__ import annotations

import signal
import threading

__all__ = ["leave_ctrl_c_to_the_trainer"]


def leave_ctrl_c_to_the_trainer() -> None:
    """Ignore SIGINT in this process (a DataLoader worker; from its main thread only, as Python requires)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
