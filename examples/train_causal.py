"""Train a small MLP on twin-world rows of a causal cache, and show whether the GPU waits.

    python examples/train_causal.py --cache cache/demo --steps 200            # our loader
    python examples/train_causal.py --steps 200 --baseline                     # the users' on-the-fly pipeline

The model predicts a twin row's delta (int_row - base_row) from the base row, the
intervened node and value, and a summary of the graph (mean/std of its base rows and
its adjacency). With our loader it reads the ``twins`` view in compact mode (each
graph's context once per batch, gathered by ``graph_index`` on the device); with
``--baseline`` the same model is fed by a faithful re-implementation of the users'
pipeline (networkx + pandas per graph, one dict per row, padding collate). Both print
the stall monitor's summary: how long the trainer waited for data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from _common import open_stream, pick_device, print_summary
from loaders import make_loader, to_device
from loaders.monitor import StallMonitor

SHARED = {"auto": None, "on": True, "off": False}  # make_loader(shared_pools=...)
CAUSAL_HINT = "cachebuild generate --graphs 5000 --out {cache}   (make demo builds cache/demo)"


class TwinMLP(nn.Module):
    """delta_hat = MLP(base row, one-hot target, value, graph context)."""

    def __init__(self, n: int, hidden: int = 512):
        super().__init__()
        self.n = n
        self.net = nn.Sequential(nn.Linear(3 * n + 1 + 2 * n + n * n, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, n))

    @staticmethod
    def context(base: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        """Per graph: mean and std of its base rows, and its flattened adjacency."""
        return torch.cat([base.mean(1), base.std(1), adj.flatten(1)], dim=1)

    def forward(self, row: torch.Tensor, mask: torch.Tensor, value: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([row, mask, row * mask, value[:, None], ctx], dim=1))


def batches_ours(args, device):
    stream = open_stream(args.cache, "twins", CAUSAL_HINT.format(cache=args.cache), batch_size=args.batch_size, shuffle=True, seed=args.seed, compact=True)
    loader = make_loader(stream, num_workers=args.workers, handover=args.handover, shared_pools=SHARED[args.shared_pools])
    n = stream.manifest.schema("adj").max_shape[0]

    def device_batches():
        for epoch in range(10**9):
            loader.set_epoch(epoch)
            yield from to_device(loader, device)

    def gen():
        for b in resident(device_batches(), args.resident) if args.resident else device_batches():
            gi = b["graph_index"].long()
            ctx = TwinMLP.context(b["ctx_base"].float(), b["ctx_adj"].float())[gi]
            yield b["target_row"].float(), b["int_mask"].float(), b["value"].float(), ctx, b["delta"].float(), (~b["is_pad"]).float()

    return n, gen()


def resident(batches, count: int):
    """``count`` batches kept on the device and cycled: a free, ideal loader (the training loop's own floor)."""
    kept = [{k: v.clone() for k, v in b.items()} for _, b in zip(range(count), batches)]
    batches.close()
    while True:
        yield from kept


def batches_baseline(args, device):
    from user_pipeline import UserStyleCausalDataset, collate_fn_pad

    n = 10
    ds = UserStyleCausalDataset(max_nodes=n, seed=args.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, collate_fn=collate_fn_pad, num_workers=args.workers, persistent_workers=args.workers > 0)

    def gen():
        for b in loader:
            b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
            ctx = TwinMLP.context(b["base_samples"], b["adj"])
            value = ((b["target_row"] + b["delta"]) * b["int_mask"]).sum(1)
            yield b["target_row"], b["int_mask"], value, ctx, b["delta"], torch.ones(len(value), device=device)

    return n, gen()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache/demo", help="causal cache (cachebuild generate --out ...)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=4096, help="twin rows per batch")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shared-pools", choices=sorted(SHARED), default="auto", help="workers share decoded pools: auto (when workers outnumber free cores), on, off")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--baseline", action="store_true", help="feed the model with the users' on-the-fly pipeline instead")
    ap.add_argument("--handover", type=int, default=2, help="make_loader's handover depth (0: no hand-over thread)")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for this process (how long a thread may hold the GIL; Python's default 0.005 s)")
    ap.add_argument("--resident", type=int, default=0, metavar="N", help="benchmark: cycle N batches of our loader kept on the device (an ideal loader: the loop's own floor)")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this much wall time (whichever of --steps/--seconds comes first)")
    ap.add_argument("--sync-cuda", action="store_true", help="synchronise CUDA after every step (exact per-step wait, but the GPU idles while the next step is launched)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON too")
    args = ap.parse_args()

    device = pick_device(args.device)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    torch.manual_seed(args.seed)
    n, batches = (batches_baseline if args.baseline else batches_ours)(args, device)
    model = TwinMLP(n, args.hidden).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = StallMonitor(batch_size=lambda b: int(b[0].shape[0]), sync_cuda=args.sync_cuda, sample_every_s=0.2)
    t0 = time.perf_counter()
    loss_v, loss = float("nan"), None
    for step, (row, mask, value, ctx, delta, keep) in enumerate(monitor.wrap(batches)):
        pred = model(row, mask, value, ctx)
        loss = (((pred - delta) ** 2).mean(1) * keep).sum() / keep.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            loss_v = float(loss.detach())
            print(f"step {step:5d}  loss {loss_v:.4f}", flush=True)
        if step + 1 >= args.steps or (args.seconds is not None and time.perf_counter() - t0 >= args.seconds):
            break
    if loss is not None:
        loss_v = float(loss.detach())  # the last step's loss (not the last printed one)
    summary = monitor.summary()
    monitor.close()
    title = "baseline (users' on-the-fly pipeline)" if args.baseline else "cachebuild twins view"
    d = print_summary(f"{title} on {device}", summary, {"final_loss": loss_v, "total_s": time.perf_counter() - t0, **monitor.gpu_idle_gaps()})
    if args.json:
        print(json.dumps(d))


if __name__ == "__main__":
    main()
