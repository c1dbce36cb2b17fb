"""Train a small leak detector on mel segments, evaluate it per file, and show whether the GPU waits.

    cachebuild mel --synthetic 500 --out cache/mel-demo                     # a mel cache to try it
    python examples/train_mel.py --cache cache/mel-demo --epochs 2           # our loader
    python examples/train_mel.py --cache cache/mel-demo --epochs 2 --baseline  # the users' HDF5 pipeline
    python examples/train_mel.py --baseline --h5 leaks.h5                    # their file, their pipeline

The model is a small CNN over one segment ``[1, n_mels, t=1]``: two 1-D convolutions
along the mel bins, pooled, one leak logit. With our loader it trains on the ``mel``
view (one row per segment, mixed across files, float16 as stored, pinned and copied
on a side stream by ``to_device``) and, at the end of each epoch, evaluates every file
through the ``mel_files`` view: a batch of files is one model call on all their
segments and one vectorised vote (:func:`cachebuild.mel.voting.file_votes`).

With ``--baseline`` the same model is fed by a faithful re-implementation of the
users' pipeline: their HDF5 per-item Dataset (one segment per ``__getitem__``, h5py
opened lazily per worker, ``shuffle=True``, default collate; the one in
``benchmarks/bench_mel.py``), and evaluated by their per-file loop (one HDF5 slice
per file, the model, the same vote). Without ``--h5`` an HDF5 file in their layout is
written first from the cache (or synthetic data when there is no cache).

Both print the stall monitor's summary (how long the trainer waited for data) and the
file-level accuracy of each epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from _common import open_stream, pick_device, print_summary
from loaders import ShardStream, make_loader, to_device
from cachebuild.mel.voting import file_confusion, file_votes, leak_label_id
from loaders.monitor import StallMonitor

SHARED = {"auto": None, "on": True, "off": False}  # make_loader(shared_pools=...)
MEL_HINT = "cachebuild mel --synthetic 500 --out {cache}"


class MelCNN(nn.Module):
    """Leak logit of one segment ``[N, 1, M, T]`` (any float dtype, dB): 1-D convolutions over the mel bins."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, width // 2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(width // 2, width, 5, padding=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(width, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], 1, -1).float() / 50.0).squeeze(-1)


# --------------------------------------------------------------------------- ours
def batches_ours(args, device, epoch: int, state: dict):
    """The ``mel`` view of epoch ``epoch``: (segments, leak target, weight of real rows)."""
    if "loader" not in state:
        stream = open_stream(args.cache, "mel", MEL_HINT.format(cache=args.cache), batch_size=args.batch_size, shuffle=True, seed=args.seed)
        state["loader"] = make_loader(stream, num_workers=args.workers, shared_pools=SHARED[args.shared_pools])
        state["leak"] = leak_label_id(stream.manifest)
    loader, leak = state["loader"], state["leak"]
    loader.set_epoch(epoch)
    if args.resident and "kept" not in state:  # an ideal loader: the first N batches, kept on the device and cycled
        got = to_device(loader, device)
        state["kept"] = [{k: v.clone() for k, v in b.items()} for _, b in zip(range(args.resident), got)]
        got.close()
    for b in state["kept"] * 8 if args.resident else to_device(loader, device):
        yield b["mel"], (b["label"] == leak).float(), (~b["is_pad"]).float()


def evaluate_ours(args, model, device) -> dict:
    """Every file once, through ``mel_files``: one model call per batch of files, one vectorised vote."""
    stream = open_stream(args.cache, "mel_files", MEL_HINT.format(cache=args.cache), batch_size=args.eval_files, shuffle=False)
    leak = leak_label_id(stream.manifest)
    L, S, M, T = stream.view.max_shape
    decisions, labels, pads = [], [], []
    model.eval()
    with torch.inference_mode():
        for b in to_device(make_loader(stream, num_workers=0), device):
            F = b["mel"].shape[0]
            logits = model(b["mel"].reshape(-1, 1, M, T)).reshape(F, L, S)
            _, decision = file_votes(logits, long_mask=b["long_mask"])
            decisions.append(decision.cpu())
            labels.append(b["label"].cpu())
            pads.append(b["is_pad"].cpu())
    model.train()
    return file_confusion(torch.cat(decisions), torch.cat(labels), leak, torch.cat(pads))


