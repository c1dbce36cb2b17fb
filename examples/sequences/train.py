"""Train on variable-length trajectories, each batch padded to its own longest one.

    cd examples/sequences && cachebuild build --config sequences.toml --out ../../cache/sequences && cd -
    python examples/sequences/train.py --cache cache/sequences --steps 200

The users padded ``states`` in a per-batch Python collate; here the ``records``
view ships fixed-shape batches (padded to the cache's maximum, with each
record's shape) in one host-to-device copy, and ``trim_to_batch_max`` cuts
each one to its longest trajectory on the device, adding ``states_lengths``.
``--fixed`` keeps the cache-wide shape (one shape for ``torch.compile``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import pick_device, print_summary  # noqa: E402
from loaders import ShardStream, make_loader, to_device  # noqa: E402
from loaders.monitor import StallMonitor  # noqa: E402
from loaders.ragged import padding_fraction, trim_to_batch_max  # noqa: E402


class Pooled(nn.Module):
    """Per-step MLP, mean over each trajectory's own steps, then a linear head."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.step = nn.Sequential(nn.Linear(2 * dim, hidden), nn.GELU())
        self.head = nn.Linear(hidden, dim)

    def forward(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(states.shape[1], device=states.device)
        mask = (steps[None, :] < lengths[:, None]).unsqueeze(-1).float()
        diffs = torch.diff(states, dim=1, prepend=states[:, :1])
        z = self.step(torch.cat([states, diffs], dim=-1)) * mask
        return self.head(z.sum(1) / lengths[:, None].clamp(min=1).float())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache/sequences")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--fixed", action="store_true", help="keep the cache-wide padded shape")
    ap.add_argument("--bucket", action="store_true", help="batches of similar lengths (the records view's bucket_by): far less padding")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    buckets = {"bucket_by": "states"} if args.bucket else {}
    stream = ShardStream(args.cache, view="records", batch_size=args.batch_size, shuffle=True, seed=args.seed, masks=False, **buckets)
    loader = make_loader(stream, num_workers=args.workers)
    dim = stream.manifest.schema("target").max_shape[0]
    model = Pooled(dim, args.hidden).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def data():
        for epoch in range(10**9):
            loader.set_epoch(epoch)
            for b in to_device(loader, device):
                yield b if args.fixed else trim_to_batch_max(b, ["states"])

    monitor = StallMonitor(batch_size=lambda b: int(b["states"].shape[0]), sample_every_s=0.2)
    t0, loss_v, pads = time.perf_counter(), float("nan"), []
    for step, b in enumerate(monitor.wrap(data())):
        lengths = b["states_shape"][:, 0]
        pred = model(b["states"], lengths)
        keep = (~b["is_pad"]).float()
        loss = (((pred - b["target"]) ** 2).mean(1) * keep).sum() / keep.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            loss_v = float(loss.detach())
            pads.append(padding_fraction(b["states_shape"].cpu().numpy(), b["states"].shape[1:]))
            print(f"step {step:5d}  loss {loss_v:.4f}  padded to {b['states'].shape[1]} steps", flush=True)
        if step + 1 >= args.steps:
            break
    summary = monitor.summary()
    monitor.close()
    extra = {"final_loss": loss_v, "padding": sum(pads) / max(len(pads), 1), "total_s": time.perf_counter() - t0}
    d = print_summary(f"sequences ({'cache-max' if args.fixed else 'batch-max'} padding{', length buckets' if args.bucket else ''}) on {device}", summary, extra)
    if args.json:
        print(json.dumps(d))


if __name__ == "__main__":
    main()
