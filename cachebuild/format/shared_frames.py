"""Shared frames: consecutive small entries of one packed zstd member compressed as one frame.

In a packed zstd shard (:mod:`cachebuild.format.packing`) each record's entry is
normally its own zstd frame. A record of a few bytes (a 2-byte label, a line of
JSON metadata) then costs more in frame overhead (magic, header, block header,
checksum: about 13 bytes) than it holds, and compresses poorly on its own. A
cache whose ``codec.share`` is ``N > 0`` (format version 4) lets the writer put
consecutive entries of one member into one frame while their decoded bytes stay
within ``N``:

* the frames of a member are cut greedily in record order: an entry joins the
  current frame if the frame's decoded bytes (``.npy`` header where due, JSON
  separators, data) stay within ``N``, else it opens a new frame; an entry larger
  than ``N`` is a frame of its own, as before. Frames never cross a member;
* every entry of a frame has the frame's ``offset`` and ``size`` in the index
  (entries *coincide*), and its own ``nbytes`` and shape;
* the second data-position rule: a record's data *ends* where the bytes of the
  later entries of its frame begin, so it lies at
  ``decoded[len - tail - nbytes : len - tail]`` with ``tail`` the sum of the later
  entries' ``nbytes`` (plus 1 each for a JSON entry's ``\\n`` separator). For a
  frame of one entry ``tail`` is 0: the data is the last ``nbytes``, the rule of
  unshared entries, so this one rule reads every layout.

The member's decoded bytes are exactly those of an unshared member (the frames
concatenated): ``zstd -d`` and the README's WebDataset decoder read it unchanged.
Everything here is computed from the index alone (no decoding), vectorised.

Why a byte bound: a random read of one record decodes its whole frame, so the
frame must stay small next to what the read is for.
:data:`~cachebuild.format.packing.SHARE_BYTES` (1 KiB) is half of one 2 KB
record's frame: 512 int16 labels share one frame (about 1 byte per record instead
of a 15-byte frame each), JSON metadata lines about 14 per frame (~16 instead of
~86 bytes per record on ``bench_small``'s), and a 2 KB mel record stays alone.
Measured (zstd 1.5, one core, loaded machine): a 2 KB mel frame decodes in
4.2 us, a 1 KB JSON frame in 1.8 us (2 KB: 3.2 us, 12 bytes per record), a
label frame of 512 in 0.3 us.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cachebuild.format.limits import MAX_NPY_HEADER
from cachebuild.format.packing import MAX_SHARE, SHARE_BYTES
from cachebuild.format.segments import copy_windows, window_rows

__all__ = ["SHARE_BYTES", "MAX_SHARE", "NPY_ALIGN", "SHARED_LEVEL", "shared_compressor", "FrameLayout", "coincides", "declared_ok", "frame_layout", "frame_cuts", "distinct_frames", "gather_shared"]


@dataclass(frozen=True)
class FrameLayout:
    """Per index entry ``[records, fields]`` (int64 / bool), from the index alone.

    ``opens``: the entry starts its frame; ``shared``: its frame holds other entries too;
    ``tail``: decoded bytes after the entry's data in its frame; ``lo`` / ``hi``: the decoded
    size its frame may declare (``lo``: every entry's data and separators; ``hi``: plus a
    ``.npy`` header of at most :data:`~cachebuild.format.limits.MAX_NPY_HEADER` bytes for an
    array frame that opens its member); ``aligned``: a shared frame with a ``.npy`` header, whose
    declared size must then be ``lo`` plus a multiple of :data:`NPY_ALIGN` (``lo`` counts the
    shortest header: NumPy pads v1.0 headers to 64 bytes), so an index that shrinks one of its
    records cannot hide the difference in the header (:func:`declared_ok`).
    """

    opens: np.ndarray
    shared: np.ndarray
    tail: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    aligned: np.ndarray


SHARED_LEVEL = -1
"""zstd level of a frame of several entries in a build whose ``codec.share`` is at most the default
(:data:`~cachebuild.format.packing.SHARE_BYTES`, 1 KiB), whatever ``codec.level``: a random read decodes a
whole shared frame for one record, and at level -1 that costs 0.6 instead of 1.9 us for 512 int16 labels
(1.9 instead of 1.05 bytes per label stored) and 0.8 instead of 2.1 us for 1 KB of JSON lines
(18.6 instead of 16.5 bytes per line; measured CPU time, zstd 1.5). A larger ``share`` (up to 64 KiB,
a cache built for pooled reads, which decode each frame whole once per epoch) keeps ``codec.level``:
level -1 stored 2 KB float16 mel records at a ratio of 1.01 where level 1 gives 1.2 (docs/DECISIONS.md,
"Shared frames of a pooled-read build keep the build's level")."""


def shared_compressor() -> Any:
    """A fresh compressor for shared frames (:data:`SHARED_LEVEL`, checksum and content size on, as every frame)."""
    import zstandard

    return zstandard.ZstdCompressor(level=SHARED_LEVEL, write_checksum=True, write_content_size=True)


NPY_ALIGN = 64
"""NumPy pads a ``.npy`` v1.0 header (magic included) to a multiple of this."""


def declared_ok(declared: np.ndarray, lo: np.ndarray, hi: np.ndarray, aligned: np.ndarray) -> np.ndarray:
    """Per entry: its frame's declared decoded size is one the index allows (:class:`FrameLayout`)."""
    ok: np.ndarray = (declared >= lo) & (declared <= hi) & ~(aligned & ((declared - lo) % NPY_ALIGN != 0))
    return ok


