"""Decode many records' fields at once from memory-mapped shards, through the sidecar index.

No tar parsing and no ``.npy`` header parsing: the index says where each
member's payload lies, how long its array data is (``nbytes``) and its shape;
the manifest says its dtype. For a block of record ids:

* zstd: every wanted payload, as a zero-copy slice of the shard's mmap, goes
  to one ``multi_decompress_to_buffer`` call (zstd checks each frame's content
  checksum); the array data is the last ``nbytes`` of each decoded member, or,
  where entries share a frame (:mod:`cachebuild.format.shared_frames`), ends
  ``tail`` bytes before it: each shared frame is decoded once per block and its
  records' data gathered into one staging buffer (one numpy gather per buffer);
* raw: the array data is copied from the mmap into one staging buffer.

Frames are ordered by (field, shape), so records of one shape sit at a uniform
stride and each such run becomes one strided numpy view: padding into a batch
is one array assignment per run (:meth:`FieldBlock.scatter`), not one per
record. Faults raise :class:`ShardCorruptError` naming the shard, record and
field. (:class:`ShardSet`, the open shards, lives in :mod:`cachebuild.format.reader`;
whole records and the strict checks of `verify` are in :mod:`cachebuild.format.records`.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.index import MAX_NDIM
from cachebuild.format.index_check import frame_headers, parse_frame_headers
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.json_values import read_json_values
from cachebuild.format.reader import ShardSet
from cachebuild.format.rows import as_rows
from cachebuild.format.segments import Segments, segments_of
from cachebuild.format.shared_frames import declared_ok, distinct_frames, gather_shared
from cachebuild.format.zstd_output import OutputBuffer, first_bad_frame, packed_offsets

try:  # ISA-L's crc32: zlib's checksum, about 4x faster (raw caches check every member read); zlib is the fallback
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

__all__ = ["FieldBlock", "read_block"]

_SEGMENT_RUNS = 16
"""A 1-d field whose block splits into more runs than this (many lengths) is scattered with one gather, not run by run."""
_ITEM_RE = re.compile(r"item (\d+)")
_THREADED_MIN_BYTES = 2 << 20


@dataclass
class FieldBlock:
    """One field of a block of records, decoded: per-record shapes and strided runs of data.

    ``runs`` is a list of ``(rows, data)``: ``data[i]`` is the array of the
    block's record ``rows[i]`` (all of one shape in a run). JSON fields carry
    ``values`` (one dict per record) instead.
    """

    name: str
    dtype: np.dtype | None
    shapes: np.ndarray
    runs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    values: list[Any] | None = None
    keep: Any = None  # owner of the decoded bytes the runs view
    segments: Segments | None = None  # instead of runs: a 1-d field of many lengths

    def scatter(self, out: np.ndarray, dest: np.ndarray | None = None) -> None:
        """Write record ``i`` into ``out[dest[i], :s0, :s1, ...]`` (its own shape; the rest is left as is).

        ``out`` has a leading batch axis and at least the record's extent on
        every other axis; numpy casts to ``out``'s dtype.
        """
        if self.segments is not None:
            self.segments.scatter(out, dest)
            return
        for rows, data in self.runs:
            where = rows if dest is None else dest[rows]
            target = out[(slice(None),) + tuple(slice(0, int(n)) for n in data.shape[1:])]
            rowwise = as_rows(target, data)
            if rowwise is not None:
                target, data = rowwise
            target[where] = data

    def dense(self) -> np.ndarray:
        """All records stacked, for a field whose shape is the same in every record of the block."""
        if len(self.shapes) and (self.shapes != self.shapes[0]).any():
            raise ValueError(f"field '{self.name}' varies in shape inside the block; scatter it into a padded array")
        shape = tuple(int(n) for n in self.shapes[0]) if len(self.shapes) else ()
        out = np.empty((len(self.shapes),) + shape, dtype=self.dtype)
        self.scatter(out)
        return out


@lru_cache(maxsize=64)
def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


@dataclass
class _Frames:
    """Every wanted (record, field) payload of a block, in (field, shape) order."""

    rec: np.ndarray  # row in the block
    fld: np.ndarray  # position in the requested array-field list
    group: np.ndarray  # (field, shape) group id, increasing along the frames
    shard: np.ndarray
    local: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    nbytes: np.ndarray
    crc: np.ndarray
    fcs: np.ndarray  # declared decoded size of each zstd frame (-1: not declared, -2: not a zstd frame)
    tail: np.ndarray  # decoded bytes after the record's data in its frame (0 unless the frame is shared)
    lo: np.ndarray  # the decoded size the frame may declare, at least
    hi: np.ndarray  # and at most
    shared: np.ndarray  # the frame holds other entries too (bit 0; bit 1: its declared size is lo + a multiple of 64)
    group_shape: list[tuple[int, ...]]


_OFF, _SIZE, _NBYTES, _CRC, _FCS, _TAIL, _LO, _HI, _SHR, _SHAPE = range(10)  # columns of an entry table; the shape's dims follow


def _shard_table(shards: ShardSet, s: int, cols: tuple[int, ...], nd: int) -> np.ndarray:
    """Shard ``s``'s index entries of fields ``cols`` as one int64 array ``[records, len(cols), 9 + nd]``:
    offset, size, nbytes, crc32, declared decoded size, the frame layout's tail, lo, hi and shared
    (:class:`~cachebuild.format.shared_frames.FrameLayout`), then the first ``nd`` dims of the shape.

    Built once per open shard and field list, and kept with the shard: a block then gathers each
    record's entries in one fancy index, and the zstd frames' declared sizes (read from their headers)
    are parsed once per shard instead of once per block (``-1`` for raw payloads). Memory: ``8 * (9 + nd)``
    bytes per record and field read, next to the index's 56 per record and field.
    """
    sh = shards.shard(s)
    tables: dict[tuple[int, ...], np.ndarray] = sh.__dict__.setdefault("_decode_tables", {})
    table = tables.get(cols)
    if table is None:
        idx = sh.index[:, list(cols)]
        table = np.empty(idx.shape + (_SHAPE + nd,), np.int64)
        for c, key in ((_OFF, "offset"), (_SIZE, "size"), (_NBYTES, "nbytes"), (_CRC, "crc32")):
            table[..., c] = idx[key]
        table[..., _SHAPE:] = idx["shape"][..., :nd]
        table[..., _FCS] = -1
        table[..., _TAIL], table[..., _SHR] = 0, 0
        table[..., _LO] = table[..., _HI] = table[..., _NBYTES]
        if shards.codec == "zstd" and idx.size:
            hdr = frame_headers(np.frombuffer(sh.view, np.uint8), table[..., _OFF].reshape(-1))
            table[..., _FCS] = parse_frame_headers(hdr, table[..., _SIZE].reshape(-1)).reshape(idx.shape)
            layout = shards.layout(s)
            for c, arr in ((_TAIL, layout.tail), (_LO, layout.lo), (_HI, layout.hi), (_SHR, layout.shared + 2 * layout.aligned)):
                table[..., c] = arr[:, list(cols)]
        table = tables[cols] = table
    return table


def _gather_entries(shards: ShardSet, s: np.ndarray, local: np.ndarray, cols: list[int], nd: int) -> np.ndarray:
    """Entries ``[block records, len(cols), 9 + nd]`` of the block (:func:`_shard_table`), one fancy index per shard touched."""
    entries = np.empty((len(s), len(cols), _SHAPE + nd), np.int64)
    key = tuple(cols)
    if not len(s):
        return entries
    if (s == s[0]).all():
        entries[...] = _shard_table(shards, int(s[0]), key, nd)[local]
        return entries
    order = np.argsort(s, kind="stable")
    bounds = np.flatnonzero(np.diff(s[order])) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)]):  # one slice per shard (np.split costs more)
        rows = order[a:b]
        entries[rows] = _shard_table(shards, int(s[rows[0]]), key, nd)[local[rows]]
    return entries


def _field_meta(shards: "ShardSet", names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
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


def _plan_frames(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, names: list[str], entries: np.ndarray) -> tuple[_Frames, list[np.ndarray]]:
    """Order the frames by (field, shape) (all fields at once)."""
    m, nf = entries.shape[:2]
    ndim, _, _, mult, fits = _field_meta(shards, tuple(names))
    nd = entries.shape[2] - _SHAPE
    shape = entries[..., _SHAPE:]  # [m, nf, nd], unused dims are 1
    used = np.arange(nd)[None, :] < ndim[:, None]  # [nf, nd]
    shape_used = np.where(used, shape, 1)
    # Every entry was checked against the schemas and the tar when its shard was opened
    # (cachebuild.format.index_check), so shapes, lengths and offsets are trusted here.
    all_shapes = [shape[:, f, : ndim[f]] for f in range(nf)]
    if fits:
        keys = np.einsum("mfd,fd->fm", shape_used, mult[:, :nd])  # [nf, m], equal iff shapes equal
    else:
        keys = np.stack([np.unique(all_shapes[f], axis=0, return_inverse=True)[1].reshape(-1) for f in range(nf)])
    # Frame t = (field t // m, block row t % m); sort by (field, shape), stable in block order.
    span = int(keys.max()) + 1 if keys.size else 1
    combined = (np.arange(nf, dtype=np.int64)[:, None] * span + keys).reshape(-1)
    order = np.argsort(combined, kind="stable")
    sk = combined[order]
    new_group = np.ones(len(sk), bool)
    new_group[1:] = sk[1:] != sk[:-1]
    group = np.cumsum(new_group) - 1
    fld, rec = np.divmod(order, m) if m else (order, order)
    starts = np.flatnonzero(new_group)
    group_shape = [tuple(row[: ndim[f]]) for f, row in zip(fld[starts].tolist(), shape[rec[starts], fld[starts]].tolist())]
    flat = entries.transpose(1, 0, 2).reshape(-1, _SHAPE + nd)[order]
    frames = _Frames(
        rec=rec,
        fld=fld,
        group=group,
        shard=s[rec],
        local=local[rec],
        offset=flat[:, _OFF],
        size=flat[:, _SIZE],
        nbytes=flat[:, _NBYTES],
        crc=flat[:, _CRC],
        fcs=flat[:, _FCS],
        tail=flat[:, _TAIL],
        lo=flat[:, _LO],
        hi=flat[:, _HI],
        shared=flat[:, _SHR],
        group_shape=group_shape,
    )
    return frames, all_shapes


def _corrupt(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames, i: int, why: str) -> ShardCorruptError:
    return ShardCorruptError(f"{shards.where(int(ids[fr.rec[i]]), names[fr.fld[i]])}: {why}")


def _payloads(shards: ShardSet, fr: _Frames, pick: np.ndarray | slice = slice(None)) -> list[bytes | bytearray | memoryview]:
    """Zero-copy slices of the shards' mmaps: the frames ``pick`` (all by default), in order."""
    views = {int(s): shards.shard(int(s)).view for s in np.unique(fr.shard[pick])}
    return [views[s][o : o + z] for s, o, z in zip(fr.shard[pick].tolist(), fr.offset[pick].tolist(), fr.size[pick].tolist())]


