"""A one-process Lightning run stopped by ``max_steps``, for tests/test_lightning_max_steps.py (run as a script).

``python tests/lightning_max_steps_run.py CACHE OUT TAG KINDS MAX_STEPS [--ckpt-tag CTAG]``: for
each kind of the comma-separated ``KINDS``, one after the other (a Trainer and a datamodule of its
own each), trains a do-nothing model for at most ``MAX_STEPS`` steps, through
:class:`loaders.lightning.StreamDataModule` (kind ``ours``: the ``graphs`` view, batch 30, seed 3;
``ours-stream``: the same stream passed itself, read by one worker) or through a map-style dataset
of the same record ids with Lightning's own ``DistributedSampler`` (kind ``map``, seed 3: what
Lightning does with a dataset it knows), writes ``(current_epoch, batch_idx, ids)`` of every batch
to ``OUT/KIND-TAG.jsonl`` and saves ``OUT/KIND-TAG.ckpt`` after ``fit`` returns (the checkpoint a
user saves at the end of a run). ``--ckpt-tag CTAG`` resumes each kind from ``OUT/KIND-CTAG.ckpt``
(written by an earlier process). One process runs all the kinds: Lightning's import is paid once,
not once per kind. A watchdog exits after ``LIGHTNING_RUN_WATCHDOG_S`` seconds (default 240).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

from loaders import ShardStream  # noqa: E402
from loaders.lightning import StreamDataModule  # noqa: E402

BATCH, SEED = 30, 3


class Ids(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class MapModule(pl.LightningDataModule):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def train_dataloader(self) -> DataLoader:
        data = Ids(self.n)
        return DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=SEED))


class Log(pl.LightningModule):
    def __init__(self, path: Path):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.path = path

    def training_step(self, batch, batch_idx):
        ids = batch["record_id"][~batch["is_pad"]] if isinstance(batch, dict) else batch
        with open(self.path, "a") as f:
            f.write(json.dumps([self.current_epoch, batch_idx, ids.tolist()]) + "\n")
        return (self.w * ids.float().mean()).sum() ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(cache: str, out: Path, tag: str, kind: str, max_steps: int, ckpt: str | None) -> None:
    """One run of ``kind``: train up to ``max_steps``, log every batch, save the checkpoint at the end."""
    if kind == "ours":
        dm: pl.LightningDataModule = StreamDataModule(lambda: ShardStream(cache, view="graphs", batch_size=BATCH, seed=SEED), num_workers=0)
    elif kind == "ours-stream":  # the stream itself rather than a function that makes it
        dm = StreamDataModule(ShardStream(cache, view="graphs", batch_size=BATCH, seed=SEED), num_workers=1)
    elif kind == "map":
        dm = MapModule(ShardStream(cache, view="graphs", batch_size=BATCH).manifest.records)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Log(out / f"{kind}-{tag}.jsonl"), datamodule=dm, ckpt_path=ckpt)
    trainer.save_checkpoint(out / f"{kind}-{tag}.ckpt")


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("LIGHTNING_RUN_WATCHDOG_S", "240")), exit=True)
    warnings.filterwarnings("ignore")  # Lightning's advice (workers, logging) is not what is tested
    cache, out, tag, kinds, max_steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4].split(","), int(sys.argv[5])
    ckpt_tag = sys.argv[sys.argv.index("--ckpt-tag") + 1] if "--ckpt-tag" in sys.argv else None
    for kind in kinds:
        fit(cache, out, tag, kind, max_steps, None if ckpt_tag is None else str(out / f"{kind}-{ckpt_tag}.ckpt"))


if __name__ == "__main__":
    main()
