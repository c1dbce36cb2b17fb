"""Fixtures of the mixture tests: three small causal caches of growing n, and process bodies
(a DDP rank, a fresh-process resume) that ``spawn`` children can import."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gloo_rank import gloo_rank

# name -> (n_min, n_max, graphs, seed): three curriculum levels of different sizes
LEVELS = {"small": (5, 8, 90, 11), "mid": (10, 13, 50, 12), "big": (16, 18, 30, 13)}


def build_level(out: Path, n_min: int, n_max: int, graphs: int, seed: int, codec: str = "zstd") -> Path:
    from cachebuild.jobs import run_causal_build

    overrides = [] if codec == "zstd" else [f'build.codec="{codec}"']
    values = {"graphs": graphs, "build.shard_mb": 0.15, "graph.n_min": n_min, "graph.n_max": n_max, "seed": seed}
    run_causal_build(None, overrides, values, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def levels(tmp_path_factory) -> dict[str, str]:
    """``{name: root}`` of the three levels."""
    base = tmp_path_factory.mktemp("mixture")
    return {name: str(build_level(base / name, *spec)) for name, spec in LEVELS.items()}


def make_mixture(roots: dict[str, str], spec: dict[str, Any]):
    """A :class:`loaders.Mixture` from plain data (picklable across spawn): ``{"weights", "epoch_size", "schedule"}``
    with the schedule as ``[[first, end, weights], ...]``."""
    from loaders import Mixture, Stage

    schedule = spec.get("schedule")
    if schedule is not None:
        return Mixture(roots, schedule=[Stage((a, b), w) for a, b, w in schedule])
    return Mixture(roots, weights=spec.get("weights"), epoch_size=spec.get("epoch_size"))


def batch_ids(batch: dict) -> tuple[list, list]:
    """Row identities of a batch (graph id, or (graph, k, j) for twins) and its pad flags."""
    import torch

    if "graph_index" in batch:
        graph = batch["ctx_record_id"][batch["graph_index"]]
        ids = torch.stack([graph, batch["int_index"], batch["row_index"]], 1).tolist()
    elif "graph_id" in batch:
        ids = torch.stack([batch["graph_id"], batch["int_index"], batch["row_index"]], 1).tolist()
    else:
        ids = batch["record_id"].tolist()
    return ids, batch["is_pad"].tolist()


def mixture_rank_main(rank: int, world: int, port: int, roots: dict, spec: dict, out_dir: str, runs: list) -> None:
    """One DDP rank (gloo on loopback) reading a mixture: per run ``(view, batch_size, num_workers, options)``
    a loop with an all_reduce per step. Writes ``out_dir/rank{r}.json``."""
    import torch
    import torch.distributed as dist

    from loaders import ShardStream, make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        for i, (view, batch_size, nw, options) in enumerate(runs):
            stream = ShardStream(make_mixture(roots, spec), view=view, batch_size=batch_size, seed=5, **options)
            loader = make_loader(stream, num_workers=nw, multiprocessing_context="fork" if nw else None)
            seen, steps = [], 0
            for batch in loader:
                seen.append(batch_ids(batch))
                t = torch.tensor([1.0])
                dist.all_reduce(t)  # a rank with fewer steps would hang here
                steps += 1
            result[str(i)] = {"batches": seen, "steps": steps, "len": len(loader), "state": loader.state_dict()}


def resume_ids(roots: dict, spec: dict, state: dict, view: str, batch_size: int, world: int, num_workers: int, options: dict) -> list:
    """In a fresh process: every rank of a ``world`` loads ``state``; per rank, the ids of the batches that remain."""
    from loaders import ShardStream, make_loader

    out = []
    for rank in range(world):
        stream = ShardStream(make_mixture(roots, spec), view=view, batch_size=batch_size, seed=state["seed"], rank=rank, world_size=world, **options)
        loader = make_loader(stream, num_workers=num_workers)
        loader.load_state_dict(state)
        out.append([batch_ids(b) for b in loader])
    return out


def resume_ids_to_queue(queue: Any, *args: Any) -> None:
    try:
        queue.put(json.dumps(resume_ids(*args)))
    except Exception:
        queue.put(traceback.format_exc())


def union_reference(roots: dict) -> tuple[list, np.ndarray]:
    """Per cache a :class:`loader_fixtures.Reference`, and the union offsets."""
    from loader_fixtures import Reference

    refs = [Reference(Path(r)) for r in roots.values()]
    sizes = [ref.manifest.records for ref in refs]
    return refs, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
