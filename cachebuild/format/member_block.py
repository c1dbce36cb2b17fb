"""Encode a run of records into tar members, column by column: payloads, sizes and index rows.

The shard writer's hot loop. Per member it does only what cannot be done on a
block: fetch the value, check its dtype, and (raw) one ``crc32`` or (zstd) one
slot in a batch compression call. Everything else is a numpy operation or one
C-level call over all members of the run: ``.npy`` headers (one per distinct
shape), sizes, index rows, compression, and in the writer the offsets and tar
headers (:func:`cachebuild.format.tarball.tar_headers`).

Each record's field is one *entry*: its C-order array data (or compact,
key-sorted JSON), preceded by a ``.npy`` v1.0 header where one is due, compressed
as one zstd frame with the writer's compressor; ``crc32`` of the stored entry
for raw caches, 0 for zstd (its frames carry a checksum). With ``pack == 1``
every entry is a whole member with its own header. With ``pack > 1`` a member
holds a group of ``pack`` records (:mod:`cachebuild.format.packing`): only the
group's first entry carries the header (of the stacked or flat group array),
and a JSON member's later entries start with ``\n``. With ``share > 0`` (zstd),
consecutive entries of a member share one frame while it holds at most
``share`` decoded bytes (:mod:`cachebuild.format.shared_frames`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cachebuild.format.index import INDEX_DTYPE, MAX_NDIM
from cachebuild.format.json_text import compact_encoder, nonfinite_at
from cachebuild.format.limits import MAX_JSON_BYTES
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.npy import npy_headers
from cachebuild.format.packing import SHARE_BYTES, group_starts, is_first_entry, tar_order
from cachebuild.format.shared_frames import frame_cuts, shared_compressor

try:  # ISA-L's crc32: zlib's checksum (the same values), about 2.5x faster on a raw graph's members
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover
    from zlib import crc32 as _crc32

__all__ = ["FieldSpec", "EncodedRun", "MemberError", "encode_run"]

_ARRAYS = (np.ndarray, np.generic)


class MemberError(ValueError):
    """A record that does not fit the schema; ``record`` is its position in the run."""

    def __init__(self, message: str, record: int):
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class FieldSpec:
    """One schema field as the encoder needs it: name, dtype name, member-name suffix."""

    name: str
    dtype: str
    suffix: str

    @property
    def is_json(self) -> bool:
        return self.dtype == JSON_DTYPE


@dataclass
class EncodedRun:
    """Entries of consecutive records in tar order (:func:`~cachebuild.format.packing.tar_order`:
    record-major when ``pack == 1``, else group by group, field by field).

    Entry ``i``'s stored bytes are ``prefixes[i] + bodies[i]`` (``sizes[i]`` bytes):
    raw, a ``.npy`` header or JSON separator where due (else ``b""``) and the array
    (or JSON text); zstd, no prefixes and one frame. ``order[i]`` is entry ``i``'s
    position in the record-major ``rows.reshape(-1)``; ``rows`` are the index entries
    ``[records, fields]`` with offsets and sizes still 0; ``raw_bytes`` the
    uncompressed payload bytes. With shared frames, ``sizes[i]`` is the size of entry
    ``i``'s frame and ``stored[i]`` what entry ``i`` writes (its frame, if it opens it,
    in ``bodies[i]``; else 0 bytes); ``stored`` is None when every entry is its own frame.
    """

    prefixes: list[bytes] | None
    bodies: list[Any]
    sizes: np.ndarray
    rows: np.ndarray
    raw_bytes: int
    order: np.ndarray
    stored: np.ndarray | None = None


@dataclass
class _Column:
    """One field's members: prefixes (``.npy`` headers), bodies, data sizes, shapes, raw crc32s."""

    prefixes: list[bytes]
    bodies: list[Any]
    nbytes: list[int]
    shapes: list[tuple[int, ...]]
    crcs: list[int]