def frame_layout(index: np.ndarray, is_json: np.ndarray, pack: int) -> FrameLayout:
    """:class:`FrameLayout` of a shard's index ``[records, fields]`` (``is_json``: per field).

    Entries of one field coincide (equal offset) exactly when they share a frame; a member's
    first entry always opens a frame. Each entry's separator is 1 byte for a JSON entry that is
    not its member's first (JSON Lines), else 0."""
    records, nf = index.shape
    if records == 0:
        z = np.zeros((0, nf), np.int64)
        return FrameLayout(z.astype(bool), z.astype(bool), z, z, z, z.astype(bool))
    pack = max(1, pack)
    first = (np.arange(records) % pack == 0)[:, None]
    opens = ~coincides(index, pack)
    sep = (np.asarray(is_json, bool)[None, :] & ~first).astype(np.int64)
    w = index["nbytes"].astype(np.int64) + sep
    # column-major: frames of one field are consecutive records
    wc, oc = w.T.reshape(-1), opens.T.reshape(-1)
    starts = np.flatnonzero(oc)
    frame = np.cumsum(oc) - 1
    total = np.add.reduceat(wc, starts)[frame]
    upto = np.cumsum(wc)
    before_frame = (upto - wc)[starts][frame]
    tail = before_frame + total - upto
    count = np.diff(np.append(starts, len(oc)))[frame]
    array_field = np.repeat(~np.asarray(is_json, bool), records)
    opens_member = (starts % records % pack == 0)[frame]  # the frame starts its member: an array's holds the .npy header
    header = opens_member & array_field
    aligned = header & (count > 1)
    hi = total + np.where(header, MAX_NPY_HEADER, 0)
    # (a frame of one JSON entry may lack its "\n": the text is its last nbytes, and verify names the missing separator)
    lo = total + np.where(aligned, NPY_ALIGN, 0) - np.where(count == 1, sep.T.reshape(-1), 0)
    shape = (nf, records)
    return FrameLayout(opens, (count > 1).reshape(shape).T, tail.reshape(shape).T, lo.reshape(shape).T, hi.reshape(shape).T, aligned.reshape(shape).T)


def coincides(index: np.ndarray, pack: int) -> np.ndarray:
    """``[records, fields]`` bool: the entry has the previous record's offset and (non-zero) size in its
    member, so it shares that entry's frame (never at a member's start; a raw empty entry does not)."""
    off, size = index["offset"], index["size"]
    same = np.zeros(off.shape, bool)
    if len(off) > 1:
        same[1:] = (off[1:] == off[:-1]) & (size[1:] == size[:-1]) & (size[1:] > 0)
    same[np.arange(len(off)) % max(1, pack) == 0] = False
    return same


