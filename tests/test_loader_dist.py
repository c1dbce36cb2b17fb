"""Real DDP: ranks started with torch.multiprocessing (spawn), gloo on 127.0.0.1.

Per world size 1-3 and worker count 0-2: the ranks' record ids together are the whole cache,
repeats only where flagged as padding, every rank runs the same number of steps, and a loop
with an all_reduce per step finishes (a hang fails the test through the join deadline).
"""

from __future__ import annotations


import pytest

from loader_fixtures import causal_cache, ddp_rank_main, free_port, spawn_ranks  # noqa: F401

GRAPHS_RUNS = [("graphs", 16, nw, {}) for nw in (0, 1, 2)]
TWINS_RUN = ("twins", 2000, 2, {"compact": True})
DEADLINE_S = 150


def _launch(world: int, root, out_dir, runs) -> list[dict]:
    return spawn_ranks(ddp_rank_main, (world, free_port(), str(root), str(out_dir), runs), world, out_dir, DEADLINE_S)


@pytest.mark.dist
@pytest.mark.timeout(DEADLINE_S + 60)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ddp_ranks_split_the_cache_exactly(causal_cache, tmp_path, world):
    runs = GRAPHS_RUNS + ([TWINS_RUN] if world == 3 else [])
    results = _launch(world, causal_cache, tmp_path, runs)
    sequences = []
    for i, (view, batch, nw, _) in enumerate(runs):
        per_rank = [res[str(i)] for res in results]
        steps = {p["steps"] for p in per_rank}
        assert len(steps) == 1, f"{view} nw={nw}: unequal steps {steps}"
        assert {p["len"] for p in per_rank} == steps
        real, pads = [], 0
        for p in per_rank:
            for ids, pad in p["batches"]:
                for x, is_pad in zip(ids, pad):
                    if is_pad:
                        pads += 1
                    else:
                        real.append(tuple(x) if isinstance(x, list) else x)
        assert len(real) == len(set(real)), f"{view} nw={nw}: a sample seen twice"
        assert pads == steps.pop() * world * batch - len(real)
        if view == "graphs":
            assert sorted(real) == list(range(200))
            sequences.append([p["batches"] for p in per_rank])
        else:
            assert {g for g, _, _ in real} == set(range(200))
        assert {p["total"] for p in per_rank} == {float(len(real))}
        assert {p["state"]["position"] for p in per_rank} == {per_rank[0]["steps"] * world}
    assert all(s == sequences[0] for s in sequences)  # same batches whatever the worker count
