"""A DDP test that hangs fails with the stacks of its ranks and of their DataLoader workers (:mod:`rank_stacks`)."""

from __future__ import annotations

import psutil
import pytest

from loader_fixtures import free_port, spawn_ranks
from rank_stacks import IN_FORK_HINT, diagnosis
from stuck_rank_run import stuck_rank_main


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_a_hung_rank_fails_with_its_own_and_its_workers_stacks(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        spawn_ranks(stuck_rank_main, (1, free_port(), str(tmp_path)), 1, tmp_path, 12)
    text = str(failed.value)
    assert "did not finish within 12 s" in text
    rank, _, child = text.partition("=== rank 0 child")
    assert "=== rank 0, pid" in rank and "rank0.json written: no" in rank and "stuck_rank_main" in rank and "worker_stuck_here" not in rank  # the rank waits on its worker
    assert "worker_stuck_here" in child  # the worker's own stack, labelled as the rank's child
    assert IN_FORK_HINT not in text  # a worker that did start is not called stuck in fork()
    pids = [int(line.split("pid ")[1].split()[0]) for line in text.splitlines() if line.startswith("=== rank")]
    assert len(pids) >= 2 and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # all killed


_STUCK_IN_FORK = """Thread 0x00007f0f6b7fe6c0 (most recent call first):
  <no Python frame>

Current thread 0x00007f0f931ceb80 (most recent call first):
  File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 66 in _launch
  File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 19 in __init__
  File "/usr/lib/python3.11/multiprocessing/context.py", line 281 in _Popen
"""


def test_a_worker_stuck_inside_fork_is_named_as_such():
    # the stack of the worker that hung in CI-like runs (docs/DECISIONS.md), and a healthy worker's:
    # the same _launch frame, but below the worker's own frames
    assert diagnosis(_STUCK_IN_FORK) is IN_FORK_HINT
    healthy = _STUCK_IN_FORK.replace(
        "Current thread 0x00007f0f931ceb80 (most recent call first):\n", 'Current thread 0x1 (most recent call first):\n  File "/x/torch/utils/data/_utils/worker.py", line 374 in _worker_loop\n'
    )
    assert diagnosis(healthy) is None
