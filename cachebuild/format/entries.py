"""The block decoder's entry table: every record's index entries of the fields read, as one int64 array.

:func:`block_entries` gives ``[block records, fields, 9 + nd]`` (offset, size, nbytes, crc32,
declared decoded size, the frame layout's tail, lo, hi and shared, then the shape's first ``nd``
dims) for a block of record ids with one fancy index into a table of the whole cache. The rows of
a shard are filled the first time a block reads it, from its checked index and (zstd) its frames'
headers, parsed once per open shard (:func:`shard_table`), and refilled when the shard was closed
and opened again (a remote cache's shards come and go). Memory: ``8 * (9 + nd)`` bytes per record
and field read, for the shards read so far (the table is reserved whole, its pages fill as shards
are read; a cache whose table would pass :data:`WHOLE_TABLE_BYTES` keeps one per open shard instead,
dropped when its shard is closed), next to the index's 56 per record and field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cachebuild.format.index import MAX_NDIM
from cachebuild.errors import ShardCorruptError
from cachebuild.format.index_check import frame_headers, parse_frame_headers, trailing_frames, trailing_text
from cachebuild.format.npy import npy_header_lengths, npy_size_fault, writer_header_sizes
from cachebuild.format.shared_frames import NPY_ALIGN

if TYPE_CHECKING:
    from cachebuild.format.reader import ShardSet

__all__ = ["OFF", "SIZE", "NBYTES", "CRC", "FCS", "TAIL", "LO", "HI", "SHR", "SHAPE", "CHECK_HEADER", "WHOLE_TABLE_BYTES", "block_entries", "shard_table", "field_meta"]

OFF, SIZE, NBYTES, CRC, FCS, TAIL, LO, HI, SHR, SHAPE = range(10)  # columns of an entry table; the shape's dims follow


def shard_table(shards: ShardSet, s: int, cols: tuple[int, ...], nd: int) -> np.ndarray:
    """Shard ``s``'s index entries of fields ``cols`` as one int64 array ``[records, len(cols), 9 + nd]``:
    offset, size, nbytes, crc32, declared decoded size (``-1`` for raw payloads), the frame layout's
    tail, lo, hi and shared (:class:`~cachebuild.format.shared_frames.FrameLayout`), then the first
    ``nd`` dims of the shape."""
    sh = shards.shard(s)
    idx = sh.index[:, list(cols)]
    table = np.empty(idx.shape + (SHAPE + nd,), np.int64)
    for c, key in ((OFF, "offset"), (SIZE, "size"), (NBYTES, "nbytes"), (CRC, "crc32")):
        table[..., c] = idx[key]
    table[..., SHAPE:] = idx["shape"][..., :nd]
    table[..., FCS] = -1
    table[..., TAIL], table[..., SHR] = 0, 0
    table[..., LO] = table[..., HI] = table[..., NBYTES]
    if shards.codec == "zstd" and idx.size:
        tar = np.frombuffer(sh.view, np.uint8)
        hdr = frame_headers(tar, table[..., OFF].reshape(-1))
        table[..., FCS] = parse_frame_headers(hdr, table[..., SIZE].reshape(-1)).reshape(idx.shape)
        _refuse_trailing(shards, s, cols, tar, table, hdr)
        del tar
        layout = shards.layout(s)
        for c, arr in ((TAIL, layout.tail), (LO, layout.lo), (HI, layout.hi), (SHR, layout.shared + 2 * layout.aligned)):
            table[..., c] = arr[:, list(cols)]
        _mark_unusual_headers(shards, s, cols, idx, table)
    elif idx.size:
        _refuse_raw_shift(shards, s, cols, idx, table, np.frombuffer(sh.view, np.uint8))
    return table


CHECK_HEADER = 4
"""Bit of an entry table's ``SHR`` column: the entry's frame holds a ``.npy`` header but does not declare
the size the writer's header (for the index's shape and the manifest's dtype) and the entries' data make,
so the decoder reads its header's own length field after decoding it (:mod:`cachebuild.format.decode`).
Every frame the writer writes matches (bit clear: nothing more to do when read); a stranger's frame that
decodes shorter than its ``.npy``, whose data would otherwise be read shifted, does not."""


def _refuse_raw_shift(shards: ShardSet, s: int, cols: tuple[int, ...], idx: np.ndarray, table: np.ndarray, tar: np.ndarray) -> None:
    """Raw: a member's first payload (its ``.npy`` header, then the data) must be as long as its header's own
    length field says plus the data the index gives, else the data, read from the payload's end, would be
    shifted. Only payloads whose header is not as long as the writer's are read (12 bytes each, here, once
    per shard and field list: none of a cache the writer wrote)."""
    pack = int(shards.packs[s])
    opens = np.arange(len(idx)) % pack == 0
    for j, col in enumerate(cols):
        schema = shards.manifest.fields[col]
        t = table[:, j]
        odd = np.flatnonzero(opens & (t[:, SIZE] - t[:, NBYTES] != writer_header_sizes(schema.dtype, idx["shape"][:, j, : schema.ndim], pack)))
        if not odd.size:
            continue
        size, data = t[odd, SIZE], t[odd, NBYTES]
        fault = npy_size_fault(npy_header_lengths([tar], np.zeros(len(odd), np.int64), t[odd, OFF], size), size, data, "stored")
        if fault is not None:
            raise ShardCorruptError(f"{shards.where(int(shards.starts[s]) + int(odd[fault[0]]), schema.name)}: {fault[1]}")


def _mark_unusual_headers(shards: ShardSet, s: int, cols: tuple[int, ...], idx: np.ndarray, table: np.ndarray) -> None:
    """Set :data:`CHECK_HEADER` on the entries of shard ``s`` whose header-holding frame declares another
    size than the writer's header plus the data (one header made per distinct shape, per field)."""
    pack = int(shards.packs[s])
    for j, col in enumerate(cols):
        t = table[:, j]
        header = t[:, HI] > t[:, LO]  # (the frame opens its member: a header is allowed)
        if not header.any():
            continue
        schema = shards.manifest.fields[col]
        writer = writer_header_sizes(schema.dtype, idx["shape"][:, j, : schema.ndim], pack)
        data = t[:, LO] - ((t[:, SHR] & 2) != 0) * NPY_ALIGN
        t[:, SHR] |= CHECK_HEADER * (header & (t[:, FCS] != writer + data))


