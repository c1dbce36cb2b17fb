"""The frame every gloo DDP test rank shares: join the group on loopback, record a failure, leave, report.

A rank body runs inside ``with gloo_rank(rank, world, port, out_dir) as result:``
and fills ``result``; an exception is recorded as ``result["error"]`` (the parent
test asserts on it) instead of killing the rank, and ``out_dir/rank{r}.json``
is written whatever happened. The rank is armed first (:func:`rank_stacks.arm`):
if it misses its deadline, the test's failure message carries the stacks of the
rank and of the DataLoader workers it forked. Imported by the
``torch.multiprocessing.spawn`` children, so it lives in a plain module.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rank_stacks import arm


@contextmanager
def gloo_rank(rank: int, world: int, port: int, out_dir: str) -> Iterator[dict[str, Any]]:
    """Run the with-body as rank ``rank`` of ``world`` (gloo, 127.0.0.1:``port``), ending with a barrier."""
    import torch.distributed as dist

    arm(out_dir, rank)  # before anything forks: its workers inherit the stack dump on SIGUSR1
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    result: dict[str, Any] = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        yield result
        dist.barrier()
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
