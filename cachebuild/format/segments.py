"""A 1-d field's decoded records as (buffer, offset, length), padded into a batch with one gather.

Used by :func:`cachebuild.format.decode.read_block` for fields of many lengths
(ragged token sequences), where one strided run per length would cost a
Python-level view and assignment per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Segments", "segments_of"]


@dataclass
class Segments:
    """A 1-d field's records as (buffer, element offset, length), scattered with one fancy index
    per buffer: a block of ragged sequences (hundreds of lengths) would otherwise be hundreds of
    one-record runs, each a Python-level view and assignment."""

    rows: np.ndarray  # block row of each record
    buf: np.ndarray  # which buffer holds it
    start: np.ndarray  # its first element in that buffer (viewed as the field's dtype)
    length: np.ndarray  # its elements
    buffers: list[np.ndarray]  # the decoded buffers, each viewed as the field's dtype

    def scatter(self, out: np.ndarray, dest: np.ndarray | None = None) -> None:
        rows = self.rows if dest is None else dest[self.rows]
        for b in np.unique(self.buf).tolist():
            pick = np.flatnonzero(self.buf == b) if len(self.buffers) > 1 else slice(None)
            length = self.length[pick]
            before = np.cumsum(length) - length
            col = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(before, length)
            out[np.repeat(rows[pick], length), col] = self.buffers[b][np.repeat(self.start[pick], length) + col]


def segments_of(rows: np.ndarray, buf: np.ndarray, data_off: np.ndarray, nbytes: np.ndarray, dtype: np.dtype, buffers: list[Any]) -> Segments | None:
    """Records at byte ``data_off`` of decoded buffer ``buf`` (``nbytes`` each) as :class:`Segments`, or
    None where a record's data is not aligned to its dtype (then the caller keeps its runs)."""
    size = dtype.itemsize
    if (data_off % size).any():
        return None
    views = []
    for b in buffers:
        raw = np.frombuffer(b, np.uint8)
        views.append(raw[: len(raw) - len(raw) % size].view(dtype))
    return Segments(rows, buf, data_off // size, nbytes // size, views)
