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
  shape, C order), and a raw JSON member has no bytes before its text.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.decode import read_block
from cachebuild.format.index_check import check_frames, check_member_keys
from cachebuild.format.limits import MAX_NPY_HEADER
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.npy import check_npy_header
from cachebuild.format.reader import ShardSet

__all__ = ["BLOCK_BYTES", "check_headers", "check_members", "check_structure", "read_record", "record_blocks"]

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
    check_member_keys(sh.view, sh.index, fields, shards.codec, e.name, e.first_record, range(e.records))
    if shards.codec == "zstd":
        check_frames(sh.view, sh.index, fields, e.name, e.first_record)


def check_structure(shards: ShardSet, s: int) -> None:
    """:func:`check_members`, then every JSON member of shard ``s`` decoded and parsed within the limits."""
    check_members(shards, s)
    names = [f.name for f in shards.manifest.fields if f.dtype == JSON_DTYPE]
    if names:
        for a, b in record_blocks(shards, s, names):
            read_block(shards, np.arange(a, b), names)


def check_headers(shards: ShardSet, ids: np.ndarray, names: Sequence[str] | None = None) -> None:
    """Each ``.npy`` header of records ``ids`` agrees with the manifest and index; a raw JSON member
    holds nothing but its text. Run after :func:`read_block` decoded the same members (so a zstd
    frame is known to be sound); each distinct (header, shape) is parsed once."""
    ids = np.asarray(ids, dtype=np.int64)
    s, local = shards.locate(ids)
    dctx = zstandard.ZstdDecompressor() if shards.codec == "zstd" else None
    for sh in np.unique(s).tolist():
        rows = np.flatnonzero(s == sh)
        shard = shards.shard(sh)
        for name in names if names is not None else shards.manifest.field_names:
            schema = shards.manifest.schema(name)
            e = shard.index[local[rows], shards.field_pos[name]]
            cols = zip(ids[rows].tolist(), e["offset"].tolist(), e["size"].tolist(), e["nbytes"].tolist(), e["shape"][:, : schema.ndim].tolist())
            if schema.dtype == JSON_DTYPE:
                stray = np.flatnonzero(e["size"] != e["nbytes"]) if dctx is None else np.zeros(0, np.int64)
                if len(stray):
                    i = int(stray[0])
                    raise ShardCorruptError(f"{shards.where(int(ids[rows[i]]), name)}: {int(e['size'][i] - e['nbytes'][i])} stray bytes before the JSON text")
                continue
            seen: set[tuple[bytes, tuple[int, ...]]] = set()
            for rid, off, size, nbytes, shape in cols:
                try:
                    header = _header(shard.view[off : off + size], nbytes, dctx)
                except (ValueError, zstandard.ZstdError) as exc:
                    raise ShardCorruptError(f"{shards.where(rid, name)}: {exc}") from exc
                if (header, tuple(shape)) not in seen:
                    check_npy_header(header, schema.dtype, tuple(shape), shards.where(rid, name))
                    seen.add((header, tuple(shape)))


def _header(payload: memoryview, nbytes: int, dctx: zstandard.ZstdDecompressor | None) -> bytes:
    """The bytes before a member's array data: the stored bytes (raw), or the start of its decoded
    frame (zstd; only the frame's first block is decoded, at most :data:`MAX_NPY_HEADER` bytes kept)."""
    if dctx is None:
        return bytes(payload[: len(payload) - nbytes])
    declared = zstandard.frame_content_size(payload) if len(payload) >= 6 else -2
    want = declared - nbytes
    if declared < 0 or not 0 <= want <= MAX_NPY_HEADER:
        raise ValueError(f"zstd frame declares {declared} bytes, the index allows {nbytes}..{nbytes + MAX_NPY_HEADER}")
    out = b""
    with dctx.stream_reader(payload) as reader:
        while len(out) < want:
            chunk = reader.read(want - len(out))
            if not chunk:
                break
            out += chunk
    return out
