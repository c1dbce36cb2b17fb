"""Sources and checks of ``tests/test_review_readpath.py``, and its DDP rank body (imported by spawned ranks).

Every batch is compared with records read one by one by :class:`loader_fixtures.Reference`
(Python's ``tarfile``, ``zstd`` and ``np.load`` on the members), never with the decoder under test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gloo_rank import gloo_rank
from loader_fixtures import Reference, padded

L16 = np.array([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 100, 120, 140, 160, 199])
"""Exactly 16 distinct lengths: a block holding them all is 16 (field, length) groups, the last count read run by run."""
L17 = np.append(L16, 250)
"""17: one more than the decoder's run limit, so a block holding them all is ragged before decompression."""

EDGE_FIELDS = {
    "a8": "int8",
    "bmany": "bool",
    "b16": "uint16",
    "c17": "float16",
    "dbool": "bool",
    "e64": "int64",
    "empty": "float32",
    "m2": "int16",
    "fixed": "float32",
    "meta": "json",
}


def edge_record(rng: np.random.Generator, index: int) -> dict[str, Any]:
    """Ragged 1-d fields at the edges: many lengths with 0 mixed in (int8, bool), exactly 16 and 17
    distinct lengths (uint16, float16), lengths 0..1 (bool), half empty (int64), always empty;
    next to a 2-d varying field, a fixed field and JSON."""
    n_a = 0 if index % 5 == 0 else int(rng.integers(0, 300))
    return {
        "a8": rng.integers(-128, 127, n_a).astype(np.int8),
        "bmany": rng.random(int(rng.integers(0, 90))) < 0.5,
        "b16": rng.integers(0, 65535, int(L16[index % 16])).astype(np.uint16),
        "c17": rng.standard_normal(int(L17[rng.integers(0, 17)])).astype(np.float16),
        "dbool": rng.random(int(rng.integers(0, 2))) < 0.5,
        "e64": rng.integers(-(2**62), 2**62, int(rng.integers(0, 40)) if index % 2 else 0).astype(np.int64),
        "empty": np.zeros(0, np.float32),
        "m2": rng.integers(0, 100, (int(rng.integers(1, 9)), 3)).astype(np.int16),
        "fixed": rng.standard_normal(4).astype(np.float32),
        "meta": {"i": int(index), "s": "x" * int(index % 7)},
    }


GROW_FIELDS = {"tok": "int16", "m2": "int32", "meta": "json"}


def grow_record(rng: np.random.Generator, index: int) -> dict[str, Any]:
    """Ragged tokens and a 2-d varying field whose extremes recur every 50 records, so every
    generation of a growing cache has the same max and min shapes (the batch shapes stay)."""
    k = index % 50
    n = 300 if k == 0 else 0 if k == 1 else int(rng.integers(0, 300))
    m = 8 if k == 0 else 1 if k == 1 else int(rng.integers(1, 9))
    return {"tok": rng.integers(0, 30000, n).astype(np.int16), "m2": np.full((m, 2), index, np.int32), "meta": {"i": int(index)}}


class Records(Reference):
    """:class:`Reference`, each record read once (the tests read every record several times)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self._seen: dict[int, dict[str, Any]] = {}

    def record(self, rid: int) -> dict[str, Any]:
        if rid not in self._seen:
            self._seen[rid] = super().record(rid)
        return self._seen[rid]


def row_faults(batch: dict[str, Any], i: int, want: dict[str, Any], fields: list[Any], max_shapes: dict[str, tuple[int, ...]], masks: bool) -> list[str]:
    """What differs between batch row ``i`` and the record ``want`` (the reference's), for every array field."""
    faults = []
    for f in fields:
        if f.dtype == "json":
            continue
        got = np.asarray(batch[f.name][i])
        if got.tobytes() != padded(want[f.name], max_shapes[f.name]).tobytes():
            faults.append(f"{f.name}: data")
        if f"{f.name}_shape" in batch and tuple(np.asarray(batch[f"{f.name}_shape"][i]).tolist()) != want[f.name].shape:
            faults.append(f"{f.name}: shape")
        if masks and f"{f.name}_mask" in batch:
            if not np.array_equal(np.asarray(batch[f"{f.name}_mask"][i]), padded(np.ones(want[f.name].shape, bool), max_shapes[f.name])):
                faults.append(f"{f.name}: mask")
    return faults


def check_batches(batches: list[dict[str, Any]], ref: Reference, masks: bool = True) -> list[int]:
    """Every row of ``batches`` (pads included) equals its record in ``ref``; returns the real rows' record ids."""
    fields = list(ref.manifest.fields)
    shapes = {f.name: tuple(f.max_shape) for f in fields}
    seen = []
    for batch in batches:
        for i, rid in enumerate(np.asarray(batch["record_id"]).tolist()):
            faults = row_faults(batch, i, ref.record(rid), fields, shapes, masks)
            assert not faults, f"record {rid}: {faults}"
        seen += np.asarray(batch["record_id"])[~np.asarray(batch["is_pad"])].tolist()
    return seen


def kept(loader: Any, stop: int | None = None) -> list[dict[str, Any]]:
    """The batches of one pass (or its first ``stop``) as numpy copies (the loader reuses its buffers)."""
    out = []
    for batch in loader:
        out.append({key: v.numpy().copy() for key, v in batch.items()})
        if stop is not None and len(out) == stop:
            break  # (before the next batch is taken: the state counts what was consumed)
    return out


def ddp_rank_main(rank: int, world: int, port: int, root: str, out_dir: str, phase: str, steps: int) -> None:
    """One gloo rank reading ``root`` with 2 forked workers and the per-shard entry tables.

    ``phase == "save"``: epoch 0 whole, then ``steps`` batches of epoch 1 and the loader state
    (``state{rank}.json``); ``"resume"``: that state loaded in this fresh process, the rest of
    epoch 1. Each batch is checked against the reference here; the result names the real rows."""
    import torch
    import torch.distributed as dist

    from cachebuild.format import entries
    from loaders import ShardStream, make_loader

    entries.WHOLE_TABLE_BYTES = 0  # one table per shard (the forked workers inherit it)
    with gloo_rank(rank, world, port, out_dir) as result:
        t0 = time.perf_counter()
        ref = Records(Path(root))
        stream = ShardStream(root, view="records", batch_size=24, seed=6)
        loader = make_loader(stream, num_workers=2, prefetch_factor=2, multiprocessing_context="fork")
        epochs: dict[str, list[int]] = {}
        if phase == "save":
            epochs["0"] = check_batches(kept(loader), ref)
            loader.set_epoch(1)
            epochs["1"] = check_batches(kept(loader, steps), ref)
            Path(out_dir, f"state{rank}.json").write_text(json.dumps(loader.state_dict()))
        else:
            loader.load_state_dict(json.loads(Path(out_dir, f"state{rank}.json").read_text()))
            epochs["1"] = check_batches(kept(loader), ref)
        t = torch.tensor([float(sum(len(v) for v in epochs.values()))])
        dist.all_reduce(t)
        result.update({"epochs": epochs, "total": t.item(), "seconds": time.perf_counter() - t0})


def grow_source() -> Any:
    """The growing cache's source, for a recipe's ``kind = "review_readpath_fixtures:grow_source"`` (the CLI's appends)."""
    from cachebuild import FunctionSource

    return FunctionSource.per_record(grow_record, GROW_FIELDS)
