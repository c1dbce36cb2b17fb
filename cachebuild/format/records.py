"""Whole records and whole shards through the one decoder: what ``inspect``, ``verify`` and ``stage`` read.

The loader decodes blocks of records with :func:`cachebuild.format.decode.read_block`
from shards opened by :class:`cachebuild.format.reader.ShardSet`; so does
everything here, so a cache that passes ``verify`` decodes in training, and a
fault is reported with the same words by both.

* :func:`read_record`: one record's fields (arrays and JSON), for ``inspect``.
* :func:`record_blocks`: a shard's records cut into blocks whose decoded bytes
  fit a budget (bounded memory however large the shard).
* :func:`check_members`: every member's tar name and size against the record ids
  the manifest implies, and (zstd) every frame's declared size, from the headers
  alone; :func:`check_structure` adds every JSON member parsed within the limits
  (``stage`` runs it before copying).
* :func:`check_headers`: what the loader never reads but ``tar -x`` + ``zstd -d``
  users do: each ``.npy`` header agrees with the manifest and index (dtype,
  shape, C order; in a packed member, the group's stacked or flat shape, and
  no header inside the group), and a JSON entry holds nothing before its text
  but, in a packed member, its ``\n`` separator.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.decode import read_block
from cachebuild.format.entries import CHECK_HEADER, SHR, shard_table
from cachebuild.format.index_check import check_frames, check_member_keys
from cachebuild.format.limits import MAX_NPY_HEADER
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.npy import check_npy_header
from cachebuild.format.reader import ShardSet

__all__ = ["BLOCK_BYTES", "check_headers", "check_members", "check_npy_starts", "check_structure", "read_record", "record_blocks"]

BLOCK_BYTES = 32 << 20
"""Decoded bytes a block of :func:`record_blocks` aims at (a block may exceed it by its last record)."""


def read_record(shards: ShardSet, record: int, strict: bool = False) -> dict[str, Any]:
    """All fields of global record ``record`` in manifest order: numpy arrays, and dicts for JSON fields.

    ``strict`` also checks what the loader skips (:func:`check_headers`).
    """
    ids = np.array([record], dtype=np.int64)
    names = shards.manifest.field_names
    blocks = read_block(shards, ids, names)
    if strict:
        check_headers(shards, ids, names)
    out: dict[str, Any] = {}
    for name in names:
        values = blocks[name].values
        out[name] = values[0] if values is not None else blocks[name].dense()[0, ...]  # 0-d fields stay arrays
    return out


def record_blocks(shards: ShardSet, s: int, names: Sequence[str] | None = None, budget: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """Record positions ``[a, b)`` of the ShardSet (0-based; not record ids, which may start later in a grown cache) covering shard ``s``, each decoding to about ``budget`` bytes of ``names``."""
    entry = shards.manifest.shards[s]
    if not entry.records:
        return []
    cols = [shards.field_pos[n] for n in (names if names is not None else shards.manifest.field_names)]
    per = shards.index(s)[:, cols]["nbytes"].astype(np.int64).sum(axis=1) + 1
    before = np.cumsum(per) - per
    cuts = np.flatnonzero(np.diff(before // max(int(budget), 1))) + 1
    edges = np.concatenate([[0], cuts, [entry.records]]) + int(shards.starts[s])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def check_members(shards: ShardSet, s: int) -> None:
    """Every member of shard ``s``: tar name and size as its record id implies, and (zstd) a frame that
    declares a size its index entry allows (nothing is decompressed, so a bomb is refused unread)."""
    sh = shards.shard(s)
    e, fields = sh.entry, shards.manifest.fields
    check_member_keys(sh.view, sh.index, fields, shards.codec, e.name, e.first_record, range(e.records), e.pack)
    if shards.codec == "zstd":
        check_frames(sh.view, sh.index, fields, e.name, e.first_record, e.pack)


def check_structure(shards: ShardSet, s: int) -> None:
    """:func:`check_members`, then every JSON member of shard ``s`` decoded and parsed within the limits,
    and every ``.npy`` header's length checked against the data after it (:func:`check_npy_starts`)."""
    check_members(shards, s)
    names = [f.name for f in shards.manifest.fields if f.dtype == JSON_DTYPE]
    if names:
        for a, b in record_blocks(shards, s, names):
            read_block(shards, np.arange(a, b), names)
    check_npy_starts(shards, s)


def check_npy_starts(shards: ShardSet, s: int) -> None:
    """Refuse an entry of shard ``s`` that holds a ``.npy`` header whose data would not start where the
    header ends (a shortened ``.npy`` in a well-formed zstd frame, or a raw payload: the loader would read
    shifted data), as the loader does, through the shard's entry table: raw payloads are checked when it is
    filled; zstd frames that do not declare the writer's header and data sizes are marked
    (:data:`~cachebuild.format.entries.CHECK_HEADER`; none of a cache the writer wrote), and only the
    records those are in are decoded, in bounded blocks. Also refuses bytes after any array frame."""
    names = [f.name for f in shards.manifest.fields if f.dtype != JSON_DTYPE]
    if not names:
        return
    cols = tuple(shards.field_pos[n] for n in names)
    table = shard_table(shards, s, cols, max(shards.manifest.schema(n).ndim for n in names))
    marked = np.flatnonzero((table[..., SHR] & CHECK_HEADER).any(axis=1)) + int(shards.starts[s])
    for a, b in record_blocks(shards, s, names):
        ids = marked[(marked >= a) & (marked < b)]
        if ids.size:
            read_block(shards, ids, names)


