"""Per-batch stage times of the loader, measured in this process, and the payload a view reads.

A sampled batch is assembled by the stream's view (one zstd thread, like a
DataLoader worker) and timed whole; then the same records' stored payloads
of the fields the view decodes (:meth:`~loaders.views.View.decoded_fields`)
are gathered from the shard mmaps (``read``: index lookups + one copy) and
zstd-decoded (``decompress``, 0 for a raw cache); ``assemble`` is the whole
minus those two. With CUDA, ``pin`` is ``pin_memory`` of the packed batch and
``copy`` its host-to-device copy.

Which records a batch decodes: all its distinct records, except for views
that keep decoded records between batches (a ``store`` with a ``decodes``
counter). In a shuffled, mixed plan such a view decodes whole pools, once per
epoch, in whichever batch first touches each pool (on a cache of one pool, the
first): ``read`` and ``decompress`` are then the epoch's decode spread evenly
over its batches (records in the epoch order / batches, times the per-record
cost measured on the first records of that order), and ``assemble`` leaves out
the pool decodes a sampled batch happens to make. (Until 2026-11-24 the pool
decode fell into the untimed warm-up batch, and a one-pool cache showed
``read 0`` and ``decompress 0`` on zstd.) Without pools it decodes each
batch's records: counted per batch.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cachebuild.format.names import JSON_DTYPE
from loaders.batch import PackedBatch
from loaders.bench.result import STAGES
from cachebuild.format.reader import ShardSet
from loaders.stream import ShardStream

__all__ = ["stage_times", "payload_fields", "decoded_bytes_per_record", "stored_payloads", "read_and_decompress"]


def payload_fields(stream: ShardStream) -> list[str]:
    """The stored array fields the stream's view decodes (JSON fields left out)."""
    manifest = stream.manifest
    return [n for n in stream.view.decoded_fields() if manifest.schema(n).dtype != JSON_DTYPE]


def decoded_bytes_per_record(stream: ShardStream, fields: list[str]) -> float:
    """Mean decoded array bytes per record of ``fields`` (from the indexes)."""
    shards = ShardSet(stream.manifest, stream.root)
    try:
        total = 0
        for s in range(len(stream.manifest.shards)):
            idx = shards.index(s)
            for name in fields:
                total += int(idx[:, shards.field_pos[name]]["nbytes"].sum())
    finally:
        shards.close()
    return total / max(1, stream.manifest.records)


def stored_payloads(shards: ShardSet, ids: np.ndarray, fields: list[str]) -> list[bytes | bytearray | memoryview]:
    """The stored (compressed) payload bytes of ``fields`` of records ``ids``, copied out of the shard mmaps:
    each distinct payload once (entries sharing a zstd frame, format v4, name it once, and the decoder
    decodes it once per block)."""
    s, local = shards.locate(np.asarray(ids, dtype=np.int64))
    cols = [shards.field_pos[n] for n in fields]
    out: list[bytes | bytearray | memoryview] = []
    for shard in np.unique(s).tolist():
        rows = local[s == shard]
        entries = shards.index(shard)[rows][:, cols].reshape(-1)
        entries = entries[np.unique(entries["offset"], return_index=True)[1]]  # (a shard's payloads never overlap: one offset, one payload)
        view = shards.shard(shard).view
        out += [bytes(view[o : o + z]) for o, z in zip(entries["offset"].tolist(), entries["size"].tolist())]
    return out


def read_and_decompress(shards: ShardSet, ids: np.ndarray, fields: list[str]) -> tuple[float, float]:
    """Seconds to gather the stored payloads of ``fields`` of ``ids`` from the mmaps, and to zstd-decode them."""
    import zstandard

    if not fields or not len(ids):
        return 0.0, 0.0
    t = time.perf_counter()
    stored = stored_payloads(shards, ids, fields)
    read = time.perf_counter() - t
    if shards.codec != "zstd":
        return read, 0.0
    t = time.perf_counter()
    zstandard.ZstdDecompressor().multi_decompress_to_buffer(stored, threads=1)
    return read, time.perf_counter() - t


