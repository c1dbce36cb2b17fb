"""Check a shard's sidecar index against the manifest and the tar's size, whole index at once.

Readers call :func:`check_index` once when they open a shard, so every later
read can trust the index: each payload lies inside the tar after its 512-byte
header and after the previous member, its declared shape has the field's rank
and fits the manifest's min/max shape, and its array data length is exactly
shape x itemsize (JSON: at most :data:`~cachebuild.format.limits.MAX_JSON_BYTES`).
All checks are numpy expressions over the ``[records, fields]`` index (no
per-record Python); a fault raises :class:`ShardCorruptError` naming the shard,
the record, the field and what is wrong.

:func:`check_member_keys` reads the tar headers of chosen records and compares
their member names with the record ids the manifest implies, so a shard listed
under another shard's place (swapped names) is caught.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from cachebuild.errors import ShardCorruptError
from cachebuild.format.codec import parse_codec
from cachebuild.format.index import MAX_NDIM
from cachebuild.format.limits import END_BYTES, MAX_JSON_BYTES, MAX_NPY_HEADER, MEMBER_MIN_BYTES
from cachebuild.format.names import JSON_DTYPE, KEY_DIGITS, member_name, record_key
from cachebuild.format.packing import is_first_entry, tar_order
from cachebuild.format.shared_frames import coincides, declared_ok, frame_layout
from cachebuild.format.tarball import tar_headers

__all__ = ["check_index", "check_member_keys", "check_frames", "expected_member_names", "frame_content_sizes", "frame_ends", "frame_headers", "parse_frame_headers", "trailing_frames", "trailing_text"]

_HEADER = MEMBER_MIN_BYTES
_NAME_BYTES = 100


def _field_limits(fields: Sequence[Any]) -> tuple[np.ndarray, ...]:
    """Per field: ndim, itemsize (0 for JSON), min and max shape padded with 1 to MAX_NDIM."""
    nf = len(fields)
    ndim, item = np.zeros(nf, np.int64), np.zeros(nf, np.int64)
    lo, hi = np.ones((nf, MAX_NDIM), np.int64), np.ones((nf, MAX_NDIM), np.int64)
    for j, f in enumerate(fields):
        ndim[j] = f.ndim
        item[j] = 0 if f.dtype == JSON_DTYPE else np.dtype(f.dtype).itemsize
        lo[j, : f.ndim], hi[j, : f.ndim] = f.min_shape, f.max_shape
    return ndim, item, lo, hi


def _problems(index: np.ndarray, fields: Sequence[Any], raw: bool, tar_size: int | None, pack: int = 1, share: int = 0) -> list[tuple[str, np.ndarray]]:
    """(what is wrong, bad mask ``[records, fields]``) for every check, in the order they are reported."""
    ndim, item, lo, hi = _field_limits(fields)
    off, size, nbytes = index["offset"], index["size"], index["nbytes"]
    shape = index["shape"].astype(np.int64)
    is_json = (item == 0)[None, :]
    used = np.arange(MAX_NDIM)[None, :] < ndim[:, None]
    out_of_range = np.where(used[None], (shape < lo[None]) | (shape > hi[None]), shape != 1).any(axis=2)
    data = np.where(used[None], shape, 1).prod(axis=2) * item[None, :]
    checks = [
        ("rank differs from the manifest's", index["ndim"] != ndim[None, :]),
        ("shape outside the manifest's min/max shape", out_of_range),
        ("array data length is not shape x itemsize", ~is_json & (nbytes != data)),
        (f"JSON length outside [0, {MAX_JSON_BYTES}]", is_json & ((nbytes < 0) | (nbytes > MAX_JSON_BYTES))),
        ("negative payload size", size < 0),
        (f"payload offset before its {_HEADER}-byte tar header", off < _HEADER),
    ]
    if raw:
        checks.append((f"raw payload size is not array data + a header of at most {MAX_NPY_HEADER} bytes", (size < nbytes) | (size > nbytes + MAX_NPY_HEADER)))
        if pack > 1:  # an entry inside a packed member holds its data alone (a JSON one: after its "\n")
            inner = ~is_first_entry(off.shape[0], pack)[:, None]
            checks.append(("raw entry inside a packed member is not exactly its data", inner & (size != nbytes + is_json)))
    if tar_size is not None:
        checks.append((f"payload lies past the end of the tar ({tar_size} bytes)", (off > tar_size) | (size > tar_size - np.minimum(off, tar_size))))
    checks.append(_layout_problem(off, size, pack, tar_size, share))
    if share:  # a random read decodes a record's whole frame: bounded by codec.share
        layout = frame_layout(index, is_json[0], pack)
        checks.append((f"shared zstd frame holds more than codec.share = {share} bytes", layout.shared & (layout.lo > share)))
    return checks


def _layout_problem(off: np.ndarray, size: np.ndarray, pack: int, tar_size: int | None, share: int = 0) -> tuple[str, np.ndarray]:
    """Entries in tar order (:func:`~cachebuild.format.packing.tar_order`) lie end to end as the writer
    writes them: the first one after the first tar header, a member's first entry after the previous
    member's end, its padding and a tar header, a packed member's later entries right after the entry
    before them (or, ``share > 0``, in the same frame as it: the same offset and size), and
    (``tar_size`` known) the tar's 1024-byte end right after the last member's padding.
    So the tar holds nothing the index does not account for (no hidden member)."""
    order = tar_order(off.shape[0], off.shape[1], pack)
    flat_off, flat_size = off.reshape(-1)[order], size.reshape(-1)[order]
    opens = np.repeat(is_first_entry(off.shape[0], pack), off.shape[1])[order]
    end = flat_off + np.clip(flat_size, 0, None)
    bad = np.zeros(flat_off.shape, bool)
    bad[0] = flat_off[0] != _HEADER
    if flat_off.size > 1:
        follows = flat_off[1:] == end[:-1]
        if share:
            follows |= (flat_off[1:] == flat_off[:-1]) & (flat_size[1:] == flat_size[:-1])
        bad[1:] = np.where(opens[1:], flat_off[1:] != end[:-1] + (-end[:-1] % _HEADER) + _HEADER, ~follows)
    if tar_size is not None:
        bad[-1] |= end[-1] + (-end[-1] % _HEADER) + END_BYTES != tar_size
    out = np.zeros(bad.shape, bool)
    out[order] = bad
    what = "payload does not follow the member before it (overlap or gap: members out of order, or the tar's end misplaced)"
    if pack > 1:
        what = "entry does not follow the one before it (overlap, or a gap inside or between members: out of order, or the tar's end misplaced)"
    return what, out.reshape(off.shape)


def check_index(index: np.ndarray, fields: Sequence[Any], codec: str, records: int, shard: str, first_record: int, tar_size: int | None = None, pack: int = 1, share: int = 0) -> None:
    """Raise :class:`ShardCorruptError` unless ``index`` agrees with the manifest (``fields``, ``records``, ``pack``, ``share``) and the tar's size."""
    if index.shape != (records, len(fields)):
        raise ShardCorruptError(f"shard {shard}: index has shape {list(index.shape)}, the manifest implies [{records}, {len(fields)}] (records, fields)")
    if not index.size:
        return
    for why, bad in _problems(index, fields, codec == "none", tar_size, pack, share):
        if bad.any():
            r, j = (int(v[0]) for v in np.nonzero(bad))
            e = index[r, j]
            raise ShardCorruptError(
                f"shard {shard}, record {record_key(first_record + r)}, field '{fields[j].name}': corrupt index entry: {why} "
                f"(offset {int(e['offset'])}, size {int(e['size'])}, nbytes {int(e['nbytes'])}, ndim {int(e['ndim'])}, "
                f"shape {[int(v) for v in e['shape']]})"
            )


