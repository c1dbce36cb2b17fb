"""The next pool decoded in a thread while a process's batches read the current one.

In a mixed plan a process builds all batches of pool ``q`` from records decoded
once (:class:`loaders.views.store.RecordStore`); the decode of pool ``q + 1``
would otherwise stall the batch that first needs it (a pool of 33,000 small
records: ~40 ms). A store that may decode ahead (the pooled ``records`` view,
in the trainer's process: DataLoader workers share their pools instead) starts
that decode in a thread as soon as a batch lies wholly in pool ``q``, into the
region the previous pool has left; zstd and numpy's copies release the GIL, so
on a machine with a core to spare the decode runs beside the batches.

Batches do not change: the same records are decoded into the same rows, and a
batch that needs the pool (or a region, or any decode) first waits for the
thread. A decode that raises is raised to that batch.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

__all__ = ["AheadDecode"]


class AheadDecode:
    """Pool ``pool``'s records ``ids`` being decoded into rows ``dest`` of region ``region``, in a thread."""

    def __init__(self, pool: int, region: int, ids: np.ndarray, dest: np.ndarray, decode: Callable[[np.ndarray, np.ndarray], None]):
        self.pool, self.region, self.dest, self.count = pool, region, dest, len(ids)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(decode, ids, dest), name=f"cachebuild-pool-{pool}-ahead", daemon=True)
        self.thread.start()

    def _run(self, decode: Callable[[np.ndarray, np.ndarray], None], ids: np.ndarray, dest: np.ndarray) -> None:
        try:
            decode(ids, dest)
        except BaseException as exc:  # (raised to the batch that waits for it)
            self.error = exc

    def wait(self) -> BaseException | None:
        """Return once the decode is done: what it raised, or ``None``. (It does not raise: a caller
        tells a failed decode from a Ctrl-C during the wait, and forgets the decode only once it ended.)"""
        self.thread.join()
        return self.error
