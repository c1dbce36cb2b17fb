"""A mixture under real DDP (gloo ranks started with spawn) and resumed in a fresh process onto another world size."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter

import numpy as np
import pytest

from loader_fixtures import free_port, spawn_ranks
from loaders import ShardStream, make_loader
from mixture_fixtures import batch_ids, levels, make_mixture, mixture_rank_main, resume_ids_to_queue  # noqa: F401

DEADLINE_S = 150
WEIGHTED = {"weights": {"small": 1, "mid": 1, "big": 2}, "epoch_size": 160}
SCHEDULE = {"schedule": [[0, 1, {"small": 1}], [1, None, {"mid": 1, "big": 1}]]}


def _launch(world, roots, spec, out_dir, runs):
    return spawn_ranks(mixture_rank_main, (world, free_port(), roots, spec, str(out_dir), runs), world, out_dir, DEADLINE_S)


def _real(batches):
    return [tuple(x) if isinstance(x, list) else x for ids, pad in batches for x, p in zip(ids, pad) if not p]


@pytest.mark.dist
@pytest.mark.timeout(DEADLINE_S + 60)
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_split_a_mixture_into_equal_steps(levels, tmp_path, world):
    runs = [("graphs", 8, 0, {}), ("graphs", 8, 2, {}), ("twins", 600, 1, {"compact": True})]
    results = _launch(world, levels, WEIGHTED, tmp_path, runs)
    mixture = ShardStream(make_mixture(levels, WEIGHTED), view="graphs", batch_size=8).mixture
    sequences = []
    for i, (view, _, nw, _) in enumerate(runs):
        per_rank = [res[str(i)] for res in results]
        assert len({p["steps"] for p in per_rank}) == 1 and {p["len"] for p in per_rank} == {per_rank[0]["steps"]}
        real = [x for p in per_rank for x in _real(p["batches"])]
        graphs = np.array([x[0] if isinstance(x, tuple) else x for x in real])
        if view == "graphs":
            assert np.bincount(mixture.cache_of(graphs), minlength=3).tolist() == [40, 40, 80]
            per = Counter(real)  # small and mid subsampled (each record at most once), big repeated (80 draws of 30: 2 or 3 times)
            assert all(per[g] == 1 for g in per if g < 140) and {per[g] for g in range(140, 170)} <= {2, 3}
            sequences.append([p["batches"] for p in per_rank])
        else:
            assert len(set(real)) == len(real) or max(Counter(real).values()) <= 3
            assert set(np.unique(mixture.cache_of(graphs)).tolist()) == {0, 1, 2}
        assert {p["state"]["position"] for p in per_rank} == {per_rank[0]["steps"] * world}
    assert sequences[0] == sequences[1]  # the same batches with 0 and 2 workers


def _fresh_process(*args):
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=resume_ids_to_queue, args=(q, *args))
    p.start()
    out = q.get(timeout=120)
    p.join(30)
    assert not out.startswith("Traceback"), out
    return json.loads(out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec,epoch", [(WEIGHTED, 1), (SCHEDULE, 1)])
def test_resume_mid_epoch_in_a_fresh_process_onto_another_world_size(levels, spec, epoch):
    view, batch, options = "twins", 500, {"compact": True}
    # the whole epoch, global batch by global batch (world 1)
    ref_stream = ShardStream(make_mixture(levels, spec), view=view, batch_size=batch, seed=6, **options)
    ref_stream.set_epoch(epoch)
    ref = [batch_ids(b) for b in ref_stream]
    # two ranks consume 3 steps each, then save
    states = []
    for rank in range(2):
        s = ShardStream(make_mixture(levels, spec), view=view, batch_size=batch, seed=6, rank=rank, world_size=2, **options)
        loader = make_loader(s, num_workers=1)
        loader.set_epoch(epoch)
        it = iter(loader)
        for _ in range(3):
            next(it)
        states.append(loader.state_dict())
        del it, loader
    assert states[0]["position"] == states[1]["position"] == 6 and states[0]["mixture"] == states[1]["mixture"]
    got = _fresh_process(levels, spec, states[0], view, batch, 3, 1, options)
    for rank, rows in enumerate(got):
        want = [ref[b] for b in range(6 + rank, len(ref), 3)]
        pads = len(rows) - len(want)
        assert [[ids, pad] for ids, pad in rows[: len(want)]] == [[ids, pad] for ids, pad in want]
        assert pads in (0, 1) and all(all(p) for _, p in rows[len(want) :])
    assert len({len(r) for r in got}) == 1