def expected_member_names(fields: Sequence[Any], codec: str, record_id: int, pack: int = 1) -> list[bytes]:
    """The tar member names the writer gives the fields of the member that starts with record ``record_id``, in field order."""
    c = parse_codec(codec)
    return [member_name(record_key(record_id), f.name, f.dtype, c, packed=pack > 1).encode() for f in fields]


def _expected_names(fields: Sequence[Any], codec: str, first_record: int, rows: np.ndarray, pack: int) -> np.ndarray:
    """``[len(rows), fields]`` fixed-width (``S100``) member names of the members that start with those (shard-local) records."""
    ids = np.char.zfill((first_record + rows).astype("U20"), KEY_DIGITS)
    suffixes = [n.decode()[KEY_DIGITS:] for n in expected_member_names(fields, codec, 0, pack)]
    cols = [np.char.add(ids, sfx) for sfx in suffixes]
    return np.stack(cols, axis=1).astype(f"S{_NAME_BYTES}") if cols else np.zeros((len(rows), 0), f"S{_NAME_BYTES}")


def _member_sizes(index: np.ndarray, pack: int) -> np.ndarray:
    """``[groups, fields]``: each member's payload length, the sum of its frames' (entries sharing a
    frame count it once; its end is checked by :func:`check_index`)."""
    if pack == 1:
        return index["size"]
    return np.add.reduceat(np.where(coincides(index, pack), 0, index["size"]), np.arange(0, len(index), pack), axis=0)