def _decode_zstd(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames, threads: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, Any]:
    """Decompress every distinct frame in one call; return the output buffers and, per entry, buffer id and data offset."""
    shared = (fr.shared & 1).astype(bool)
    pick, slot = distinct_frames(fr.shard, fr.offset, shared)
    payloads = _payloads(shards, fr, pick)
    dctx = zstandard.ZstdDecompressor()
    if threads > 1 and int(fr.size[pick].sum()) < _THREADED_MIN_BYTES:
        threads = 1  # starting threads costs more than a small block's decompression
    sizes = _declared_sizes(shards, ids, names, fr)[pick]
    try:
        out = dctx.multi_decompress_to_buffer(payloads, decompressed_sizes=sizes.tobytes(), threads=threads)
    except zstandard.ZstdError as exc:
        m = _ITEM_RE.search(str(exc))
        i = int(m.group(1)) if m else first_bad_frame(dctx, payloads)
        raise _corrupt(shards, ids, names, fr, int(pick[i]), "zstd: " + _ITEM_RE.sub("frame", str(exc))) from exc  # the record is named; the block position is not news
    n = len(payloads)
    lens = sizes.astype(np.int64)  # zstd checked: each frame decoded to exactly its declared size
    offs = packed_offsets(out, lens)
    if offs is None:  # several output buffers: ask for each member's place
        segs = [out[i] for i in range(n)]
        offs = np.fromiter((sg.offset for sg in segs), np.int64, n)
        lens = np.fromiter((len(sg) for sg in segs), np.int64, n)
    starts = np.flatnonzero(offs == 0)
    buf_of = np.cumsum(offs == 0) - 1
    buffers = []
    ends = np.append(starts[1:], n)
    for a, b in zip(starts.tolist(), ends.tolist()):
        size = int(offs[b - 1] + lens[b - 1])
        addr = np.frombuffer(out[a], np.uint8).ctypes.data  # type: ignore[call-overload]  # a BufferSegment is a buffer
        buffers.append(np.asarray(OutputBuffer(addr, size, out)))
    eoff, elen, buf_id = offs[slot], lens[slot], buf_of[slot]
    for i in np.flatnonzero(elen < fr.tail + fr.nbytes)[:1].tolist():
        raise _corrupt(shards, ids, names, fr, i, f"decoded {int(elen[i])} bytes < {int(fr.tail[i] + fr.nbytes[i])} bytes of array data")
    data_off = eoff + elen - fr.tail - fr.nbytes  # (the data ends `tail` bytes before its frame's end)
    stride_ok = np.ones(len(eoff), bool)
    stride_ok[1:] = (eoff[1:] == eoff[:-1] + elen[:-1]) & (elen[1:] == elen[:-1]) & ~shared[1:] & ~shared[:-1]
    if shared.any():
        gather_shared(shared, fr.nbytes, buffers, buf_id, data_off, stride_ok)
    return buffers, buf_id, data_off, (out, stride_ok)


