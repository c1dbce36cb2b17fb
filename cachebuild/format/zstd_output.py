"""Where zstd's ``multi_decompress_to_buffer`` put each member, numpy views of its output buffers, and which member it refused.

Split from :mod:`cachebuild.format.decode` (the block decoder), which uses both
to turn one batched decompression into strided numpy runs without a copy.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import zstandard

__all__ = ["OutputBuffer", "first_bad_frame", "packed_offsets"]


class OutputBuffer:
    """A read-only numpy view of one of zstd's output buffers that keeps the buffer alive: zstd's
    ``BufferWithSegmentsCollection`` exposes each decoded member, not the contiguous buffer behind
    a run of members; this exports that buffer (address and size from its first member) with ``owner``."""

    def __init__(self, addr: int, size: int, owner: Any):
        self.__array_interface__ = {"data": (addr, True), "shape": (size,), "typestr": "|u1", "version": 3}
        self.owner = owner


def packed_offsets(out: Any, lens: np.ndarray) -> np.ndarray | None:
    """Each member's offset in its zstd output buffer, a few Python calls per buffer (not one per member).

    Members are written back to back, a new buffer starting when one is full: inside a buffer an offset
    is the running sum of lengths since its first member, after a new start it is strictly smaller
    (lengths > 0), so each buffer's start is found by bisection. ``None`` when a member is empty.
    """
    n = len(lens)
    if n == 0 or not (lens > 0).all():
        return None
    offs = np.empty(n, np.int64)
    start = 0
    while start < n:
        run = np.zeros(n - start, np.int64)
        np.cumsum(lens[start:-1], out=run[1:])
        if out[n - 1].offset == int(run[-1]):
            offs[start:] = run
            break
        lo, hi = start + 1, n - 1  # members before lo match, member hi does not
        while lo < hi:
            mid = (lo + hi) // 2
            if out[mid].offset == int(run[mid - start]):
                lo = mid + 1
            else:
                hi = mid
        if out[lo].offset != 0:
            return None
        offs[start:lo] = run[: lo - start]
        start = lo
    return offs


def first_bad_frame(dctx: zstandard.ZstdDecompressor, payloads: Sequence[bytes | bytearray | memoryview]) -> int:
    """The first of ``payloads`` that zstd refuses on its own (where a batched call's error did not name the item); 0 if none."""
    for i, p in enumerate(payloads):
        try:
            dctx.decompress(p)
        except zstandard.ZstdError:
            return i
    return 0
