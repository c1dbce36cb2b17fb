"""A run stopped by ``max_steps`` in the middle of an epoch, resumed from the checkpoint saved after
``fit`` returned: StreamDataModule does what Lightning itself does with a map-style dataset and its
``DistributedSampler`` (docs/DECISIONS.md, "max_steps ending mid-epoch").

Lightning counts that epoch as finished: the resumed run is in ``current_epoch`` 1, its batch index
continues at the step reached (4), and under ``max_steps`` it ends that epoch after the batches the
stopped one had left (6 of 10); the sampler, at epoch 1, starts epoch 1's order from its beginning.
The rest of epoch 0 is never seen, with Lightning's sampler and with ours alike. (A step checkpoint
taken during the run resumes exactly instead: tests/test_lightning_review.py.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

from bounded_run import tails
from fork_runner import ForkServer
from loaders import ShardStream

pytest.importorskip("lightning")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("lightning_max_steps_run.py")
BATCH, SEED, RECORDS = 30, 3, 300  # 10 batches per epoch


def _run(forks: ForkServer, cache: Path, out: Path, tag: str, kinds: tuple[str, ...], max_steps: int, *extra: str) -> dict[str, list[list]]:
    """One fresh process (forked with Lightning imported, tests/fork_runner.py) that runs every kind in turn;
    each kind's batches."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    res = forks.run([sys.executable, str(SCRIPT), str(cache), str(out), tag, ",".join(kinds), str(max_steps), *extra], env, 270)
    assert res.returncode == 0, tails(res)
    return {kind: [json.loads(line) for line in (out / f"{kind}-{tag}.jsonl").read_text().splitlines()] for kind in kinds}


def _orders(cache: Path, kind: str, epochs: int) -> list[list[list[int]]]:
    """Each data epoch's batches (record ids), as the sampler or the stream orders them."""
    out = []
    for e in range(epochs):
        if kind == "map":
            sampler = DistributedSampler(range(RECORDS), num_replicas=1, rank=0, shuffle=True, seed=SEED)
            sampler.set_epoch(e)
            ids = list(sampler)
            out.append([ids[i : i + BATCH] for i in range(0, RECORDS, BATCH)])
        else:
            stream = ShardStream(cache, view="graphs", batch_size=BATCH, seed=SEED)
            stream.set_epoch(e)
            out.append([b["record_id"][~b["is_pad"]].tolist() for b in stream])
    return out


def _pattern(log: list[list], orders: list[list[list[int]]]) -> list[tuple[int, int, int, int]]:
    """(Lightning's epoch, batch_idx, data epoch, position in that epoch's order) of each batch trained on."""
    where = {json.dumps(b): (e, p) for e, batches in enumerate(orders) for p, b in enumerate(batches)}
    return [(epoch, idx, *where[json.dumps(ids)]) for epoch, idx, ids in log]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cachebuild import build

    root = tmp_path_factory.mktemp("maxsteps") / "c"
    build({"kind": "causal", "graph": {"n_min": 5, "n_max": 6}}, root, records=RECORDS, workers=1, progress=False)
    return root


def test_max_steps_mid_epoch_then_resume_matches_lightnings_own_sampler(cache: Path, tmp_path: Path, lightning_forks: ForkServer) -> None:
    want_first = [(0, i, 0, i) for i in range(4)]
    want_resumed = [(1, 4 + i, 1, i) for i in range(6)] + [(2, i, 2, i) for i in range(4)]
    kinds = ("map", "ours", "ours-stream")
    firsts = _run(lightning_forks, cache, tmp_path, "a", kinds, 4)
    resumes = _run(lightning_forks, cache, tmp_path, "b", kinds, 14, "--ckpt-tag", "a")  # a fresh process resumes each kind from its own checkpoint
    got = {}
    for kind in kinds:
        orders = _orders(cache, "map" if kind == "map" else "ours", 4)
        got[kind] = (_pattern(firsts[kind], orders), _pattern(resumes[kind], orders))
        assert got[kind] == (want_first, want_resumed), kind
    assert got["ours"] == got["map"] == got["ours-stream"]