def distinct_frames(shard: np.ndarray, offset: np.ndarray, shared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(pick, slot)`` for a block's entries: the frames to decode, as the entry naming each, in block
    order (entries sharing a frame name it once, at its first); and each entry's position in ``pick``.
    Only shared frames are looked up (an unshared frame holds one entry)."""
    n = len(offset)
    every = np.arange(n, dtype=np.int64)
    sel = np.flatnonzero(shared)
    if sel.size < 2:
        return every, every
    key = (shard[sel].astype(np.int64) << 40) | offset[sel]  # (a shard is far below 2**40 bytes)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if len(uniq) == len(sel):  # (a shuffled block: every frame named once)
        return every, every
    keep = np.ones(n, bool)
    keep[sel] = False
    keep[sel[first]] = True
    pos = np.cumsum(keep) - 1
    slot = pos.copy()
    slot[sel] = pos[sel[first]][inverse.reshape(-1)]
    return np.flatnonzero(keep), slot


_SIZES_BY_WINDOWS = 32
"""At most this many distinct entry sizes: :func:`gather_shared` copies each entry whole (one gather per
size); more (ragged records of many lengths): one element index for all."""


def gather_shared(shared: np.ndarray, nbytes: np.ndarray, buffers: list[np.ndarray], buf_id: np.ndarray, data_off: np.ndarray, stride_ok: np.ndarray, align: int = 8) -> None:
    """Decoder: copy the data of the entries in shared frames (``shared``) into one new buffer appended to
    ``buffers``, each at a multiple of ``align`` and in block order, so records of one shape lie at a
    uniform stride again; updates ``buf_id``, ``data_off`` and ``stride_ok`` in place (one numpy gather
    per decoded buffer, no per-record Python)."""
    sel = np.flatnonzero(shared)
    nb = nbytes[sel]
    padded = (nb + align - 1) // align * align
    dst = np.cumsum(padded) - padded
    src, src_buf = data_off[sel], buf_id[sel]
    one_size = bool((nb == nb[0]).all())
    stage = np.empty((len(sel), int(padded[0])) if one_size else int(padded.sum()), np.uint8)
    for b in np.unique(src_buf).tolist() if (src_buf != src_buf[0]).any() else [int(src_buf[0])]:
        k = np.flatnonzero(src_buf == b) if len(buffers) > 1 else slice(None)
        if one_size:  # (a fixed-size field: each entry's bytes copied whole, no element index)
            stage[k, : int(nb[0])] = window_rows(buffers[b], src[k], int(nb[0]))
            continue
        count = nb[k]
        sizes, of_size = np.unique(count, return_inverse=True)
        if len(sizes) <= _SIZES_BY_WINDOWS:  # (a few sizes, e.g. fixed-size fields, whose first entries carry headers)
            k = np.arange(len(sel))[k] if isinstance(k, slice) else k
            for j, size in enumerate(sizes.tolist()):
                of = k[of_size.reshape(-1) == j]
                copy_windows(buffers[b], src[of], stage, dst[of], size)
            continue
        within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        stage[np.repeat(dst[k], count) + within] = buffers[b][np.repeat(src[k], count) + within]
    stage = stage.reshape(-1)
    buffers.append(stage)
    buf_id[sel] = len(buffers) - 1
    data_off[sel] = dst
    follows = np.zeros(len(sel), bool)
    follows[1:] = (sel[1:] == sel[:-1] + 1) & (padded[1:] == padded[:-1])
    stride_ok[sel] = follows


def frame_cuts(raw_len: np.ndarray, opens_member: np.ndarray, share: int) -> np.ndarray:
    """Writer: which entries (in tar order, ``raw_len`` decoded bytes each) open a frame.

    A member's first entry always does; a later one joins the open frame while the frame's
    bytes stay within ``share`` (greedy, so the cut is a pure function of the sizes)."""
    n = len(raw_len)
    out = np.ones(n, bool)
    if share <= 0 or n == 0:
        return out
    acc = 0
    sizes = raw_len.tolist()
    member = opens_member.tolist()
    for i in range(n):  # (one integer comparison per entry; the entries are a run's, compressed next)
        if member[i] or acc + sizes[i] > share:
            acc = sizes[i]
        else:
            out[i] = False
            acc += sizes[i]
    return out