def _values(records: Sequence[Mapping[str, Any]], specs: Sequence[FieldSpec]) -> list[list[Any]]:
    """Each field's values, refusing a record whose field names differ from the schema."""
    names = [s.name for s in specs]
    try:
        if all([len(r) == len(names) for r in records]):
            return [[r[name] for r in records] for name in names]
    except KeyError:
        pass
    i = next(i for i, r in enumerate(records) if len(r) != len(names) or not all(n in r for n in names))
    got = set(records[i])
    missing, extra = sorted(set(names) - got), sorted(got - set(names))
    raise MemberError(f"record fields do not match the schema: missing {missing}, unexpected {extra}", i)


def _check_arrays(spec: FieldSpec, want: np.dtype, vals: list[Any], key_of: Callable[[int], str]) -> list[int]:
    """Refuse a value that is not an array of the field's dtype or has too many dims; the dims."""
    if not all([isinstance(v, _ARRAYS) and v.dtype == want for v in vals]):
        i = next(i for i, v in enumerate(vals) if not (isinstance(v, _ARRAYS) and v.dtype == want))
        got = getattr(vals[i], "dtype", type(vals[i]).__name__)
        raise MemberError(f"field '{spec.name}' of record {key_of(i)}: expected {spec.dtype} array, got {got}", i)
    ndims = [v.ndim for v in vals]
    if max(ndims, default=0) > MAX_NDIM:
        i = next(i for i, d in enumerate(ndims) if d > MAX_NDIM)
        raise MemberError(f"field '{spec.name}' of record {key_of(i)}: {ndims[i]} dims > {MAX_NDIM}", i)
    return ndims


def _group_headers(want: np.dtype, shapes: list[tuple[int, ...]], pack: int) -> list[bytes]:
    """Per record: the ``.npy`` header its entry starts with (``b""`` inside a group): the record's
    own shape when ``pack == 1``, else the group's ``[G, *shape]`` (one shape) or ``[total]`` (ragged)."""
    if pack == 1:
        return npy_headers(want, shapes)
    heads = [b""] * len(shapes)
    group: list[tuple[int, ...]] = []
    for a in group_starts(len(shapes), pack).tolist():
        members = shapes[a : a + pack]
        if members.count(members[0]) == len(members):
            group.append((len(members), *members[0]))
        else:
            group.append((sum(int(np.prod(s)) for s in members),))
    for a, h in zip(group_starts(len(shapes), pack).tolist(), npy_headers(want, group)):
        heads[a] = h
    return heads


def _array_column(spec: FieldSpec, vals: list[Any], raw: bool, key_of: Callable[[int], str], pack: int) -> _Column:
    """Checked C-contiguous arrays of one field and the ``.npy`` headers their entries start with."""
    want = np.dtype(spec.dtype)
    _check_arrays(spec, want, vals, key_of)
    if not all([v.flags.c_contiguous for v in vals]):
        vals = [v if v.flags.c_contiguous else v.copy(order="C") for v in vals]  # (ascontiguousarray would turn 0-d into 1-d)
    shapes = [v.shape for v in vals]
    heads = _group_headers(want, shapes, pack)
    crcs = []
    if raw:
        head_crc = {h: _crc32(h) for h in set(heads)}
        crc32 = _crc32
        crcs = [crc32(v, head_crc[h]) for h, v in zip(heads, vals)]
    return _Column(heads, vals, [v.nbytes for v in vals], shapes, crcs)


