"""Keep large buffers on glibc's heap in processes that churn through them.

Writers and readers of shards allocate and free tens of MB per block (generated
arrays, zstd output buffers). By default glibc serves each such allocation with
a fresh ``mmap`` and returns it with ``munmap``, so every block pays page faults
and page zeroing in the kernel, about as much time as the work itself. A higher
mmap and trim threshold lets the heap reuse the memory. Call it only in
processes cachebuild owns (build workers, DataLoader workers); it does nothing
where glibc is absent.
"""

from __future__ import annotations

__all__ = ["tune_malloc"]

_DONE = False
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 512 << 20, trim_threshold: int = 1 << 30) -> None:
    """Raise glibc's mmap/trim thresholds once per process (idempotent)."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except (OSError, AttributeError):
        pass
