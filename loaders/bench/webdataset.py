"""The plain WebDataset reader over a cache's shards: what a WebDataset user writes for them.

Tar members read in order by ``webdataset.WebDataset`` (split by worker),
each sample decoded on its own (``.zst`` decompressed, all its frames; ``.npy``
loaded with ``allow_pickle=False``, ``.json``/``.jsonl`` parsed) and, in a cache
of packed members (a sample is a group of records), split back into records
with the shard's sidecar index as the README's WebDataset snippet does; then
batched by records with every array zero-padded to the batch's largest shape. ``cachebuild bench --compare``
measures it next to the loader; ``benchmarks/peers.py`` uses the same
functions, so there is one WebDataset reader in the project. Needs the
``webdataset`` package (imported when a pipeline is made).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard

from cachebuild.errors import ConfigError
from cachebuild.format.manifest import read_manifest

__all__ = ["decode_records", "pad_collate", "webdataset_pipeline", "webdataset_loader", "COUNT_KEY", "BYTES_KEY"]

COUNT_KEY = "_samples"
"""Added by :func:`pad_collate`: samples (records) in the batch."""

BYTES_KEY = "_payload_bytes"
"""Added by :func:`pad_collate`: decoded array bytes in the batch (before padding)."""

_DCTX: zstandard.ZstdDecompressor | None = None
_SHARDS: dict[str, tuple[int, int, list[tuple[str, dict[str, Any]]], np.ndarray]] = {}


def _payload(key: str, value: bytes) -> tuple[str, bytes]:
    """``key`` without ``.zst`` and the payload, every zstd frame decoded (a packed member holds one per record)."""
    global _DCTX
    if not key.endswith(".zst"):
        return key, value
    _DCTX = _DCTX or zstandard.ZstdDecompressor()
    return key[:-4], _DCTX.stream_reader(value, read_across_frames=True).read()


def _shard_of(url: str) -> tuple[int, int, list[tuple[str, dict[str, Any]]], np.ndarray]:
    """(first record, pack, manifest fields, sidecar index) of the shard at ``url``, read once per process."""
    if url not in _SHARDS:
        root, name = url.rsplit("/", 1)
        with open(f"{root}/manifest.json") as fh:
            m = json.load(fh)
        e = next(s for s in m["shards"] if s["name"] == name)
        with open(f"{root}/{e['index']}", "rb") as fh:  # .idx.npy, or one zstd frame (.idx.npy.zst)
            index = fh.read()
        if e["index"].endswith(".zst"):
            index = zstandard.ZstdDecompressor().decompress(index)
        _SHARDS[url] = e["first_record"], e.get("pack", 1), list(m["fields"].items()), np.load(io.BytesIO(index))
    return _SHARDS[url]


def decode_records(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """One WebDataset sample (a member group of ``pack`` records, or one record) -> its records, as
    the README's WebDataset snippet splits them: stacked arrays row by row, ragged fields cut from
    their flat concatenation by the index's shapes, JSON Lines line by line."""
    first, pack, fields, index = _shard_of(sample["__url__"])
    a = int(sample["__key__"]) - first
    rows = index[a : a + pack]
    out: list[dict[str, Any]] = [{} for _ in range(len(rows))]
    for j, (field, schema) in enumerate(fields):
        key = next(k for k in sample if k.split(".")[0] == field)
        _, payload = _payload(key, sample[key])
        if schema["dtype"] == "json":
            for rec, line in zip(out, payload.split(b"\n")):
                rec[field] = json.loads(line)
            continue
        flat = np.load(io.BytesIO(payload), allow_pickle=False).reshape(-1)
        shapes = rows["shape"][:, j, : schema["ndim"]]
        ends = np.cumsum(np.prod(shapes, axis=1))
        for rec, piece, shape in zip(out, np.split(flat, ends[:-1]), shapes):
            rec[field] = piece.reshape(shape)
    return out


def _pad_stack(arrays: list[np.ndarray]) -> np.ndarray:
    """``[B, *max_shape]`` array holding each array in its top-left corner, zeros elsewhere."""
    if arrays[0].ndim == 0:
        return np.stack(arrays)
    shape = np.max([a.shape for a in arrays], axis=0)
    out = np.zeros((len(arrays), *shape), dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(0, d) for d in a.shape)] = a
    return out


def pad_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack samples (dicts of numpy arrays) into torch tensors, each array field zero-padded to the
    batch's largest shape; non-array fields are left out. Adds :data:`COUNT_KEY` and :data:`BYTES_KEY`."""
    out: dict[str, Any] = {}
    nbytes = 0
    for key, first in samples[0].items():
        if not isinstance(first, np.ndarray):
            continue
        arrays = [s[key] for s in samples]
        nbytes += sum(a.nbytes for a in arrays)
        out[key] = torch.from_numpy(_pad_stack(arrays))
    out[COUNT_KEY] = len(samples)
    out[BYTES_KEY] = nbytes
    return out


def webdataset_pipeline(cache_dir: str | Path, batch_records: int, shuffle: bool = True, seed: int = 0) -> Any:
    """``webdataset.WebDataset`` over the cache's shards: split by worker, decode, (shuffle,) pad-batch."""
    try:
        import webdataset as wds
    except ImportError:
        raise ConfigError("the WebDataset reader needs the webdataset package: pip install webdataset") from None
    urls = [str(Path(cache_dir) / s.name) for s in read_manifest(cache_dir).shards]
    ds = wds.WebDataset(urls, shardshuffle=100 if shuffle else False, nodesplitter=None, workersplitter=wds.split_by_worker, empty_check=False, seed=seed).map(decode_records).unlisted()
    if shuffle:
        ds = ds.shuffle(1000)
    return ds.batched(batch_records, collation_fn=pad_collate, partial=True)


def webdataset_loader(cache_dir: str | Path, batch_records: int, workers: int, shuffle: bool = True, persistent: bool = False) -> Any:
    """A DataLoader that forwards :func:`webdataset_pipeline`'s batches (made in its ``workers``)."""
    ds = webdataset_pipeline(cache_dir, batch_records, shuffle)
    kw: dict[str, Any] = {"num_workers": workers}
    if workers > 0:
        kw.update(persistent_workers=persistent, prefetch_factor=4)
    return torch.utils.data.DataLoader(ds, batch_size=None, **kw)