def _json_column(spec: FieldSpec, vals: list[Any], raw: bool, key_of: Callable[[int], str], pack: int) -> _Column:
    """Compact, key-sorted JSON text of one field (JSON Lines in a packed member: ``\n`` before all but a group's first)."""
    dumps = compact_encoder()  # json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False)
    texts = []
    for i, v in enumerate(vals):
        try:
            texts.append(dumps(v).encode())
        except (TypeError, ValueError) as exc:
            bad = nonfinite_at(v)
            if bad is not None:  # standard JSON only (cachebuild.format.json_text): readers refuse NaN text
                where = f" at {bad[0]}" if bad[0] else ""
                raise MemberError(f"field '{spec.name}' of record {key_of(i)}: {bad[1]!r}{where} is not a JSON number (use None or a string)", i) from exc
            raise MemberError(f"field '{spec.name}' of record {key_of(i)}: not JSON-able ({exc})", i) from exc
    sizes = [len(t) for t in texts]
    if max(sizes, default=0) > MAX_JSON_BYTES:  # every reader refuses it as corrupt: refuse to write it
        i = next(i for i, n in enumerate(sizes) if n > MAX_JSON_BYTES)
        raise MemberError(f"field '{spec.name}' of record {key_of(i)}: JSON of {sizes[i]} bytes is over the {MAX_JSON_BYTES} bytes a reader accepts", i)
    prefixes = [b""] * len(texts) if pack == 1 else [b"" if i % pack == 0 else b"\n" for i in range(len(texts))]
    crcs = [_crc32(t, _crc32(p)) for p, t in zip(prefixes, texts)] if raw else []
    return _Column(prefixes, texts, sizes, [()] * len(texts), crcs)


def _rows(columns: list[_Column], count: int) -> np.ndarray:
    """Index rows ``[count, fields]``: nbytes, ndim, shape (unused dims 1) and raw crc32."""
    rows = np.zeros((count, len(columns)), INDEX_DTYPE)
    rows["shape"] = 1
    for j, col in enumerate(columns):
        rows["nbytes"][:, j] = col.nbytes
        if col.crcs:
            rows["crc32"][:, j] = col.crcs
        ndims = np.fromiter(map(len, col.shapes), np.int32, count)
        rows["ndim"][:, j] = ndims
        kinds = np.unique(ndims).tolist()
        for d in kinds:
            if len(kinds) == 1:
                pick: Any = slice(None)
                shapes = col.shapes
            else:
                pick = np.flatnonzero(ndims == d)
                shapes = [col.shapes[i] for i in pick.tolist()]
            dims = np.fromiter(itertools.chain.from_iterable(shapes), np.int32, len(shapes) * d)
            rows["shape"][pick, j, :d] = dims.reshape(len(shapes), d)
    return rows


def encode_run(records: Sequence[Mapping[str, Any]], specs: Sequence[FieldSpec], cctx: Any, key_of: Callable[[int], str], pack: int = 1, share: int = 0) -> EncodedRun:
    """Encode ``records`` into entries; ``key_of(i)`` is record ``i``'s key (for error messages).

    ``cctx`` is a zstd compressor, or None for raw payloads; record 0 opens a
    group of ``pack`` records; ``share`` (zstd, ``pack > 1``) lets consecutive entries
    of a member share a frame of at most that many decoded bytes. Raises
    :class:`MemberError` for a record that does not fit the schema.
    """
    raw = cctx is None
    columns = []
    for spec, vals in zip(specs, _values(records, specs)):
        make = _json_column if spec.is_json else _array_column
        columns.append(make(spec, vals, raw, key_of, pack))
    rows = _rows(columns, len(records))
    plen = np.array([[len(h) for h in c.prefixes] for c in columns], np.int64).reshape(len(columns), len(records))
    order = tar_order(len(records), len(columns), pack)
    raw_len = (plen.T + rows["nbytes"]).reshape(-1)
    if raw:
        prefixes, bodies = _record_major([c.prefixes for c in columns]), _record_major([c.bodies for c in columns])
        return EncodedRun(_reorder(prefixes, order, pack), _reorder(bodies, order, pack), raw_len[order], rows, int(raw_len.sum()), order)
    pieces = _record_major([x for c in columns for x in (c.prefixes, c.bodies)])
    if share > 0 and pack > 1:
        return _shared_run(cctx, pieces, raw_len, rows, order, pack, share)
    frames = _reorder(_compress(cctx, pieces, raw_len), order, pack)
    return EncodedRun(None, frames, np.fromiter(map(len, frames), np.int64, len(frames)), rows, int(raw_len.sum()), order)