# --------------------------------------------------------------------------- the users' pipeline
def write_h5_from_cache(cache: str, path: Path) -> None:
    """The cache's files, in order, written in the users' HDF5 layout (labels, segments_mel, label2id_json)."""
    import h5py

    stream = ShardStream(cache, view="mel_files", batch_size=256, shuffle=False)
    n = stream.manifest.records
    L, S, M, T = stream.view.max_shape
    with h5py.File(path, "w") as f:
        lab = f.create_dataset("labels", (n,), np.int16)
        mel = f.create_dataset("segments_mel", (n, L, S, M, T), np.float16, chunks=(8, L, S, M, T))
        for b in stream:
            keep = ~b["is_pad"].numpy()
            ids = b["file_id"].numpy()[keep]
            order = np.argsort(ids)
            lo, hi = int(ids[order[0]]), int(ids[order[-1]]) + 1
            mel[lo:hi] = b["mel"].numpy()[keep][order].astype(np.float16)
            lab[lo:hi] = b["label"].numpy()[keep][order]
        src = stream.manifest.config.get("source") or {}
        f.attrs["label2id_json"] = json.dumps(src.get("label2id") or {"LEAK": leak_label_id(stream.manifest)})


def baseline_h5(args) -> Path:
    if args.h5:
        return Path(args.h5)
    args.tmp_dir = tempfile.mkdtemp(prefix="train-mel-")  # removed at the end of main()
    path = Path(args.tmp_dir) / "user.h5"
    if Path(args.cache, "manifest.json").exists():
        write_h5_from_cache(args.cache, path)
        print(f"wrote {path} from {args.cache} (the users' HDF5 layout)", flush=True)
    else:
        from bench_mel import write_user_h5

        write_user_h5(path, args.synthetic_files, seed=args.seed)
        print(f"wrote {path}: {args.synthetic_files} synthetic files (no cache at {args.cache})", flush=True)
    return path


def _h5_leak(path: Path) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        table = json.loads(f.attrs.get("label2id_json", '{"LEAK": 0}'))
    return int(table.get("LEAK", 0))


def batches_baseline(args, device, epoch: int, state: dict):
    """Their Dataset + DataLoader(shuffle=True, default collate): one ``__getitem__`` per segment."""
    from bench_mel import UserSegmentDataset

    if "loader" not in state:
        state["h5"] = baseline_h5(args)
        state["leak"] = _h5_leak(state["h5"])
        torch.manual_seed(args.seed)
        state["loader"] = torch.utils.data.DataLoader(UserSegmentDataset(state["h5"]), batch_size=args.batch_size, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0)
    for x, y in state["loader"]:
        x = x.to(device, non_blocking=True)
        y = (y == state["leak"]).float().to(device, non_blocking=True)
        yield x, y, torch.ones_like(y)


def evaluate_baseline(args, model, device, state: dict) -> dict:
    """Their per-file loop: one HDF5 slice per file, the model on its segments, the same vote."""
    import h5py

    decisions, labels = [], []
    model.eval()
    with h5py.File(state["h5"], "r") as f, torch.inference_mode():
        mel, lab = f["segments_mel"], f["labels"][...]
        _, L, S, M, T = mel.shape
        for i in range(mel.shape[0]):
            x = torch.from_numpy(mel[i]).to(device)
            logits = model(x.reshape(L * S, 1, M, T)).reshape(1, L, S)
            decisions.append(file_votes(logits)[1].cpu())
            labels.append(int(lab[i]))
    model.train()
    return file_confusion(torch.cat(decisions), torch.tensor(labels), state["leak"])


