"""A DDP rank body that hangs on purpose (importable by ``spawn`` children): its DataLoader worker never
returns a batch, so the rank waits for it for ever. The test of :mod:`rank_stacks` looks for both stacks."""

from __future__ import annotations

import time
from typing import Any, Iterator

from gloo_rank import gloo_rank


def worker_stuck_here() -> None:
    while True:
        time.sleep(1)


class _Stuck:
    def __iter__(self) -> Iterator[Any]:
        worker_stuck_here()
        yield 0


def stuck_rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    """One gloo rank whose forked DataLoader worker hangs in :func:`worker_stuck_here`."""
    from torch.utils.data import DataLoader, IterableDataset

    class Stuck(_Stuck, IterableDataset):  # type: ignore[misc]
        pass

    with gloo_rank(rank, world, port, out_dir):
        for _ in DataLoader(Stuck(), batch_size=None, num_workers=1, multiprocessing_context="fork"):
            pass
