"""A DDP rank body for ``tests/test_review_twins_schedule.py`` (importable by ``spawn`` children): each rank
expands its pool batches with its own :class:`loaders.TwinsContext` and records, per batch, whether it
equals the default view's and whether a pool it needs was neither held nor being decoded ahead."""

from __future__ import annotations

from typing import Any

from gloo_rank import gloo_rank


def schedule_rank_main(rank: int, world: int, port: int, root: str, out_dir: str, kw: dict[str, Any]) -> None:
    """Two epochs through ``make_loader`` (2 persistent workers), an all_reduce per step."""
    import torch
    import torch.distributed as dist

    from loaders import ShardStream, TwinsContext, make_loader
    from loaders.pool_schedule import batch_pools

    with gloo_rank(rank, world, port, out_dir) as result:
        stream, full = ShardStream(root, compact="pool", **kw), ShardStream(root, **kw)
        loader = make_loader(stream, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
        ctx = TwinsContext(loader)
        seen, waited = [], []
        for epoch in range(2):
            for i, batch in enumerate(loader):
                _, e, b = ctx.meta(batch)
                plan = stream.plan(e)
                ready = set(ctx.held()) | {ctx.ahead}
                if (epoch, i) != (0, 0) and any((plan.fingerprint(), q) not in ready for q in batch_pools(plan, b).tolist()):
                    waited.append([e, b])
                got, want = ctx.expand(batch), full.batch(b, e)
                seen.append([e, b, list(got) == list(want) and all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)])
                dist.all_reduce(torch.tensor([1.0]))  # a rank with fewer steps would hang here
        ctx.close()
        result.update(batches=seen, waited=waited, max_held=ctx.max_held, pool_span=stream.plan(1).pool_span)