def _refuse_trailing(shards: ShardSet, s: int, cols: tuple[int, ...], tar: np.ndarray, table: np.ndarray, hdr: np.ndarray) -> None:
    """Refuse an entry of shard ``s`` whose zstd frame ends before the entry does (bytes after it, which
    the decoder would skip and ``zstd -d`` would decode): the block-header walk ``verify`` makes, here
    once per shard and field list when its table is filled, not per read."""
    flat = table.reshape(-1, table.shape[-1])
    bad, ends = trailing_frames(tar, flat[:, OFF], flat[:, SIZE], flat[:, FCS], hdr)
    if bad.size:
        r, j = divmod(int(bad[0]), len(cols))
        name = shards.manifest.fields[cols[j]].name
        raise ShardCorruptError(f"{shards.where(int(shards.starts[s]) + r, name)}: {trailing_text(int(ends[0]), int(flat[bad[0], SIZE]))}")


WHOLE_TABLE_BYTES = 256 << 20
"""A cache whose entry table would be larger keeps one table per shard (a block gathers shard by shard):
a table reserved whole for a huge cache could be refused by the kernel's overcommit check."""


class _CacheTable:
    """The entry table of a whole cache for one field list (``rows``), or of each shard read (``parts``,
    for caches over :data:`WHOLE_TABLE_BYTES`); ``version[s]``: the shard set's
    :attr:`~cachebuild.format.reader.ShardSet.opens` count of shard ``s`` when it was filled (-1: not yet)."""

    def __init__(self, records: int, nf: int, nd: int, shards: int):
        whole = records * nf * (SHAPE + nd) * 8 <= WHOLE_TABLE_BYTES
        self.rows = np.empty((records, nf, SHAPE + nd), np.int64) if whole else None
        self.parts: dict[int, np.ndarray] = {}
        self.version = np.full(shards, -1, np.int64)

    def forget(self, s: int) -> None:
        """Shard ``s`` was closed: its own table goes with it (per-shard mode; a cache read shard by shard,
        as ``verify`` and a remote cache's eviction do, must not keep every shard's table: that memory is
        what the per-shard mode exists to avoid). The whole table's rows stay, refilled if ``s`` reopens."""
        self.parts.pop(s, None)


