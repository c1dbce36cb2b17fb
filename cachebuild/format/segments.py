"""A 1-d field's decoded records as (buffer, offset, length), padded into a batch with one gather.

Used by :func:`cachebuild.format.decode.read_block` for fields of many lengths
(ragged token sequences), where one strided run per length would cost a
Python-level view and assignment per record.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Segments", "segments_of", "length_mask", "small_int", "window_rows", "copy_windows"]


@dataclass
class Segments:
    """A 1-d field's records as (buffer, element offset, length), scattered with one gather for the
    whole block: a block of ragged sequences (hundreds of lengths) would otherwise be hundreds of
    one-record runs, each a Python-level view and assignment."""

    rows: np.ndarray  # block row of each record
    buf: np.ndarray  # which buffer holds it
    start: np.ndarray  # its first element in that buffer (viewed as the field's dtype)
    length: np.ndarray  # its elements
    buffers: list[np.ndarray]  # the decoded buffers, each viewed as the field's dtype
    _joined: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def _flat(self) -> tuple[np.ndarray, np.ndarray]:
        """``(data, first)``: every buffer the records use, as one array (joined once if there are
        several), and each record's first element in it."""
        if self._joined is None:
            data = self.buffers[0] if len(self.buffers) == 1 else np.concatenate(self.buffers)
            self._joined = (data, self._firsts())
        return self._joined

    def _firsts(self) -> np.ndarray:
        """Each record's first element in its buffers joined one after the other."""
        if len(self.buffers) == 1:
            return self.start
        sizes = np.array([len(b) for b in self.buffers], np.int64)
        first: np.ndarray = (np.cumsum(sizes) - sizes)[self.buf] + self.start
        return first

    def _windows(self, wide: int) -> tuple[np.ndarray, np.ndarray]:
        """``(data, first)``: the joined data followed by ``wide`` zeros, so that every record's window of
        ``wide`` elements (:func:`window_rows`) stays inside it (one copy of the block's data, the same
        join :meth:`_flat` makes when zstd left several buffers), and each record's first element."""
        data = np.concatenate([*self.buffers, np.zeros(wide, self.buffers[0].dtype)])
        return data, self._firsts()

    def _source(self, pick: np.ndarray) -> np.ndarray:
        """The elements of records ``pick`` (positions in this object), one after the other: one gather."""
        data, first = self._flat()
        length = self.length[pick]
        total = int(length.sum())
        if total == 0:
            return data[:0]
        kind = np.int32 if max(len(data), total) < 2**31 else np.int64  # (element positions: narrow is less to write and read)
        before = np.cumsum(length) - length
        idx = np.repeat((first[pick] - before).astype(kind), length)
        idx += np.arange(total, dtype=kind)
        # (np.take, not data[idx]: the same elements through numpy's plain take loop instead of its
        # fancy-index iterator, which also first casts an int32 index to intp: 54 vs 101 us for 70k)
        picked: np.ndarray = np.take(data, idx)
        return picked

    def scatter(self, out: np.ndarray, dest: np.ndarray | None = None) -> None:
        """Record ``i`` into ``out[dest[rows[i]], :length[i]]`` (``out[rows[i], ...]`` without ``dest``)."""
        rows = self.rows if dest is None else dest[self.rows]
        every = np.arange(len(self.rows))
        src = self._source(every)
        col = np.arange(len(src), dtype=np.int64) - np.repeat(np.cumsum(self.length) - self.length, self.length)
        out[np.repeat(rows, self.length), col] = src

    def fill_masked(self, out: np.ndarray, slot: np.ndarray, mask: np.ndarray) -> None:
        """Every row ``r`` of ``out`` gets block row ``slot[r]``, and ``mask`` (bool, ``out``'s shape) its
        :func:`length_mask`: ``out[mask] = data``, ``out`` outside the mask left as is.

        One row gather and one masked copy for the batch: each row takes the ``wide`` elements (the
        batch's longest record) from its record's start, a contiguous window of the joined data
        (:meth:`_windows`), and ``np.copyto(..., where=mask)`` keeps only the record's own. The mask is
        made here from the records' own lengths, so it cannot disagree with the data. (The element
        gather this replaces built a per-element index, gathered and wrote through the mask: 122 vs
        67 us for 256 sequences of 50-500 int32; docs/DECISIONS.md, "Small records, the tokens read path".)"""
        where = np.empty(int(self.rows.max()) + 1 if len(self.rows) else 0, np.int64)
        where[self.rows] = np.arange(len(self.rows))
        pick = where[slot]
        length = self.length[pick]
        length_mask(length, mask)
        wide = int(length.max()) if len(length) else 0
        if wide == 0:
            return
        data, first = self._windows(wide)
        np.copyto(out[:, :wide], window_rows(data, first[pick], wide), where=mask[:, :wide])

    def pack_into(self, out: np.ndarray, base: int, room: int) -> np.ndarray:
        """Every record into the 1-d ``out``, within its ``room`` elements from ``base``; returns each
        block row's first element in ``out``. (A decoded-record store's flat region: no padding written.)

        Where the decoded buffers fit in ``room`` (small records: a header and some bytes of frames read
        for their neighbours beside each record), they are copied whole, one after another: a
        copy at memory speed, and the records stay where they are in them. Otherwise the records'
        own elements, in block-row order, one right after another (one gather; they fit, each at most
        ``room / records`` long)."""
        at = np.empty(len(self.rows), np.int64)
        if sum(len(b) for b in self.buffers) <= room:
            pos = base
            for b in self.buffers:  # (one copy per decoded buffer)
                out[pos : pos + len(b)] = b
                pos += len(b)
            at[self.rows] = base + self._firsts()
            return at
        by_row = np.argsort(self.rows, kind="stable")
        data, first = self._flat()
        length = self.length[by_row]
        total = int(length.sum())
        before = np.cumsum(length) - length
        at[self.rows[by_row]] = base + before
        if total:
            kind = np.int32 if max(len(data), total) < 2**31 else np.int64
            idx = np.repeat((first[by_row] - before).astype(kind), length)
            idx += np.arange(total, dtype=kind)
            np.take(data, idx, out=out[base : base + total], mode="clip")  # (indices in range by construction)
        return at

    def scatter_windows(self, out: np.ndarray, dest: np.ndarray, slab: int = 4096) -> None:
        """Record ``i`` into ``out[dest[rows[i]], :length[i]]``, and *anything* after it in that row up to
        the block's longest record: a decoded-record store whose reader masks each row by its length.

        For a whole pool of records (tens of thousands), where the element index of :meth:`scatter`
        would be as large as the data and a masked copy one more pass over it: each record's row is
        a window of the joined data (:meth:`_windows`) starting at the record, copied whole, a slab
        of records (by destination row) at a time, into consecutive rows as one slice."""
        n = len(self.rows)
        wide = int(self.length.max()) if n else 0
        if wide == 0:
            return
        data, first = self._windows(wide)
        target = dest[self.rows]
        by_row = np.argsort(target, kind="stable")
        for a in range(0, n, slab):  # (one step per slab of thousands of records, not per record)
            pick = by_row[a : a + slab]
            rows = target[pick]
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            out[slice(lo, hi) if hi - lo == len(rows) else rows, :wide] = window_rows(data, first[pick], wide)


