"""The stall monitor tried as a user would (review): known delays, a loop left early, and DDP.

Found: under DDP a rank whose own loader keeps up reports ~0 % wait while a peer is data-bound
(it waits inside the step's all-reduce, which the monitor counts as step time), so the rank-0
log a user reads said "not data-bound". ``summary_across_ranks()`` gathers every rank's number.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from loaders.monitor import StallMonitor
from bounded_run import run_bounded, tails
from ports import free_port

SCRIPT = Path(__file__).with_name("monitor_ranks_run.py")


def _slow(n: int, delay_s: float):
    for _ in range(n):
        time.sleep(delay_s)
        yield np.zeros((8, 3))


@pytest.mark.parametrize("delay_ms,step_ms", [(20, 2), (2, 20)])
def test_wait_fraction_follows_the_slower_side(delay_ms, step_ms):
    """Loader slower than the consumer: most of the time is wait; faster: little. Loose bounds (a shared machine)."""
    monitor = StallMonitor(sample_every_s=None, warn=None)
    for _ in monitor.wrap(_slow(30, delay_ms / 1e3)):
        time.sleep(step_ms / 1e3)
    s = monitor.summary()
    expect = delay_ms / (delay_ms + step_ms)
    assert s.steps == 29 and s.samples == 29 * 8
    assert expect - 0.15 < s.wait_fraction < expect + 0.15 and s.wait_s < s.wall_s


def test_loop_left_early_and_exhausted_loader_both_close_the_epoch():
    monitor = StallMonitor(sample_every_s=None, warn=None)
    for i, _ in enumerate(monitor.wrap(_slow(40, 0.001))):
        if i == 9:
            break
    assert len(monitor.history) == 1 and monitor.history[0].steps == 9
    for _ in monitor.wrap(_slow(3, 0.001)):  # shorter than the next epoch's plan: ends when exhausted
        pass
    assert [h.steps for h in monitor.history] == [9, 2]
    assert "    1 " in monitor.table()


def test_summary_across_ranks_without_distributed_is_this_process():
    monitor = StallMonitor(sample_every_s=None, warn=None)
    for _ in monitor.wrap(_slow(5, 0.001)):
        pass
    both = monitor.summary_across_ranks()
    assert both["ranks"] == 1 and both["wait_fraction_max"] == both["wait_fraction_mean"] == monitor.summary().wait_fraction


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_ddp_data_bound_peer_is_seen_from_every_rank(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    done = run_bounded([sys.executable, str(SCRIPT), str(free_port()), str(tmp_path)], env, 120)
    assert done.returncode == 0, tails(done)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["own"] < 0.3 < 0.5 < ranks[1]["own"]  # rank 0 alone would say: not data-bound
    for r in ranks:
        assert r["ranks"] == 2 and r["slowest_rank"] == 1
        assert r["wait_fraction_max"] == pytest.approx(ranks[1]["own"]) and r["wait_fraction_mean"] < r["wait_fraction_max"]
