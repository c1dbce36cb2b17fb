"""Fewer cyclic garbage collections while shards are written.

Writing a shard allocates many short-lived containers (a block's record dicts,
a run's lists of memoryview slices). At Python's default generation-0
threshold (700) the cyclic collector ran about 125 times per 6,250-graph shard,
and its older generations walked every live record of the block: 40-70 ms of
the shard's ~1 s of CPU, none of it finding garbage (records and runs hold no
cycles; they are freed by reference counting). :func:`fewer_collections`
raises that threshold to :data:`GEN0_THRESHOLD` while shards are written (a few
collections per shard) and restores the previous thresholds when the last shard
being written in the process is done (threads of one process share them). It
changes when garbage is found, never what is written.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["GEN0_THRESHOLD", "fewer_collections"]

GEN0_THRESHOLD = 10_000

_LOCK = threading.Lock()
_active = 0
_saved: tuple[int, int, int] = (0, 0, 0)


@contextlib.contextmanager
def fewer_collections(gen0: int = GEN0_THRESHOLD) -> Iterator[None]:
    """Generation 0's threshold at least ``gen0`` inside the block (unless collection is off: threshold 0)."""
    global _active, _saved
    with _LOCK:
        if _active == 0:
            _saved = gc.get_threshold()
            if 0 < _saved[0] < gen0:
                gc.set_threshold(gen0, *_saved[1:])
        _active += 1
    try:
        yield
    finally:
        with _LOCK:
            _active -= 1
            if _active == 0:
                gc.set_threshold(*_saved)