def _declared_sizes(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames) -> np.ndarray:
    """Each frame's declared decoded size, refused unless it is the index's array data plus a small
    ``.npy`` header: nothing is allocated for a frame that claims more (a decompression bomb)."""
    fcs = fr.fcs  # parsed from the frame headers once per shard (_shard_table)
    if (fcs == -2).any():
        i = int(np.flatnonzero(fcs == -2)[0])
        raise _corrupt(shards, ids, names, fr, i, "not a zstd frame (bad frame header)")
    # (fr.lo, fr.hi: the entry's data, its frame's other entries' where shared, and a .npy header only in a member's first frame)
    bad = np.flatnonzero(~declared_ok(fcs, fr.lo, fr.hi, fr.shared >= 2))
    if bad.size:
        i = int(bad[0])
        what = "does not declare its size" if fcs[i] < 0 else f"declares {int(fcs[i])} bytes"
        raise _corrupt(shards, ids, names, fr, i, f"zstd frame {what}, the index allows {int(fr.lo[i])}..{int(fr.hi[i])} (corrupt or a decompression bomb)")
    return fcs.astype(np.uint64)


def _decode_raw(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, Any]:
    """Every frame's payload, back to back in one buffer (one ``bytes.join``: a C loop, no Python copy per member),
    each checked against its crc32 first; the array data is the last ``nbytes`` of each payload.

    Payloads of one (field, shape) group have one size, so they sit at a uniform stride. The data is
    aligned for its dtype when the ``.npy`` headers are (64 bytes in every shard we write; fields are
    ordered widest dtype first); numpy reads a stranger's unaligned data all the same.
    """
    payloads = _payloads(shards, fr)
    if shards.verify == "crc":
        bad = np.flatnonzero(np.fromiter(map(crc32, payloads), np.int64, len(payloads)) != fr.crc)
        if bad.size:
            raise _corrupt(shards, ids, names, fr, int(bad[0]), "crc32 mismatch (corrupt payload)")
    joined = b"".join(payloads)
    data_off = np.cumsum(fr.size) - fr.nbytes
    stride_ok = np.ones(len(payloads), bool)
    if len(payloads) > 1:
        stride_ok[1:] = (fr.size[1:] == fr.size[:-1]) & (fr.nbytes[1:] == fr.nbytes[:-1])
    return [np.frombuffer(joined, np.uint8)], np.zeros(len(payloads), np.int64), data_off, (joined, stride_ok)