def check_headers(shards: ShardSet, ids: np.ndarray, names: Sequence[str] | None = None) -> None:
    """Each ``.npy`` header of records ``ids`` agrees with the manifest and index; a JSON entry holds
    nothing but its text (and a packed entry's separator). Run after :func:`read_block` decoded the
    same entries (so a zstd frame is known to be sound); each distinct (header, shape) is parsed once."""
    ids = np.asarray(ids, dtype=np.int64)
    s, local = shards.locate(ids)
    dctx = zstandard.ZstdDecompressor() if shards.codec == "zstd" else None
    for sh in np.unique(s).tolist():
        rows = np.flatnonzero(s == sh)
        shard = shards.shard(sh)
        for name in names if names is not None else shards.manifest.field_names:
            schema = shards.manifest.schema(name)
            j = shards.field_pos[name]
            column = shard.index[:, j]
            want = _expected_shapes(column, local[rows], shard.entry.pack, schema.ndim)
            seen: set[tuple[bytes, tuple[int, ...] | None]] = set()
            layout = shards.layout(sh) if dctx is not None else None
            frames: dict[int, bytes] = {}
            for rid, at, shape in zip(ids[rows].tolist(), local[rows].tolist(), want):
                e = column[at]
                off, size, nbytes = int(e["offset"]), int(e["size"]), int(e["nbytes"])
                try:
                    if layout is not None and layout.shared[at, j]:  # the bytes between the entry before it in its frame (or the frame's start) and its data
                        frame = frames.get(off) or frames.setdefault(off, dctx.decompress(shard.view[off : off + size], max_output_size=int(layout.hi[at, j])))  # type: ignore[union-attr]
                        start = len(frame) - int(layout.tail[at, j]) - nbytes
                        prefix = frame[: max(start, 0)] if layout.opens[at, j] else frame[max(start - 1, 0) : start] if schema.dtype == JSON_DTYPE else b""
                    else:
                        prefix = _header(shard.view[off : off + size], nbytes, dctx, 1 if schema.dtype == JSON_DTYPE else MAX_NPY_HEADER)
                except (ValueError, zstandard.ZstdError) as exc:
                    raise ShardCorruptError(f"{shards.where(rid, name)}: {exc}") from exc
                if schema.dtype == JSON_DTYPE:
                    if shape is None and prefix != b"\n":  # a later entry of a JSON Lines member
                        raise ShardCorruptError(f"{shards.where(rid, name)}: JSON Lines entry does not start with its '\\n' separator (it starts with {prefix[:8]!r})")
                    if shape is not None and prefix:
                        raise ShardCorruptError(f"{shards.where(rid, name)}: {len(prefix)} stray bytes before the JSON text ({prefix[:8]!r})")
                elif shape is None:
                    if prefix:
                        raise ShardCorruptError(f"{shards.where(rid, name)}: {len(prefix)} stray bytes before the array data inside a packed member")
                elif (prefix, shape) not in seen:
                    check_npy_header(prefix, schema.dtype, shape, shards.where(rid, name))
                    seen.add((prefix, shape))


def _expected_shapes(column: np.ndarray, rows: np.ndarray, pack: int, ndim: int) -> list[tuple[int, ...] | None]:
    """Per record: the shape its entry's ``.npy`` header must give, or None for an entry inside a
    packed member (no header): the record's own shape (``pack == 1``), else its group's stacked
    ``(G, *shape)`` when the group's records share one shape, ``(total elements,)`` otherwise."""
    shapes = column["shape"][:, :ndim]
    if pack == 1:
        return [tuple(v) for v in shapes[rows].tolist()]
    out: list[tuple[int, ...] | None] = []
    for r in rows.tolist():
        if r % pack:
            out.append(None)
            continue
        group = shapes[r : r + pack]
        if (group == group[:1]).all():
            out.append((len(group), *group[0].tolist()))
        else:
            out.append((int(np.prod(group, axis=1).sum()),))
    return out


def _header(payload: memoryview, nbytes: int, dctx: zstandard.ZstdDecompressor | None, most: int) -> bytes:
    """The bytes before an entry's data: the stored bytes (raw), or the start of its decoded frame
    (zstd; only the frame's first block is decoded, at most ``most`` bytes kept)."""
    if dctx is None:
        return bytes(payload[: len(payload) - nbytes])
    declared = zstandard.frame_content_size(payload) if len(payload) >= 6 else -2
    want = declared - nbytes
    if declared < 0 or not 0 <= want <= most:
        raise ValueError(f"zstd frame declares {declared} bytes, the index allows {nbytes}..{nbytes + most}")
    out = b""
    with dctx.stream_reader(payload) as reader:
        while len(out) < want:
            chunk = reader.read(want - len(out))
            if not chunk:
                break
            out += chunk
    return out
