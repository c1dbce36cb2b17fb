"""Where zstd's ``multi_decompress_to_buffer`` put each member, numpy views of its output buffers, and which member it refused.

Split from :mod:`cachebuild.format.decode` (the block decoder), which uses both
to turn one batched decompression into strided numpy runs without a copy.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import zstandard

__all__ = ["CHUNK_BYTES", "OutputBuffer", "ShardFrames", "decompress_chunks", "first_bad_frame", "packed_offsets"]

CHUNK_BYTES = 4 << 20
"""Most decoded bytes one ``multi_decompress_to_buffer`` call returns (a block is decoded in calls of
about this size; a frame larger than this has a call of its own).

zstd allocates each call's output with ``malloc``; glibc serves an allocation larger than any freed
before (its dynamic mmap threshold, at most 32 MB) with a fresh ``mmap``, and blocks of varying size
kept hitting that: a `graphs` batch of 256 graphs (~8 MB decoded) paid 600-800 page faults, a pool of
1,000 graphs (~30 MB) 1,300-4,100, in processes where `tune_malloc` does not run (the trainer's own,
at 0 workers and in `TwinsContext`). Calls of at most this size are served from the heap again.
"""


class ShardFrames:
    """A block's frames as ``(shard, offset, size)`` in the shards' mmaps, handed to zstd without a Python
    object per frame: each call gets one ``BufferWithSegments`` per run of consecutive frames of one shard.

    A list of memoryview slices (one per frame) costs ~0.15 us each to make, and memoryviews are tracked
    by the garbage collector: a ``twins`` pool of 1,000 graphs (5,000 frames) made 5,000 of them, so the
    collector ran every ~140 frames and, as they outlived its young generations, a full collection (70 ms
    in a trainer's process with torch loaded) every few pools, stopping every thread. Worth it where the
    frames come in long runs of one shard (a block ordered by record id); :func:`shard_runs` counts them.

    Sizes: python-zstandard (0.25) checks ``decompressed_sizes`` of a ``BufferWithSegmentsCollection``
    against the number of frames instead of bytes (``decompressor.c``), so none are passed here; zstd
    then takes each frame's size from its header, the size the caller already checked against the index
    (every frame must declare one), and fails a frame that decodes to another."""

    def __init__(self, views: dict[int, Any], shard: np.ndarray, offset: np.ndarray, size: np.ndarray):
        self.views = views  # shard -> a buffer of its bytes (the mmap's memoryview)
        self.shard = shard
        self.segments = np.stack([offset, size], axis=1).astype(np.uint64)
        self.starts = shard_runs(shard)

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, i: int) -> memoryview:
        o, z = (int(x) for x in self.segments[i])
        return memoryview(self.views[int(self.shard[i])])[o : o + z]

    def collection(self, a: int, b: int) -> zstandard.BufferWithSegmentsCollection:
        """Frames ``a .. b - 1`` as one collection (in that order)."""
        inner = self.starts[np.searchsorted(self.starts, a, side="right") : np.searchsorted(self.starts, b, side="left")]
        cuts = [a, *inner.tolist(), b]
        raw = self.segments[a:b].tobytes()  # (16 bytes a frame: offset, size)
        shard = self.shard[cuts[:-1]].tolist()
        parts = [zstandard.BufferWithSegments(self.views[s], raw[16 * (x - a) : 16 * (y - a)]) for s, x, y in zip(shard, cuts[:-1], cuts[1:])]
        return zstandard.BufferWithSegmentsCollection(*parts)  # type: ignore[no-untyped-call]


def shard_runs(shard: np.ndarray) -> np.ndarray:
    """Where each run of consecutive frames of one shard starts."""
    starts = np.flatnonzero(shard[1:] != shard[:-1]) + 1 if len(shard) else shard[:0]
    return np.concatenate(([0], starts)).astype(np.int64) if len(shard) else starts.astype(np.int64)


Payloads = Union[list[Union[bytes, bytearray, memoryview]], ShardFrames]


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


def decompress_chunks(
    dctx: zstandard.ZstdDecompressor, payloads: Payloads, sizes: np.ndarray, threads: int, chunk_bytes: int | None = None
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, list[Any]]:
    """Decode ``payloads`` (a list of frames, or :class:`ShardFrames`; declared decoded ``sizes``, uint64) in calls of
    about ``chunk_bytes`` (:data:`CHUNK_BYTES`).

    Returns the output buffers as numpy views, per frame its buffer number and offset in it, and the
    calls' outputs (owners of those buffers). A ``zstandard.ZstdError`` is raised as zstd raised it,
    with ``item_base`` set to the index of the call's first frame (its message numbers items in the call).
    """
    n, bound = len(payloads), CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    lens = sizes.astype(np.int64)
    cuts = [0]
    if n:
        ends = np.cumsum(lens)
        while cuts[-1] < n:
            base = int(ends[cuts[-1] - 1]) if cuts[-1] else 0
            cuts.append(max(cuts[-1] + 1, int(np.searchsorted(ends, base + bound, side="right"))))
    buffers: list[np.ndarray] = []
    buf_of, offs, owners = np.empty(n, np.int64), np.empty(n, np.int64), []
    for a, b in zip(cuts[:-1], cuts[1:]):
        try:
            if isinstance(payloads, ShardFrames):  # (sizes from the frames' headers: see ShardFrames)
                out = dctx.multi_decompress_to_buffer(payloads.collection(a, b), threads=threads)
            else:
                out = dctx.multi_decompress_to_buffer(payloads[a:b], decompressed_sizes=sizes[a:b].tobytes(), threads=threads)
        except zstandard.ZstdError as exc:
            exc.item_base = a  # type: ignore[attr-defined]
            raise
        owners.append(out)
        part = packed_offsets(out, lens[a:b])
        if part is None:  # several output buffers with an empty member: ask for each member's place
            part = np.fromiter((out[i].offset for i in range(b - a)), np.int64, b - a)
        starts = np.flatnonzero(part == 0)
        local = np.cumsum(part == 0) - 1
        last = np.append(starts[1:], b - a) - 1
        for s0, e0 in zip(starts.tolist(), (part + lens[a:b])[last].tolist()):
            addr = np.frombuffer(out[s0], np.uint8).__array_interface__["data"][0]  # type: ignore[call-overload]
            buffers.append(np.asarray(OutputBuffer(addr, e0, out)))
        buf_of[a:b] = local + (len(buffers) - len(starts))
        offs[a:b] = part
    return buffers, buf_of, offs, owners


def first_bad_frame(dctx: zstandard.ZstdDecompressor, payloads: Payloads) -> int:
    """The first of ``payloads`` that zstd refuses on its own (where a batched call's error did not name the item); 0 if none."""
    for i in range(len(payloads)):
        try:
            dctx.decompress(payloads[i])
        except zstandard.ZstdError:
            return i
    return 0