def window_rows(flat: np.ndarray, starts: np.ndarray, wide: int) -> np.ndarray:
    """``[len(starts), wide]``, row ``i`` = ``flat[starts[i] : starts[i] + wide]`` (1-d contiguous ``flat``;
    every start at most ``len(flat) - wide``).

    Each window is one element of a ``void`` dtype as wide as the window, in a strided view of ``flat``
    (no copy): the fancy index copies each window whole, where over a 2-d ``[start, element]`` window
    view it copies element by element (256 windows of ~500 int32 from a 64 MB pool, gather and mask:
    70-72 vs 102-104 us; docs/DECISIONS.md, "Pooled records: each window copied whole"). (Not
    ``np.take``: it first copies a strided source whole.)"""
    if wide == 0:
        return np.empty((len(starts), 0), flat.dtype)
    size = flat.itemsize
    window = np.dtype((np.void, wide * size))
    windows = np.ndarray(shape=(len(flat) - wide + 1,), dtype=window, buffer=flat, strides=(size,))
    rows: np.ndarray = windows[starts].view(flat.dtype).reshape(len(starts), wide)
    return rows


def copy_windows(src: np.ndarray, src_starts: np.ndarray, dst: np.ndarray, dst_starts: np.ndarray, wide: int) -> None:
    """``dst[d : d + wide] = src[s : s + wide]`` for every pair of starts (1-d contiguous arrays of one
    dtype; destination windows that do not overlap): each window copied whole, as :func:`window_rows`."""
    if wide == 0 or len(src_starts) == 0:
        return
    size = src.itemsize
    window = np.dtype((np.void, wide * size))
    into = np.ndarray(shape=(len(dst) - wide + 1,), dtype=window, buffer=dst, strides=(size,))
    into[dst_starts] = np.ndarray(shape=(len(src) - wide + 1,), dtype=window, buffer=src, strides=(size,))[src_starts]


