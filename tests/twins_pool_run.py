"""A DDP rank body for the ``compact="pool"`` tests (importable by ``spawn`` children): each rank expands
its pool batches with its own :class:`loaders.TwinsContext` and compares them with the default view's."""

from __future__ import annotations

from gloo_rank import gloo_rank


def pool_rank_main(rank: int, world: int, port: int, root: str, out_dir: str, num_workers: int) -> None:
    """Two epochs of ``twins`` ``compact="pool"`` batches through ``make_loader``; per batch: its global
    number and whether ``ctx.expand`` equals the default view's batch bit for bit; an all_reduce per step."""
    import torch
    import torch.distributed as dist

    from loaders import ShardStream, TwinsContext, make_loader

    kw = {"view": "twins", "batch_size": 1200, "seed": 6, "mix": 64}
    with gloo_rank(rank, world, port, out_dir) as result:
        stream = ShardStream(root, compact="pool", **kw)
        full = ShardStream(root, **kw)
        loader = make_loader(stream, num_workers=num_workers, prefetch_factor=2, multiprocessing_context="fork" if num_workers else None)
        ctx = TwinsContext(loader)
        seen = []
        for epoch in range(2):
            for batch in loader:
                _, e, b = ctx.meta(batch)
                got, want = ctx.expand(batch), full.batch(b, e)
                same = list(got) == list(want) and all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
                seen.append([e, b, same])
                dist.all_reduce(torch.tensor([1.0]))  # a rank with fewer steps would hang here
        ctx.close()
        result["batches"] = seen
        result["max_held"] = ctx.max_held
        result["pool_span"] = stream.plan(1).pool_span