# --------------------------------------------------------------------------- training
def train_step(model, opt, x, y, keep, loss_v: float, i: int, label: str) -> tuple[float, torch.Tensor]:
    """One optimiser step on a batch; prints (and syncs for) the loss every 50 steps. (last printed loss, this step's loss)"""
    logits = model(x)
    loss = (nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none") * keep).sum() / keep.sum().clamp(min=1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if i % 50 == 0:
        loss_v = float(loss.detach())
        print(f"{label}  loss {loss_v:.4f}", flush=True)
    return loss_v, loss.detach()


def train_for(args, model, opt, device, feed, title: str, state: dict, t0: float) -> dict:
    """``--seconds``: epoch after epoch under one stall monitor until the time is up; the summary."""

    def chained():
        for epoch in range(10**9):
            yield from feed(args, device, epoch, state)

    monitor = StallMonitor(batch_size=lambda b: int(b[0].shape[0]), sync_cuda=args.sync_cuda, sample_every_s=0.2)
    loss_v, last = float("nan"), None
    it = monitor.wrap(chained())
    for i, (x, y, keep) in enumerate(it):
        loss_v, last = train_step(model, opt, x, y, keep, loss_v, i, f"step {i:5d}")
        if time.perf_counter() - t0 >= args.seconds or (args.steps is not None and i + 1 >= args.steps):
            break
    it.close()
    summary = monitor.summary()
    monitor.close()
    extra = {"final_loss": float(last) if last is not None else loss_v, "total_s": time.perf_counter() - t0, **monitor.gpu_idle_gaps()}
    return print_summary(f"{title} on {device}, {args.seconds:g} s", summary, extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache/mel-demo", help="mel cache (cachebuild mel --synthetic 500 --out cache/mel-demo)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (default: the whole epoch)")
    ap.add_argument("--batch-size", type=int, default=1024, help="segments per batch")
    ap.add_argument("--eval-files", type=int, default=64, help="files per mel_files batch in evaluation")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shared-pools", choices=sorted(SHARED), default="auto", help="workers share decoded pools: auto (when workers outnumber free cores), on, off")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--baseline", action="store_true", help="feed the model with the users' HDF5 per-item Dataset instead")
    ap.add_argument("--h5", default=None, help="--baseline: the users' HDF5 file (default: written from --cache, else synthetic)")
    ap.add_argument("--synthetic-files", type=int, default=500, help="--baseline without --h5 and without a cache: files to synthesise")
    ap.add_argument("--no-eval", action="store_true", help="skip the file-level evaluation")
    ap.add_argument("--resident", type=int, default=0, metavar="N", help="benchmark: cycle N batches of our loader kept on the device (an ideal loader: the loop's own floor)")
    ap.add_argument("--seconds", type=float, default=None, help="train for this much wall time, epochs chained under one monitor, no evaluation (a benchmark mode)")
    ap.add_argument("--sync-cuda", action="store_true", help="synchronise CUDA after every step (exact per-step wait, but the GPU idles while the next step is launched)")
    ap.add_argument("--json", action="store_true", help="print the last summary as JSON too")
    args = ap.parse_args()

    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    model = MelCNN(args.width).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    feed = batches_baseline if args.baseline else batches_ours
    title = "baseline (users' HDF5 per-item Dataset)" if args.baseline else "cachebuild mel view"
    state: dict = {}
    t0 = time.perf_counter()
    d: dict = {}
    if args.seconds is not None:  # epochs chained under one monitor, stopped by the clock
        d = train_for(args, model, opt, device, feed, title, state, t0)
    for epoch in range(args.epochs if args.seconds is None else 0):
        monitor = StallMonitor(batch_size=lambda b: int(b[0].shape[0]), sync_cuda=args.sync_cuda, sample_every_s=0.2)
        loss_v, last = float("nan"), None
        for i, (x, y, keep) in enumerate(monitor.wrap(feed(args, device, epoch, state))):
            loss_v, last = train_step(model, opt, x, y, keep, loss_v, i, f"epoch {epoch} step {i:5d}")
            if args.steps is not None and i + 1 >= args.steps:
                break
        summary = monitor.summary()
        monitor.close()
        extra: dict = {"epoch": epoch, "final_loss": float(last) if last is not None else loss_v}
        if not args.no_eval:
            t = time.perf_counter()
            metrics = evaluate_baseline(args, model, device, state) if args.baseline else evaluate_ours(args, model, device)
            extra.update(file_accuracy=metrics["accuracy"], files=metrics["files"], eval_s=time.perf_counter() - t)
        extra["total_s"] = time.perf_counter() - t0
        d = print_summary(f"{title} on {device}, epoch {epoch}", summary, extra)
    if getattr(args, "tmp_dir", None):
        shutil.rmtree(args.tmp_dir, ignore_errors=True)
    if args.json:
        print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}))


if __name__ == "__main__":
    main()