def read_block(shards: ShardSet, ids: np.ndarray, fields: Sequence[str], threads: int = 1) -> dict[str, FieldBlock]:
    """Decode ``fields`` of the records ``ids`` (global ids, any order, repeats allowed).

    Returns one :class:`FieldBlock` per field; its row ``i`` is record ``ids[i]``.
    ``threads`` is handed to zstd (1 inside DataLoader workers).
    """
    ids = np.asarray(ids, dtype=np.int64)
    s, local = shards.locate(ids)
    for name in fields:
        if name not in shards.field_pos:
            raise KeyError(f"field {name!r} not in cache {shards.root} (has: {', '.join(shards.field_pos)})")
    json_names = [n for n in fields if shards.manifest.fields[shards.field_pos[n]].dtype == JSON_DTYPE]
    # Widest dtypes first: every decoded member keeps the next one aligned for its dtype.
    arr_names = sorted((n for n in fields if n not in json_names), key=lambda n: -np.dtype(shards.manifest.schema(n).dtype).itemsize)
    out: dict[str, FieldBlock] = {}
    if arr_names:
        nd = max(shards.manifest.schema(n).ndim for n in arr_names)
        entries = _gather_entries(shards, s, local, [shards.field_pos[n] for n in arr_names], nd)
        fr, shapes = _plan_frames(shards, ids, s, local, arr_names, entries)
        if shards.codec == "zstd":
            buffers, buf_id, data_off, (keep, stride_ok) = _decode_zstd(shards, ids, arr_names, fr, threads)
        else:
            buffers, buf_id, data_off, (keep, stride_ok) = _decode_raw(shards, ids, arr_names, fr)
        runs = _runs(fr, buf_id, stride_ok)
        per_field = np.bincount(fr.fld[[a for a, _ in runs]], minlength=len(arr_names)) if runs else np.zeros(len(arr_names), np.int64)
        for f, name in enumerate(arr_names):
            dtype = np.dtype(shards.manifest.schema(name).dtype)
            out[name] = FieldBlock(name, dtype, shapes[f], keep=keep)
            if per_field[f] > _SEGMENT_RUNS and shards.manifest.schema(name).ndim == 1:
                pick = np.flatnonzero(fr.fld == f)
                out[name].segments = segments_of(fr.rec[pick], buf_id[pick], data_off[pick], fr.nbytes[pick], dtype, buffers)
        blocks = [out[name] for name in arr_names]
        for a, b in runs:
            blk = blocks[fr.fld[a]]
            if blk.segments is not None:
                continue
            shape = fr.group_shape[fr.group[a]]
            stride = int(data_off[a + 1] - data_off[a]) if b - a > 1 else 0
            dtype = blk.dtype
            data = np.ndarray((b - a,) + shape, dtype=dtype, buffer=buffers[buf_id[a]], offset=int(data_off[a]), strides=(stride,) + _c_strides(shape, dtype.itemsize))
            blk.runs.append((fr.rec[a:b], data))
    for name in json_names:
        out[name] = FieldBlock(name, None, np.zeros((len(ids), 0), np.int64), values=read_json_values(shards, ids, s, local, name))
    return out


def _runs(fr: _Frames, buf_id: np.ndarray, stride_ok: np.ndarray) -> list[tuple[int, int]]:
    """Maximal ranges of frames of one (field, shape) group in one buffer at a uniform stride."""
    n = len(fr.rec)
    if n == 0:
        return []
    brk = np.ones(n, bool)
    if n > 1:
        brk[1:] = (fr.group[1:] != fr.group[:-1]) | (buf_id[1:] != buf_id[:-1]) | ~stride_ok[1:]
    starts = np.flatnonzero(brk)
    return list(zip(starts.tolist(), np.append(starts[1:], n).tolist()))
