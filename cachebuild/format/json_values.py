"""JSON fields of a block of records, decoded one record at a time (the decoder's non-array part)."""

from __future__ import annotations

from typing import Any

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.limits import load_json_bounded
from cachebuild.format.reader import ShardSet

__all__ = ["read_json_values"]


def read_json_values(shards: ShardSet, ids: np.ndarray, s: np.ndarray, local: np.ndarray, name: str) -> list[Any]:
    """JSON field ``name`` of records ``ids`` (in shards ``s`` at rows ``local``), one Python decode per
    record (small metadata, off the hot path); a frame declaring another size is refused unread."""
    j = shards.field_pos[name]
    dctx = zstandard.ZstdDecompressor() if shards.codec == "zstd" else None
    values: list[Any] = []
    data: bytes | memoryview
    for rid, sh, loc in zip(ids.tolist(), s.tolist(), local.tolist()):
        shard = shards.shard(sh)
        e = shard.index[loc, j]
        raw = shard.view[int(e["offset"]) : int(e["offset"]) + int(e["size"])]
        nbytes = int(e["nbytes"])
        most = nbytes + (shard.entry.pack > 1)  # (a packed JSON entry may start with its "\n" separator)
        try:
            if dctx is not None:
                declared = zstandard.frame_content_size(raw)
                if not nbytes <= declared <= most:
                    raise ShardCorruptError(f"{shards.where(rid, name)}: zstd frame declares {declared} bytes, the index says {nbytes} (corrupt or a decompression bomb)")
                data = dctx.decompress(raw, max_output_size=most)
            else:
                data = raw
        except zstandard.ZstdError as exc:
            raise ShardCorruptError(f"{shards.where(rid, name)}: {exc}") from exc
        values.append(load_json_bounded(data[len(data) - nbytes :], shards.where(rid, name), ShardCorruptError))
    return values
