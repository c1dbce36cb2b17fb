"""Who is reading: rank and world size of the job, worker id and count inside a rank.

Read once, at iteration time (never at import), into a small frozen value
object that tests can build by hand. Rank and world size come from explicit
arguments, else ``torch.distributed`` when it is initialised, else (inside a
DataLoader worker whose parent did not say) the ``RANK``/``WORLD_SIZE``
variables that ``torchrun`` sets; the worker id and count come from
``torch.utils.data.get_worker_info()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["World", "detect_ranks", "process_group_world", "worker_part"]


@dataclass(frozen=True)
class World:
    """One reader's place: ``rank`` of ``world_size`` ranks, ``worker`` of ``num_workers`` in its rank."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker {self.worker} is not one of {self.num_workers} workers")


def detect_ranks(rank: int | None = None, world_size: int | None = None, env_fallback: bool = False, parent: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process: explicit values win, then torch.distributed.

    ``env_fallback`` (a DataLoader worker whose parent process did not hand it a world): then
    ``parent``, the world of the rank that pickled the stream for this worker
    (:func:`process_group_world`; a worker started by ``spawn`` or ``forkserver`` is in no
    process group, and ``torch.multiprocessing.spawn`` sets no ``RANK``), then
    ``RANK``/``WORLD_SIZE`` (set by torchrun).
    """
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    d_rank, d_world = 0, 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            d_rank, d_world = dist.get_rank(), dist.get_world_size()
        elif env_fallback and parent is not None:
            d_rank, d_world = parent
        elif env_fallback and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            d_rank, d_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (ImportError, RuntimeError, ValueError):
        pass
    return (d_rank if rank is None else int(rank)), (d_world if world_size is None else int(world_size))


def process_group_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of torch.distributed's process group, or None when there is none."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (ImportError, RuntimeError, ValueError):
        pass
    return None


def worker_part() -> tuple[int, int]:
    """``(worker id, worker count)`` of the current DataLoader worker, ``(0, 1)`` outside one."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))
