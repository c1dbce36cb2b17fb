"""A DDP rank iterating a ShardStream made in the parent and handed to the ranks by ``torch.multiprocessing.spawn``
(as Lightning's ``ddp_spawn`` does): per epoch, the record ids it trained on. Imported by the spawned ranks."""

from __future__ import annotations

from typing import Any

from gloo_rank import gloo_rank


def rank_main(rank: int, world: int, port: int, stream: Any, out_dir: str, kind: str, context: str) -> None:
    """``kind``: ``"make"`` (``make_loader``) or ``"plain"`` (a torch DataLoader), one worker started by ``context``."""
    import torch
    from torch.utils.data import DataLoader

    from loaders import make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        if kind == "make":
            loader = make_loader(stream, num_workers=1, multiprocessing_context=context)
        else:
            loader = DataLoader(stream, batch_size=None, num_workers=1, persistent_workers=True, multiprocessing_context=context)
        epochs = []
        for _ in range(2):
            ids = []
            for b in loader:
                ids += b["record_id"][~b["is_pad"]].tolist()
                torch.distributed.all_reduce(torch.zeros(1))
            epochs.append(ids)
        result["epochs"] = epochs  # (gloo_rank writes out_dir/rank{r}.json)
