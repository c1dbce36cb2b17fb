"""Train through the users' curriculum: levels of growing n read through one stream and a schedule.

    python examples/curriculum/levels.py --out cache/curriculum --levels 4 --graphs 2000
    python examples/curriculum/train.py --levels-dir cache/curriculum --levels 4 --epochs-per-level 2

Stage ``k`` (``--epochs-per-level`` epochs) reads level ``k`` with weight 3 and
replays level ``k - 1`` with weight 1; the last stage runs on. One
:class:`loaders.ShardStream` over a :class:`loaders.Mixture` does it: every
batch has the shapes of the largest level (50 nodes; smaller graphs padded,
``node_mask`` says which nodes are real), each new pass is the next epoch of
the schedule, and ``state_dict()`` resumes mid-stage. The model is the twin
MLP of ``examples/train_causal.py``; the stall monitor's summary ends the run.
(Their trainer moves up a level when its validation error is low enough; a
schedule fixes the epochs instead, so a run and its resume read the same data.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _common import pick_device, print_summary  # noqa: E402
from levels import build_levels, level_name  # noqa: E402
from train_causal import TwinMLP  # noqa: E402

from loaders import Mixture, ShardStream, Stage, make_loader, to_device  # noqa: E402
from loaders.monitor import StallMonitor  # noqa: E402


def schedule(levels: int, epochs_per_level: int) -> list[Stage]:
    """Stage k: level k (weight 3) and a replay of level k - 1 (weight 1); the last stage is open-ended."""
    stages = []
    for k in range(levels):
        weights = {level_name(k): 3.0} | ({level_name(k - 1): 1.0} if k else {})
        end = None if k == levels - 1 else (k + 1) * epochs_per_level
        stages.append(Stage((k * epochs_per_level, end), weights))
    return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels-dir", default="cache/curriculum")
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--build", type=int, default=0, metavar="GRAPHS", help="build the levels first, GRAPHS graphs each (levels.py)")
    ap.add_argument("--samples", type=int, default=None, help="with --build: rows per world (default: the recipe's 64)")
    ap.add_argument("--stated-density", action="store_true", help="with --build: their curriculum's stated edge probability (levels.py)")
    ap.add_argument("--epochs-per-level", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None, help="default: every stage once (levels x epochs-per-level)")
    ap.add_argument("--steps-per-epoch", type=int, default=None, help="cap on steps per epoch (default: whole epochs)")
    ap.add_argument("--batch-size", type=int, default=4096, help="twin rows per batch")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON too")
    args = ap.parse_args()

    if args.build:
        roots = build_levels(Path(args.levels_dir), args.levels, args.build, args.samples, stated_density=args.stated_density)
    else:
        roots = {level_name(k): str(Path(args.levels_dir) / level_name(k)) for k in range(args.levels)}
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    mixture = Mixture(roots, schedule=schedule(args.levels, args.epochs_per_level))
    stream = ShardStream(mixture, view="twins", batch_size=args.batch_size, seed=args.seed, compact=True)
    loader = make_loader(stream, num_workers=args.workers)
    n = stream.manifest.schema("adj").max_shape[0]
    model = TwinMLP(n, args.hidden).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = StallMonitor(batch_size=lambda eb: int(eb[1]["target_row"].shape[0]), sample_every_s=0.2)
    epochs = args.epochs if args.epochs is not None else args.levels * args.epochs_per_level

    def batches():
        """``(epoch, batch)`` through every epoch of the schedule: each new pass is the schedule's next epoch."""
        for epoch in range(epochs):
            for k, b in enumerate(to_device(loader, device)):
                yield epoch, b
                if args.steps_per_epoch is not None and k + 1 >= args.steps_per_epoch:
                    break

    t0, loss_v, per_epoch, sums = time.perf_counter(), float("nan"), [], {}
    for epoch, b in monitor.wrap(batches()):
        ctx = TwinMLP.context(b["ctx_base"].float(), b["ctx_adj"].float())[b["graph_index"].long()]
        pred = model(b["target_row"].float(), b["int_mask"].float(), b["value"].float(), ctx)
        keep = (~b["is_pad"]).float()
        loss = (((pred - b["delta"].float()) ** 2).mean(1) * keep).sum() / keep.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_v = float(loss.detach())
        total, steps = sums.get(epoch, (0.0, 0))
        sums[epoch] = (total + loss_v, steps + 1)
    for epoch, (total, steps) in sums.items():
        counts = dict(zip(stream.mixture.names, stream.mixture.counts(epoch).tolist()))  # graphs of each level in that epoch
        per_epoch.append({"epoch": epoch, "graphs": counts, "steps": steps, "loss": round(total / steps, 5)})
        print(f"epoch {epoch}  graphs per level {counts}  steps {steps}  mean loss {total / steps:.4f}")
    summary = monitor.summary()
    monitor.close()
    d = print_summary(f"curriculum over {args.levels} levels (n <= {n}) on {device}", summary, {"final_loss": loss_v, "total_s": time.perf_counter() - t0})
    if args.json:
        print(json.dumps(d | {"epochs": per_epoch, "n_max": n}))


if __name__ == "__main__":
    main()
