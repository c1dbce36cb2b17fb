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
record. A 1-d field of many lengths (ragged token sequences: hundreds of
one-record runs) is kept as :class:`~cachebuild.format.segments.Segments`
instead, read where zstd left it (shared frames included, no staging copy) and
written into a batch with one gather. The index entries of a block come from one
table of the whole cache (:mod:`cachebuild.format.entries`). Faults raise :class:`ShardCorruptError` naming the shard, record and
field. (:class:`ShardSet`, the open shards, lives in :mod:`cachebuild.format.reader`;
whole records and the strict checks of `verify` are in :mod:`cachebuild.format.records`.)
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.entries import CHECK_HEADER, CRC, FCS, HI, LO, NBYTES, OFF, SHAPE, SHR, SIZE, TAIL, block_entries, field_meta
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.json_values import read_json_values
from cachebuild.format.npy import npy_header_lengths, npy_size_fault
from cachebuild.format.reader import ShardSet
from cachebuild.format.rows import as_rows
from cachebuild.format.segments import Segments, segments_of
from cachebuild.format.shared_frames import NPY_ALIGN, declared_ok, distinct_frames, gather_shared
from cachebuild.format.zstd_output import Payloads, ShardFrames, decompress_chunks, first_bad_frame, shard_runs

try:  # ISA-L's crc32: zlib's checksum, about 4x faster (raw caches check every member read); zlib is the fallback
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

__all__ = ["FieldBlock", "read_block"]

_SEGMENT_RUNS = 16
_LOCAL = threading.local()
"""A 1-d field whose block splits into more runs than this (many lengths) is scattered with one gather, not run by run."""
_ITEM_RE = re.compile(r"item (\d+)")
_THREADED_MIN_BYTES = 2 << 20
_RUNS_PER_FRAME = 4
"""Frames go to zstd as :class:`~cachebuild.format.zstd_output.ShardFrames` when they come in runs of one shard at
least this long on average (one ``BufferWithSegments`` a run then costs less than a memoryview a frame)."""


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
    shared: np.ndarray  # the frame holds other entries too (bit 0; bit 1: its declared size is lo + a multiple of 64; bit 2: CHECK_HEADER)
    shape: np.ndarray  # [frames, nd] the entry's shape (unused dims 1)


def _plan_frames(shards: ShardSet, s: np.ndarray, local: np.ndarray, names: list[str], entries: np.ndarray) -> tuple[_Frames, list[np.ndarray], np.ndarray]:
    """Order the frames by (field, shape) (all fields at once); also the (field, shape) groups per field."""
    m, nf = entries.shape[:2]
    ndim, _, _, mult, fits = field_meta(shards, tuple(names))
    nd = entries.shape[2] - SHAPE
    shape = entries[..., SHAPE:]  # [m, nf, nd], unused dims are 1
    # Every entry was checked against the schemas and the tar when its shard was opened
    # (cachebuild.format.index_check), so shapes, lengths and offsets are trusted here.
    all_shapes = [shape[:, f, : ndim[f]] for f in range(nf)]
    if fits:
        keys = np.einsum("mfd,fd->fm", shape, mult[:, :nd])  # [nf, m], equal iff shapes equal (unused dims are 1, their multiplier 0)
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
    flat = entries.transpose(1, 0, 2).reshape(-1, SHAPE + nd)[order]
    c = flat.T
    frames = _Frames(rec, fld, group, s[rec], local[rec], c[OFF], c[SIZE], c[NBYTES], c[CRC], c[FCS], c[TAIL], c[LO], c[HI], c[SHR], flat[:, SHAPE:])
    return frames, all_shapes, np.bincount(fld[new_group], minlength=nf)


def _corrupt(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames, i: int, why: str) -> ShardCorruptError:
    return ShardCorruptError(f"{shards.where(int(ids[fr.rec[i]]), names[fr.fld[i]])}: {why}")


def _payloads(shards: ShardSet, fr: _Frames, pick: np.ndarray | slice = slice(None)) -> list[bytes | bytearray | memoryview]:
    """Zero-copy slices of the shards' mmaps: the frames ``pick`` (all by default), in order."""
    where = fr.shard[pick].tolist()
    views = {s: shards.shard(s).view for s in set(where)}
    return [views[s][o : o + z] for s, o, z in zip(where, fr.offset[pick].tolist(), fr.size[pick].tolist())]


