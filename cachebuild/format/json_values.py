"""JSON fields of a block of records, decoded one record at a time (the decoder's non-array part)."""

from __future__ import annotations

from typing import Any

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.index_check import frame_headers, parse_frame_headers, trailing_frames, trailing_text
from cachebuild.format.limits import load_json_bounded
from cachebuild.format.reader import ShardSet

__all__ = ["read_json_values"]


def read_json_values(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, name: str) -> list[Any]:
    """JSON field ``name`` of records ``ids`` (in shards ``s`` at rows ``local``), one Python decode per
    record (small metadata, off the hot path); a frame declaring another size is refused unread.

    A record's text ends ``tail`` bytes before its decoded frame's end (0 unless entries share the
    frame, :mod:`cachebuild.format.shared_frames`); a shared frame is decoded once per call."""
    j = shards.field_pos[name]
    dctx = zstandard.ZstdDecompressor() if shards.codec == "zstd" else None
    if dctx is not None:
        _refuse_trailing(shards, ids, s, local, name)
    values: list[Any] = []
    data: bytes | memoryview
    decoded: dict[tuple[int, int], bytes] = {}
    for rid, sh, loc in zip(ids.tolist(), s.tolist(), local.tolist()):
        shard = shards.shard(sh)
        e = shard.index[loc, j]
        off, nbytes = int(e["offset"]), int(e["nbytes"])
        raw = shard.view[off : off + int(e["size"])]
        tail = 0
        try:
            if dctx is not None:
                layout = shards.layout(sh)
                lo, hi, tail = int(layout.lo[loc, j]), int(layout.hi[loc, j]), int(layout.tail[loc, j])
                data = decoded.get((sh, off), b"")
                if not data:
                    declared = zstandard.frame_content_size(raw)
                    if not lo <= declared <= hi:  # (the text, a packed entry's "\n", and those of the entries sharing its frame)
                        raise ShardCorruptError(f"{shards.where(rid, name)}: zstd frame declares {declared} bytes, the index allows {lo}..{hi} (corrupt or a decompression bomb)")
                    data = dctx.decompress(raw, max_output_size=hi)
                    if layout.shared[loc, j]:
                        decoded[(sh, off)] = data
            else:
                data = raw
        except zstandard.ZstdError as exc:
            raise ShardCorruptError(f"{shards.where(rid, name)}: {exc}") from exc
        end = len(data) - tail
        values.append(load_json_bounded(data[end - nbytes : end], shards.where(rid, name), ShardCorruptError))
    return values


def _refuse_trailing(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, name: str) -> None:
    """Refuse a record whose JSON frame ends before its entry does (bytes after it, which this decoder
    would skip and ``zstd -d`` would decode): one block-header walk over the field's frames in each shard,
    the first time the shard (as opened now) is read for it."""
    j = shards.field_pos[name]
    for sh in np.unique(s).tolist():
        shard = shards.shard(sh)
        checked: set[int] = shard.__dict__.setdefault("_json_frames_end", set())  # (goes with the open shard: a reopened one is walked again)
        if j in checked:
            continue
        e = shard.index[:, j]
        tar = np.frombuffer(shard.view, np.uint8)
        off, size = e["offset"].astype(np.int64), e["size"].astype(np.int64)
        hdr = frame_headers(tar, off)  # (gathered once: for the declared sizes and for the block walk)
        bad, ends = trailing_frames(tar, off, size, parse_frame_headers(hdr, size), hdr)
        del tar
        if bad.size:
            raise ShardCorruptError(f"{shards.where(int(shards.starts[sh]) + int(bad[0]), name)}: {trailing_text(int(ends[0]), int(size[bad[0]]))}")
        checked.add(j)