def block_entries(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, cols: list[int], nd: int) -> np.ndarray:
    """Entries ``[block records, len(cols), 9 + nd]`` of records ``ids`` (shard ``s``, record ``local`` in
    it): one fancy index (for a cache over :data:`WHOLE_TABLE_BYTES`, one per shard touched).

    A shard the block touches that is not filled yet, or was closed or opened again since it was
    filled (its open count moved), has its rows (re)filled first: one comparison finds them."""
    key = (tuple(cols), nd)
    tables: dict[tuple[tuple[int, ...], int], _CacheTable] = shards.__dict__.setdefault("_entry_tables", {})
    ct = tables.get(key)
    if ct is None:
        ct = tables[key] = _CacheTable(int(shards.starts[-1]), len(cols), nd, len(shards.starts) - 1)
    stale = ct.version[s] != shards.opens[s]
    if stale.any():
        for t in np.unique(s[stale]).tolist():
            shards.shard(t)  # (opens it: the count moves first)
            if ct.rows is not None:
                ct.rows[shards.starts[t] : shards.starts[t + 1]] = shard_table(shards, t, key[0], nd)
            else:
                ct.parts[t] = shard_table(shards, t, key[0], nd)
            ct.version[t] = shards.opens[t]
    if ct.rows is not None:
        rows: np.ndarray = ct.rows[ids]
        return rows
    return _by_shard(ct.parts, s, local, len(cols), nd)


def _by_shard(parts: dict[int, np.ndarray], s: np.ndarray, local: np.ndarray, nf: int, nd: int) -> np.ndarray:
    """Entries of the block gathered from per-shard tables, one fancy index per shard touched."""
    entries = np.empty((len(s), nf, SHAPE + nd), np.int64)
    order = np.argsort(s, kind="stable")
    bounds = np.flatnonzero(np.diff(s[order])) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)]):
        rows = order[a:b]
        entries[rows] = parts[int(s[rows[0]])][local[rows]]
    return entries


def field_meta(shards: ShardSet, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per requested field: ndim, itemsize, max shape (padded with 1 to MAX_NDIM), radix multipliers; radix fits int64."""
    hit = shards.meta_cache.get(names)
    if hit is not None:
        return hit
    manifest = shards.manifest
    nf = len(names)
    ndim = np.zeros(nf, np.int64)
    itemsize = np.zeros(nf, np.int64)
    max_shape = np.ones((nf, MAX_NDIM), np.int64)
    mult = np.zeros((nf, MAX_NDIM), np.int64)
    fits = True
    for f, name in enumerate(names):
        schema = manifest.schema(name)
        ndim[f], itemsize[f] = schema.ndim, np.dtype(schema.dtype).itemsize
        max_shape[f, : schema.ndim] = schema.max_shape
        acc = 1
        for d in reversed(range(schema.ndim)):
            mult[f, d] = acc
            acc *= int(schema.max_shape[d]) + 1
        fits &= acc < 2**40
    out = shards.meta_cache[names] = (ndim, itemsize, max_shape, mult, bool(fits))
    return out
