"""A DDP test that hangs fails with the stacks of its ranks and of their DataLoader workers (:mod:`rank_stacks`)."""

from __future__ import annotations

import psutil
import pytest

from loader_fixtures import free_port, spawn_ranks
from stuck_rank_run import stuck_rank_main


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_a_hung_rank_fails_with_its_own_and_its_workers_stacks(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        spawn_ranks(stuck_rank_main, (1, free_port(), str(tmp_path)), 1, tmp_path, 20)
    text = str(failed.value)
    assert "did not finish within 20 s" in text
    rank, _, child = text.partition("=== rank 0 child")
    assert "=== rank 0, pid" in rank and "rank0.json written: no" in rank and "stuck_rank_main" in rank and "worker_stuck_here" not in rank  # the rank waits on its worker
    assert "worker_stuck_here" in child  # the worker's own stack, labelled as the rank's child
    pids = [int(line.split("pid ")[1].split()[0]) for line in text.splitlines() if line.startswith("=== rank")]
    assert len(pids) >= 2 and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # all killed
