"""Keep large buffers on glibc's heap in processes that churn through them.

Writers and readers of shards allocate and free tens of MB per block (generated
arrays, zstd output buffers). By default glibc serves each such allocation with
a fresh ``mmap`` and returns it with ``munmap``, so every block pays page faults
and page zeroing in the kernel, about as much time as the work itself. A higher
mmap and trim threshold lets the heap reuse the memory. :func:`tune_malloc` (high
thresholds) runs only in processes cachebuild owns (build workers, DataLoader
workers); :func:`settle_heap` (glibc's own ceiling, a 128 MB trim) in the
trainer's process when it decodes there. Both do nothing where glibc is absent.
"""

from __future__ import annotations

import os

__all__ = ["settle_heap", "tune_malloc"]

_LEVEL = 0  # 0: glibc's defaults, 1: settle_heap, 2: tune_malloc (a fork inherits it with the settings)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_MAX_MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where glibc's own adjustment stops
_SETTLED_TRIM = 128 << 20


def _mallopt(mmap_threshold: int, trim_threshold: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except (OSError, AttributeError):
        pass


def tune_malloc(mmap_threshold: int = 512 << 20, trim_threshold: int = 1 << 30) -> None:
    """Raise glibc's mmap/trim thresholds once per process (idempotent)."""
    global _LEVEL
    if _LEVEL >= 2:
        return
    _LEVEL = 2
    _mallopt(mmap_threshold, trim_threshold)


def settle_heap() -> None:
    """In a process cachebuild does not own (the trainer's, decoding at 0 workers or in a ``TwinsContext``):
    glibc's mmap threshold at once at the value its own adjustment ends at (32 MB), and up to 128 MB of
    free heap kept instead of about twice the largest block freed so far (idempotent; never lowers
    :func:`tune_malloc`'s). Left alone where the process started with glibc's malloc options in its environment.

    Why: a batch's zstd output and decode buffers (8-40 MB, freed together) made glibc give the heap
    back after every batch and fault it in again on the next: 600-2,500 page faults and up to a quarter
    of a batch's CPU in the kernel (DECISIONS "Page faults in the trainer's process").
    """
    global _LEVEL
    if _LEVEL >= 1:
        return
    _LEVEL = 1
    env = _start_environment()
    if any(k in env for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")) or "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return
    _mallopt(_GLIBC_MAX_MMAP_THRESHOLD, _SETTLED_TRIM)


def _start_environment() -> dict[str, str]:
    """The environment this process started with, which is what glibc read its malloc options from
    (``/proc/self/environ``; ``os.environ`` elsewhere). A variable set later in ``os.environ`` did not
    reach this process's glibc: Dask's ``LocalCluster``, for one, puts ``MALLOC_TRIM_THRESHOLD_`` there
    for its workers."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    pairs = (item.decode("utf-8", "replace").partition("=") for item in items if item)
    return {k: v for k, _, v in pairs}