def _decodes(view: Any) -> int | None:
    store = getattr(view, "store", None)
    return None if store is None else int(store.decodes)


def _cuda_device(device: Any) -> Any:
    """The CUDA device to time ``pin`` and ``copy`` on, or ``None`` (no CUDA, or a CPU device asked for)."""
    import torch

    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    return torch.device(device) if device is not None else torch.device("cuda")


def _time_transfer(buf: Any, stream: ShardStream, dev: Any) -> tuple[float, float]:
    import torch

    packed = PackedBatch(buf, stream.layout.spec())
    t = time.perf_counter()
    pinned = packed.pin_memory()
    pin = time.perf_counter() - t
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    pinned.buffer.to(dev, non_blocking=True)
    torch.cuda.synchronize(dev)
    return pin, time.perf_counter() - t


_COST_RECORDS = 512
"""Records whose read and decompression are timed to price a pooled view's decode per record."""


def _pool_record_cost(stream: ShardStream, shards: ShardSet, plan: Any, fields: list[str]) -> tuple[float, float] | None:
    """Seconds to read and to decompress one record, for a view that decodes whole pools (else ``None``)."""
    if plan.pools is None or _decodes(stream.view) is None:
        return None
    ids = np.unique(plan.order[:_COST_RECORDS])
    read, dec = read_and_decompress(shards, ids, fields)
    return read / max(1, len(ids)), dec / max(1, len(ids))


def _time_batch(stream: ShardStream, shards: ShardSet, items: Any, fields: list[str], dev: Any, per_record: tuple[float, float] | None = None) -> dict[str, float]:
    """One sampled batch, stage by stage (seconds); ``per_record``: a pooled view's cost of one decoded record."""
    view = stream.view
    before = _decodes(view)
    buf, arrays = stream.layout.allocate(False)
    t = time.perf_counter()
    view.assemble(shards, items, arrays)
    whole = time.perf_counter() - t
    after = _decodes(view)
    if per_record is not None and before is not None and after is not None:
        read, dec = (after - before) * per_record[0], (after - before) * per_record[1]
    else:
        ids = items.unique if before is None or after is None else items.unique[: after - before]
        read, dec = read_and_decompress(shards, ids, fields)
    out = {"read": read, "decompress": dec, "assemble": max(0.0, whole - read - dec)}
    if dev is not None:
        out["pin"], out["copy"] = _time_transfer(buf, stream, dev)
    return out


def stage_times(stream: ShardStream, sample: int = 8, device: Any = None) -> dict[str, Any]:
    """Mean per-batch ms of each stage over ``sample`` batches of epoch 0 (see the module docstring)."""
    plan = stream.plan(0)
    picks = np.unique(np.linspace(0, plan.batches - 1, num=min(sample, plan.batches)).astype(np.int64)).tolist()
    shards = ShardSet(stream.manifest, stream.root, stream.verify)
    dev = _cuda_device(device)
    fields = payload_fields(stream)
    sums = dict.fromkeys(STAGES, 0.0)
    stream.view.decode_threads = 1
    try:
        # One untimed batch first: opens the shards, fills caches (not a stage of a running loader).
        _, arrays = stream.layout.allocate(False)
        stream.view.assemble(shards, plan.batch(picks[0]), arrays)
        per_record = _pool_record_cost(stream, shards, plan, fields)
        for b in picks:
            for k, v in _time_batch(stream, shards, plan.batch(b), fields, dev, per_record).items():
                sums[k] += v
    finally:
        shards.close()
    n = len(picks)
    if per_record is not None:  # the epoch's pool decodes, spread over its batches
        per_batch = len(plan.order) / max(1, plan.batches)
        sums["read"], sums["decompress"] = per_record[0] * per_batch * n, per_record[1] * per_batch * n
    out: dict[str, Any] = {k: (sums[k] / n * 1e3 if (dev is not None or k not in ("pin", "copy")) else None) for k in STAGES}
    out["sampled_batches"] = n
    return out