def check_member_keys(buf: Any, index: np.ndarray, fields: Sequence[Any], codec: str, shard: str, first_record: int, rows: Sequence[int], pack: int = 1) -> None:
    """Compare the tar headers of the members holding records ``rows`` with those their record ids
    imply: name and size, then every other byte (the writer's headers are fixed but for those), and
    the tar's 1024-byte end (vectorised, in chunks of members).

    ``buf`` is the tar's bytes (an mmap or memoryview); the index was checked
    (:func:`check_index`, with the tar's size), so every header is a whole tar block inside it.
    """
    picked = np.unique(np.asarray(rows, dtype=np.int64) // pack) * pack  # the members' first records
    if not picked.size or not len(fields):
        return
    tar = np.frombuffer(buf, np.uint8)
    blocks = tar[: len(tar) // _HEADER * _HEADER].reshape(-1, _HEADER)
    sizes = _member_sizes(index, pack)
    step = max(1, _CHUNK_MEMBERS // len(fields))
    for a in range(0, len(picked), step):
        _check_member_chunk(blocks, index, sizes, fields, codec, shard, first_record, picked[a : a + step], pack)
    tail = tar[len(tar) - END_BYTES :]
    if tail.any():
        raise ShardCorruptError(f"shard {shard}: {int(np.count_nonzero(tail))} bytes that are not zero in the tar's {END_BYTES}-byte end (corrupt, or not written by cachebuild)")
    del tar, blocks, tail


_CHUNK_MEMBERS = 8192
"""Headers compared at once by :func:`check_member_keys` (4 MB of header bytes, twice)."""


def _check_member_chunk(blocks: np.ndarray, index: np.ndarray, sizes: np.ndarray, fields: Sequence[Any], codec: str, shard: str, first_record: int, picked: np.ndarray, pack: int) -> None:
    """:func:`check_member_keys` for the members that start with records ``picked``."""
    nf = len(fields)
    heads = blocks[(index[picked]["offset"].reshape(-1) - _HEADER) // _HEADER]
    member_size = sizes[picked // pack]
    got = np.ascontiguousarray(heads[:, :_NAME_BYTES]).view(f"S{_NAME_BYTES}").reshape(len(picked), nf)
    digits = heads[:, 124:135].astype(np.int64) - ord("0")
    octal_ok = ((digits >= 0) & (digits <= 7)).all(axis=1)
    got_size = np.where(octal_ok, (np.clip(digits, 0, 7) * (8 ** np.arange(10, -1, -1))).sum(axis=1), -1).reshape(len(picked), nf)
    want = _expected_names(fields, codec, first_record, picked, pack)
    bad = (got != want) | (got_size != member_size)
    if bad.any():
        i, j = (int(v[0]) for v in np.nonzero(bad))
        raise ShardCorruptError(
            f"shard {shard}, record {record_key(first_record + int(picked[i]))}, field '{fields[j].name}': tar member is "
            f"{got[i, j].decode('ascii', 'replace')!r} ({int(got_size[i, j])} bytes), expected {want[i, j].decode()!r} "
            f"({int(member_size[i, j])} bytes): shard misplaced or swapped in the manifest, or corrupt"
        )
    diff = heads != tar_headers([n.decode() for n in want.reshape(-1).tolist()], member_size.reshape(-1))
    bad_rows = np.flatnonzero(diff.any(axis=1))
    if bad_rows.size:
        k = int(bad_rows[0])
        other = diff[k].copy()
        other[148:156] = False  # name the field that differs, not the checksum that follows from it
        col = int(np.argmax(other if other.any() else diff[k]))
        at, name = next((a, n) for a, n in reversed(_HEADER_FIELDS) if a <= col)
        stop = next((a for a, _ in _HEADER_FIELDS if a > at), _HEADER)
        value = heads[k, at:stop].tobytes().rstrip(b"\0")[:16]
        i, j = divmod(k, nf)
        raise ShardCorruptError(
            f"shard {shard}, record {record_key(first_record + int(picked[i]))}, field '{fields[j].name}': tar header field {name} is {value!r}, "
            "not the writer's (a regular file, mode 0644, checksummed): corrupt, or not written by cachebuild"
        )


_HEADER_FIELDS = (
    (0, "name"),
    (100, "mode"),
    (108, "uid"),
    (116, "gid"),
    (124, "size"),
    (136, "mtime"),
    (148, "chksum"),
    (156, "typeflag"),
    (157, "linkname"),
    (257, "magic"),
    (265, "uname"),
    (297, "gname"),
    (329, "devmajor"),
    (337, "devminor"),
    (345, "prefix"),
)
"""Where each ustar header field starts (for messages)."""


def check_frames(view: Any, index: np.ndarray, fields: Sequence[Any], shard: str, first_record: int, pack: int = 1) -> None:
    """zstd: every entry's frame declares a decoded size its index entry allows (read from the frame
    headers only, nothing is decompressed), so a decompression bomb is refused before any reader allocates."""
    is_json = np.array([f.dtype == JSON_DTYPE for f in fields])
    flat = index.reshape(-1)
    declared = frame_content_sizes(np.frombuffer(view, np.uint8), flat["offset"], flat["size"])
    layout = frame_layout(index, is_json, pack)  # the entry's data and separator (a packed JSON entry: its "\n"), those of the entries sharing its frame, a header where due
    lo, hi = layout.lo.reshape(-1), layout.hi.reshape(-1)
    bad = np.flatnonzero(~declared_ok(declared, lo, hi, layout.aligned.reshape(-1)))
    if bad.size:
        r, j = divmod(int(bad[0]), len(fields))
        d = int(declared[bad[0]])
        what = "has a bad frame header" if d == -2 else "does not declare its size" if d < 0 else f"declares {d} bytes"
        raise ShardCorruptError(
            f"shard {shard}, record {record_key(first_record + r)}, field '{fields[j].name}': zstd frame {what}, "
            f"the index allows {int(lo[bad[0]])}..{int(hi[bad[0]])} (corrupt or a decompression bomb)"
        )
    ends = frame_ends(np.frombuffer(view, np.uint8), flat["offset"], flat["size"])
    bad = np.flatnonzero(ends != flat["offset"] + flat["size"])
    if bad.size:
        r, j = divmod(int(bad[0]), len(fields))
        end = int(ends[bad[0]] - flat["offset"][bad[0]])
        raise ShardCorruptError(
            f"shard {shard}, record {record_key(first_record + r)}, field '{fields[j].name}': " + (trailing_text(end, int(flat["size"][bad[0]])) if end >= 0 else "zstd frame has a bad block header")
        )


def trailing_text(end: int, size: int) -> str:
    """What is wrong with an entry whose zstd frame ends ``end`` bytes into its ``size`` (the same words for every reader)."""
    return f"zstd frame ends after {end} of the entry's {size} bytes (more bytes after it: another frame, which `zstd -d` would decode too)"


def trailing_frames(tar: np.ndarray, offset: np.ndarray, size: np.ndarray, declared: np.ndarray, hdr: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, ends)``: the frames (at ``offset``, of stored length ``size``, declaring ``declared``:
    see :func:`parse_frame_headers`) that end before their entry does, and where each ends (bytes into its
    entry): bytes follow them inside the entry, which the decoder would skip and ``zstd -d`` would not.
    One :func:`frame_ends` walk (block headers only, nothing decoded; ``hdr``: the frames' :func:`frame_headers`,
    where already gathered). A frame whose header or blocks are bad is left to the decoder (zstd names it)."""
    good = declared != -2
    ok = np.arange(len(declared)) if good.all() else np.flatnonzero(good)
    off = offset[ok].astype(np.int64)
    ends = frame_ends(tar, off, size[ok], None if hdr is None else hdr[ok]) - off if ok.size else off
    bad = (ends >= 0) & (ends != size[ok])
    return ok[bad], ends[bad]


_ZSTD_MAGIC = np.array([0x28, 0xB5, 0x2F, 0xFD], np.uint8)
_DICT_BYTES = np.array([0, 1, 2, 4], np.int64)
_FCS_BYTES = np.array([0, 2, 4, 8], np.int64)
_SHIFTS = (np.arange(8, dtype=np.uint64) * np.uint64(8))[None, :]


def frame_headers(tar: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The first 18 bytes of each frame at ``offset`` in ``tar`` (uint8 ``[frames, 18]``, clipped at the end)."""
    if not len(tar):
        return np.zeros((len(offset), 18), np.uint8)
    return tar[np.minimum(offset[:, None] + np.arange(18), len(tar) - 1)]


def parse_frame_headers(hdr: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Decoded size each zstd frame header declares (int64; -1: not declared, -2: not a zstd frame).

    ``hdr`` holds each frame's first 18 bytes (:func:`frame_headers`), ``size``
    its stored length. Parses the headers (RFC 8878, 3.1.1.1) with numpy over
    all frames at once, so a bomb is refused before anything is decoded.
    """
    n = len(hdr)
    if n == 0:
        return np.zeros(0, np.int64)
    fhd = hdr[:, 4].astype(np.int64)
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    pos = 5 + (1 - single) + _DICT_BYTES[fhd & 3]
    nfcs = np.where((fcs_flag == 0) & (single == 1), 1, _FCS_BYTES[fcs_flag])
    raw = hdr[np.arange(n)[:, None], np.minimum(pos[:, None] + np.arange(8), 17)].astype(np.uint64)
    keep = np.arange(8)[None, :] < nfcs[:, None]
    value = (np.where(keep, raw, np.uint64(0)) << _SHIFTS).sum(axis=1, dtype=np.uint64)
    value = value + np.where(fcs_flag == 1, np.uint64(256), np.uint64(0))
    out = np.where(nfcs == 0, -1, np.minimum(value, np.uint64(1 << 62)).astype(np.int64))
    ok = (hdr[:, :4] == _ZSTD_MAGIC).all(axis=1) & ((fhd & 0x08) == 0) & (pos + nfcs + 3 <= size)
    return np.where(ok, out, -2)


def frame_ends(tar: np.ndarray, offset: np.ndarray, size: np.ndarray, hdr: np.ndarray | None = None) -> np.ndarray:
    """Where each zstd frame at ``offset`` (of stored length ``size``) ends in ``tar``, walking its block
    headers (RFC 8878, 3.1.1.2) for all frames at once, one step per block; -1 for a bad block
    header or a frame that runs past ``offset + size``. Frames already passed :func:`parse_frame_headers`
    (``hdr``: their :func:`frame_headers`, where already gathered)."""
    hdr = frame_headers(tar, offset) if hdr is None else hdr
    fhd = hdr[:, 4].astype(np.int64)
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    nfcs = np.where((fcs_flag == 0) & (single == 1), 1, _FCS_BYTES[fcs_flag])
    pos = offset.astype(np.int64) + 5 + (1 - single) + _DICT_BYTES[fhd & 3] + nfcs
    stop = offset.astype(np.int64) + size.astype(np.int64)
    end = np.full(len(offset), -1, np.int64)
    active = np.flatnonzero(pos + 3 <= stop)
    while active.size:
        at = pos[active]
        b = tar[at].astype(np.int64) | tar[at + 1].astype(np.int64) << 8 | tar[at + 2].astype(np.int64) << 16
        kind, body = (b >> 1) & 3, b >> 3
        nxt = at + 3 + np.where(kind == 1, 1, body)
        last = (b & 1) == 1
        done = last & (kind != 3)
        end[active[done]] = nxt[done] + 4 * ((fhd[active[done]] >> 2) & 1)  # the content checksum
        pos[active] = nxt
        active = active[~last & (kind != 3) & (nxt + 3 <= stop[active])]
    return np.where(end <= stop, end, -1)


def frame_content_sizes(tar: np.ndarray, offset: np.ndarray, size: np.ndarray) -> np.ndarray:
    """:func:`parse_frame_headers` of the frames ``tar[offset : offset + size]`` of one shard."""
    return parse_frame_headers(frame_headers(tar, offset), size)