def _shared_run(cctx: Any, pieces: list[Any], raw_len: np.ndarray, rows: np.ndarray, order: np.ndarray, pack: int, share: int) -> EncodedRun:
    """zstd entries in tar order, consecutive entries of a member sharing a frame of at most ``share``
    decoded bytes (:func:`~cachebuild.format.shared_frames.frame_cuts`)."""
    nf = rows.shape[1]
    tar_len = raw_len[order]
    opens = frame_cuts(tar_len, np.repeat(is_first_entry(rows.shape[0], pack), nf)[order], share)
    starts = np.flatnonzero(opens)
    frame_len = np.add.reduceat(tar_len, starts) if len(starts) else np.zeros(0, np.int64)
    tar_pieces: list[Any] = [None] * (2 * len(order))
    idx = order.tolist()
    tar_pieces[::2] = [pieces[2 * i] for i in idx]
    tar_pieces[1::2] = [pieces[2 * i + 1] for i in idx]
    count = np.diff(np.append(starts, len(order)))
    frames = _compress_frames(cctx, b"".join(tar_pieces), frame_len, count > 1, share)
    fsize = np.fromiter(map(len, frames), np.int64, len(frames))
    fid = np.cumsum(opens) - 1
    bodies: list[Any] = [b""] * len(order)
    for t, f in zip(starts.tolist(), frames):
        bodies[t] = f
    stored = np.where(opens, fsize[fid], 0)
    return EncodedRun(None, bodies, fsize[fid], rows, int(raw_len.sum()), order, stored)


def _compress_frames(cctx: Any, data: bytes, lens: np.ndarray, shared: np.ndarray, share: int) -> list[Any]:
    """One zstd frame per consecutive slice of ``data`` (``lens`` bytes each): with ``cctx``, or, for a
    frame of several entries (``shared``) of a build whose ``share`` is at most the default
    :data:`~cachebuild.format.packing.SHARE_BYTES`, at :data:`~cachebuild.format.shared_frames.SHARED_LEVEL`
    (a larger share, for pooled reads, keeps the build's level: see there)."""
    if not shared.any() or share > SHARE_BYTES:
        return _compress_joined(cctx, data, lens)
    ends = np.cumsum(lens)
    view = memoryview(data)
    pieces = [view[a:b] for a, b in zip((ends - lens).tolist(), ends.tolist())]
    out: list[Any] = [None] * len(lens)
    for mask, ctx in ((~shared, cctx), (shared, shared_compressor())):
        pick = np.flatnonzero(mask)
        if pick.size:
            for i, frame in zip(pick.tolist(), _compress_joined(ctx, b"".join(pieces[i] for i in pick.tolist()), lens[pick])):
                out[i] = frame
    return out


def _compress_joined(cctx: Any, data: bytes, lens: np.ndarray) -> list[Any]:
    """One zstd frame per consecutive slice of ``data`` (``lens`` bytes each), batched where the binding can."""
    if not len(lens):
        return []
    ends = np.cumsum(lens)
    batch = getattr(cctx, "multi_compress_to_buffer", None)
    if batch is None:  # the cffi binding: one call per frame
        return [cctx.compress(data[a:b]) for a, b in zip((ends - lens).tolist(), ends.tolist())]
    import zstandard

    segments = np.empty((len(lens), 2), np.uint64)
    segments[:, 1] = lens
    segments[:, 0] = ends - lens
    out = batch(zstandard.BufferWithSegments(data, segments.tobytes()))
    return [out[i] for i in range(len(lens))]


def _reorder(items: list[Any], order: np.ndarray, pack: int) -> list[Any]:
    """``items`` (record-major) in tar order (the same list when ``pack == 1``)."""
    return items if pack == 1 else [items[i] for i in order.tolist()]


def _record_major(columns: list[list[Any]]) -> list[Any]:
    """Interleave per-field lists (all of one length) into one list in record-major order."""
    out: list[Any] = [None] * sum(map(len, columns))
    for j, col in enumerate(columns):
        out[j :: len(columns)] = col
    return out


def _compress(cctx: Any, pieces: list[Any], raw_len: np.ndarray) -> list[Any]:
    """One zstd frame per member (``pieces``: prefix and body of each member in turn, ``raw_len`` bytes each)."""
    return _compress_joined(cctx, b"".join(pieces), raw_len) if pieces else []
