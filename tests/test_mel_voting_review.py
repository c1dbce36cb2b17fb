"""File votes through the ``mel`` view under DDP (review).

Found: the ``mel`` view splits a file's segments between ranks, so each rank's
``VoteAccumulator.result()`` voted on its share of each file alone (fractions over a
rank's windows, decisions that disagree between ranks), with nothing saying so.
``all_reduce()`` sums the tallies of every rank first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import build_mel_from_arrays
from bounded_run import run_bounded, tails
from ports import free_port

SCRIPT = Path(__file__).with_name("vote_ranks_run.py")
sys.path.insert(0, str(SCRIPT.parent))


@pytest.fixture(scope="module")
def mel_cache(tmp_path_factory) -> Path:
    pytest.importorskip("h5py")
    return build_mel_from_arrays(tmp_path_factory.mktemp("votes") / "cache", files=24, seed=5)


def test_all_reduce_without_distributed_changes_nothing(mel_cache):
    from vote_ranks_run import tally

    acc = tally(str(mel_cache))
    before = acc.result()[0].clone()
    assert np.array_equal(acc.all_reduce().result()[0].numpy(), before.numpy())


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_two_ranks_vote_like_one_after_all_reduce(mel_cache, tmp_path):
    from vote_ranks_run import tally

    want = tally(str(mel_cache)).result()[0].numpy()  # one process, every segment
    assert 0 < (want >= 0.5).sum() < len(want)  # the stand-in model splits the files
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    done = run_bounded([sys.executable, str(SCRIPT), str(mel_cache), str(free_port()), str(tmp_path)], env, 120)
    assert done.returncode == 0, tails(done)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        np.testing.assert_allclose(r["after"], want, rtol=0, atol=1e-12)
    assert not np.allclose(ranks[0]["before"], want)  # a rank's own share is not the file's vote
