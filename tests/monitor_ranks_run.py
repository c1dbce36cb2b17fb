"""Two gloo ranks on CPU, each wrapping a loader in a StallMonitor; rank 1's loader is slow (a script
for tests/test_monitor_review.py). ``python tests/monitor_ranks_run.py PORT OUT`` writes each rank's
own summary and ``summary_across_ranks()`` to ``OUT/rank<r>.json``."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from loaders.monitor import StallMonitor  # noqa: E402


def _batches(n: int, delay_s: float):
    for _ in range(n):
        time.sleep(delay_s)
        yield torch.zeros(4)


def _rank(rank: int, port: str, out: str) -> None:
    faulthandler.dump_traceback_later(100, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    monitor = StallMonitor(sample_every_s=None, warn=None)
    for _ in monitor.wrap(_batches(25, 0.02 if rank == 1 else 0.0)):
        dist.all_reduce(torch.ones(1))  # the step's gradient all-reduce: waits for the slow rank
        time.sleep(0.005)
    own = monitor.summary().wait_fraction
    both = monitor.summary_across_ranks()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"own": own, **both}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_rank, args=(sys.argv[1], sys.argv[2]), nprocs=2)