def _frame_source(shards: ShardSet, fr: _Frames, pick: np.ndarray) -> Payloads:
    """The frames ``pick`` for zstd: as :class:`ShardFrames` where they come in runs of one shard (a block in
    record order: a ``twins`` pool, ~300 runs for 5,000 frames), else as a list of slices (a shuffled block)."""
    shard = fr.shard[pick]
    if len(shard) < _RUNS_PER_FRAME * len(shard_runs(shard)):
        return _payloads(shards, fr, pick)
    return ShardFrames({s: shards.shard(s).view for s in np.unique(shard).tolist()}, shard, fr.offset[pick], fr.size[pick])


def _decompressor() -> Any:
    """This thread's zstd decompressor (made once: each batched call copies its context anyway)."""
    dctx = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
    return dctx


def _decode_zstd(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames, threads: int, direct: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, Any]:
    """Decompress every distinct frame in one call; return the output buffers and, per entry, buffer id and data offset.

    Entries of shared frames are gathered into a staging buffer (uniform strides for the runs),
    except those marked ``direct`` (read in place, through :class:`Segments`)."""
    shared = (fr.shared & 1).astype(bool)
    pick, slot = distinct_frames(fr.shard, fr.offset, shared)
    payloads = _frame_source(shards, fr, pick)
    dctx = _decompressor()
    if threads > 1 and int(fr.size[pick].sum()) < _THREADED_MIN_BYTES:
        threads = 1  # starting threads costs more than a small block's decompression
    sizes = _declared_sizes(shards, ids, names, fr)[pick]
    try:
        buffers, buf_of, offs, out = decompress_chunks(dctx, payloads, sizes, threads)
    except zstandard.ZstdError as exc:
        m = _ITEM_RE.search(str(exc))
        i = int(m.group(1)) + getattr(exc, "item_base", 0) if m else first_bad_frame(dctx, payloads)
        raise _corrupt(shards, ids, names, fr, int(pick[i]), "zstd: " + _ITEM_RE.sub("frame", str(exc))) from exc  # the record is named; the block position is not news
    lens = sizes.astype(np.int64)  # zstd checked: each frame decoded to exactly its declared size
    _check_npy_starts(shards, ids, names, fr, pick, buffers, buf_of, offs, lens)
    eoff, elen, buf_id = offs[slot], lens[slot], buf_of[slot]
    for i in np.flatnonzero(elen < fr.tail + fr.nbytes)[:1].tolist():
        raise _corrupt(shards, ids, names, fr, i, f"decoded {int(elen[i])} bytes < {int(fr.tail[i] + fr.nbytes[i])} bytes of array data")
    data_off = eoff + elen - fr.tail - fr.nbytes  # (the data ends `tail` bytes before its frame's end)
    stride_ok = np.ones(len(eoff), bool)
    stride_ok[1:] = (eoff[1:] == eoff[:-1] + elen[:-1]) & (elen[1:] == elen[:-1]) & ~shared[1:] & ~shared[:-1]
    stage = shared & ~direct
    if stage.any():
        gather_shared(stage, fr.nbytes, buffers, buf_id, data_off, stride_ok)
    return buffers, buf_id, data_off, (out, stride_ok)


