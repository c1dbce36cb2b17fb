"""Fit an amortised student: from a teacher's (input, output) sequences, predict its impulse response.

    cd examples/ssm && cachebuild build --config ssm.toml --out ../../cache/ssm && cd -
    python examples/ssm/train.py --cache cache/ssm --steps 200

Replaces generating inputs and impulse responses inside the training loop (the
users' sweep) with a prebuilt cache streamed by the ``records`` view: fixed
shapes, one host-to-device copy per batch, the stall monitor's summary at the end.
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


def batches(args: argparse.Namespace, device: torch.device):
    stream = ShardStream(args.cache, view="records", batch_size=args.batch_size, shuffle=True, seed=args.seed, fields=["u", "y", "impulse"])
    loader = make_loader(stream, num_workers=args.workers)
    for epoch in range(10**9):
        loader.set_epoch(epoch)
        for b in to_device(loader, device):
            yield b["u"], b["y"], b["impulse"], (~b["is_pad"]).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache/ssm")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    data = batches(args, device)
    u, y, h, keep = next(data)
    m, length = u.shape[1], u.shape[2]
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * m * length, args.hidden), nn.GELU(), nn.Linear(args.hidden, length)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = StallMonitor(batch_size=lambda b: int(b[0].shape[0]), sample_every_s=0.2)
    t0, loss_v = time.perf_counter(), float("nan")
    for step, (u, y, h, keep) in enumerate(monitor.wrap(data)):
        pred = model(torch.stack([u, y], dim=1))
        loss = (((pred - h) ** 2).mean(1) * keep).sum() / keep.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            loss_v = float(loss.detach())
            print(f"step {step:5d}  loss {loss_v:.4f}", flush=True)
        if step + 1 >= args.steps:
            break
    summary = monitor.summary()
    monitor.close()
    d = print_summary(f"ssm student on {device}", summary, {"final_loss": loss_v, "total_s": time.perf_counter() - t0})
    if args.json:
        print(json.dumps(d))


if __name__ == "__main__":
    main()