def small_int(top: int) -> type[np.signedinteger]:
    """The narrowest signed integer type holding ``0..top`` (a compare of int16 runs 3x int64's speed)."""
    return np.int16 if top < 2**15 else np.int32 if top < 2**31 else np.int64


def length_mask(lengths: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i, j] = j < lengths[i]`` for a bool ``out`` of ``[len(lengths), W]`` (``0 <= lengths <= W``).

    Row ``i`` is the window of ``W`` elements at ``W - lengths[i]`` of ``W`` ones then ``W`` zeros
    (:func:`window_rows`: a copy per row, 7.7 us for 256 rows of 500, where one broadcast compare of
    every element, kept for lengths out of range, takes 12.8 us)."""
    width = out.shape[1]
    lengths = np.asarray(lengths)
    if len(lengths) and 0 < width <= _STAIRS_MAX and 0 <= int(lengths.min()) and int(lengths.max()) <= width:
        out[...] = window_rows(_stairs(width), width - lengths, width)
        return out
    kind = small_int(width)
    np.less(np.arange(width, dtype=kind)[None, :], lengths.astype(kind).reshape(-1, 1), out=out)
    return out


_STAIRS_MAX = 1 << 20


@functools.lru_cache(maxsize=8)
def _stairs(width: int) -> np.ndarray:
    """``width`` ones then ``width`` zeros (read-only: shared by every :func:`length_mask` of this width)."""
    stairs = np.zeros(2 * width, bool)
    stairs[:width] = True
    stairs.flags.writeable = False
    return stairs


def segments_of(rows: np.ndarray, buf: np.ndarray, data_off: np.ndarray, nbytes: np.ndarray, dtype: np.dtype, buffers: list[Any]) -> Segments | None:
    """Records at byte ``data_off`` of decoded buffer ``buf`` (``nbytes`` each) as :class:`Segments`, or
    None where a record's data is not aligned to its dtype (then the caller keeps its runs)."""
    size = dtype.itemsize
    if (data_off % size).any():
        return None
    used = np.unique(buf).tolist() if len(buf) and (buf != buf[0]).any() else buf[:1].tolist()
    if len(used) == 1:  # (one buffer: no join later)
        buf = np.zeros(len(buf), np.int64)
        buffers = [buffers[used[0]]]
    else:
        remap = np.zeros(len(buffers), np.int64)
        remap[used] = np.arange(len(used))
        buf = remap[buf]
        buffers = [buffers[b] for b in used]
    views = []
    for b in buffers:
        raw = np.frombuffer(b, np.uint8)
        views.append(raw[: len(raw) - len(raw) % size].view(dtype))
    return Segments(rows, buf, data_off // size, nbytes // size, views)