def _check_npy_starts(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames, pick: np.ndarray, buffers: list[np.ndarray], buf_of: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
    """A decoded frame that holds a ``.npy`` header and does not declare the size the writer's header and the
    data make (marked :data:`~cachebuild.format.entries.CHECK_HEADER` when its shard's entries were read; none
    the writer wrote) must be a ``.npy`` header, as long as its own length field says, then exactly the
    entries' data the index says. The data is read from the frame's end, so a frame that decodes to fewer
    bytes (a well-formed, checksummed frame of a shortened ``.npy``) would put the record's data inside the
    header: shifted data. ``lo`` is the entries' data (+ :data:`NPY_ALIGN` for a shared frame)."""
    has = np.flatnonzero(fr.shared[pick] & CHECK_HEADER)
    if not has.size:
        return
    at, size = pick[has], lens[has]
    data = fr.lo[at] - ((fr.shared[at] & 2) != 0) * NPY_ALIGN
    fault = npy_size_fault(npy_header_lengths(buffers, buf_of[has], offs[has], size), size, data, "decoded")
    if fault is not None:
        raise _corrupt(shards, ids, names, fr, int(at[fault[0]]), fault[1])


def _declared_sizes(shards: ShardSet, ids: np.ndarray, names: list[str], fr: _Frames) -> np.ndarray:
    """Each frame's declared decoded size, refused unless it is the index's array data plus a small
    ``.npy`` header: nothing is allocated for a frame that claims more (a decompression bomb)."""
    fcs = fr.fcs  # parsed from the frame headers once per open shard (cachebuild.format.entries)
    if (fcs == -2).any():
        i = int(np.flatnonzero(fcs == -2)[0])
        raise _corrupt(shards, ids, names, fr, i, "not a zstd frame (bad frame header)")
    # (fr.lo, fr.hi: the entry's data, its frame's other entries' where shared, and a .npy header only in a member's first frame)
    bad = np.flatnonzero(~declared_ok(fcs, fr.lo, fr.hi, (fr.shared & 2) != 0))
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
    if not len(ids):  # (nothing to decode: zstd is not asked for no frames, which it does not survive)
        for name in arr_names:
            schema = shards.manifest.schema(name)
            out[name] = FieldBlock(name, np.dtype(schema.dtype), np.zeros((0, schema.ndim), np.int64))
    elif arr_names:
        _array_blocks(shards, ids, s, local, arr_names, threads, out)
    for name in json_names:
        out[name] = FieldBlock(name, None, np.zeros((len(ids), 0), np.int64), values=read_json_values(shards, ids, s, local, name))
    return out


def _array_blocks(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, names: list[str], threads: int, out: dict[str, FieldBlock]) -> None:
    """Decode the array fields ``names`` of a block into ``out``: a 1-d field of many lengths as
    :class:`Segments` (read where zstd left it), the others as strided runs of one shape."""
    nd = max(shards.manifest.schema(n).ndim for n in names)
    ndim, itemsize = field_meta(shards, tuple(names))[:2]
    entries = block_entries(shards, ids, s, local, [shards.field_pos[n] for n in names], nd)
    fr, shapes, groups = _plan_frames(shards, s, local, names, entries)
    ragged = (ndim == 1) & (groups > _SEGMENT_RUNS)  # (a field whose runs turn out many below becomes Segments too)
    if shards.codec == "zstd":
        buffers, buf_id, data_off, (keep, stride_ok) = _decode_zstd(shards, ids, names, fr, threads, ragged[fr.fld])
    else:
        buffers, buf_id, data_off, (keep, stride_ok) = _decode_raw(shards, ids, names, fr)
    starts, ends = _runs(fr, buf_id, stride_ok)
    per_field = np.bincount(fr.fld[starts], minlength=len(names))
    dtypes = [np.dtype(shards.manifest.schema(n).dtype) for n in names]
    for f, name in enumerate(names):
        out[name] = FieldBlock(name, dtypes[f], shapes[f], keep=keep)
        if ragged[f] or (per_field[f] > _SEGMENT_RUNS and ndim[f] == 1):
            pick = np.flatnonzero(fr.fld == f)
            out[name].segments = segments_of(fr.rec[pick], buf_id[pick], data_off[pick], fr.nbytes[pick], dtypes[f], buffers)
            ragged[f] = out[name].segments is not None
    use = ~ragged[fr.fld[starts]]
    for a, b in zip(starts[use].tolist(), ends[use].tolist()):
        f = int(fr.fld[a])
        shape = tuple(fr.shape[a, : ndim[f]].tolist())
        stride = int(data_off[a + 1] - data_off[a]) if b - a > 1 else 0
        dtype = dtypes[f]
        data = np.ndarray((b - a,) + shape, dtype=dtype, buffer=buffers[buf_id[a]], offset=int(data_off[a]), strides=(stride,) + _c_strides(shape, int(itemsize[f])))
        out[names[f]].runs.append((fr.rec[a:b], data))


def _runs(fr: _Frames, buf_id: np.ndarray, stride_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal ranges ``[starts[i], ends[i])`` of frames of one (field, shape) group in one buffer at a uniform stride."""
    n = len(fr.rec)
    brk = np.ones(n, bool)
    if n > 1:
        brk[1:] = (fr.group[1:] != fr.group[:-1]) | (buf_id[1:] != buf_id[:-1]) | ~stride_ok[1:]
    starts = np.flatnonzero(brk)
    return starts, np.append(starts[1:], n) if n else starts
