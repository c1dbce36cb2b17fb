"""One Lightning training run over a ShardStream, for tests/test_loader_lightning.py (run as a script).

``python tests/lightning_run.py CACHE OUT TAG [--ckpt PATH] [--die-at STEP] [--devices N]``
trains a tiny model with Lightning's DDP (gloo, CPU) for two epochs through
:class:`loaders.lightning.StreamDataModule`, and writes every batch each rank
trained on (epoch, step, record ids) to ``OUT/TAG-rank<r>.jsonl``. It saves a
checkpoint after every step (``OUT/TAG-steps/``) and at every epoch's end
(``OUT/TAG-epochs/``). ``--die-at S`` kills every rank (``os._exit``) right
after step ``S``, before that step's checkpoint: a crash mid-epoch (exit code 3, after one
line on stderr per rank: ``[lightning_run] died on purpose: rank R at step S``).

A run never hangs: every rank dumps its threads' stacks to stderr and exits
after ``LIGHTNING_RUN_WATCHDOG_S`` seconds (default 240), collectives time out
after 90 s, and a rank that fails stops the ranks Lightning launched from it
(Lightning itself leaves them waiting on the dead rank for its 30-minute
process-group timeout).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

from loaders import ShardStream  # noqa: E402
from loaders.lightning import StreamDataModule  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, log: Path):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.log_path = log

    def _write(self, suffix: str, batch: dict) -> None:
        ids = batch["record_id"][~batch["is_pad"]].tolist()
        with open(self.log_path.with_name(f"{self.log_path.name}{suffix}-rank{self.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "step": self.global_step, "ids": ids}) + "\n")

    def training_step(self, batch, batch_idx):
        self._write("", batch)
        return (self.w * batch["record_id"].float().mean()).sum() ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


DIED, DIED_CODE = "[lightning_run] died on purpose:", 3
"""What ``--die-at`` prints on every rank's stderr, and its exit code."""


class Die(pl.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            # said on stderr (the test checks every rank died here, not of something else), then no cleanup at all
            print(f"{DIED} rank {trainer.global_rank} at step {self.step}", file=sys.stderr, flush=True)
            os._exit(DIED_CODE)


def quiet_cpu_trainer(devices: int, **kwargs: object) -> pl.Trainer:
    """A CPU Trainer on ``devices`` gloo ranks (DDP, 90 s timeout, when more than one), with no logger,
    progress bar, model summary or sanity validation; ``kwargs`` add the run's own settings."""
    return pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=DDPStrategy(timeout=datetime.timedelta(seconds=90)) if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,  # type: ignore[arg-type]
    )


def fit_killing_ranks(trainer: pl.Trainer, model: pl.LightningModule, dm: pl.LightningDataModule, ckpt: str | None) -> None:
    """``trainer.fit``; a rank that raises kills the ranks it launched (Lightning leaves them waiting
    out the process-group timeout, holding the test's pipes open)."""
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    except BaseException:
        for proc in getattr(trainer.strategy.launcher, "procs", []):  # the ranks this one launched
            proc.send_signal(signal.SIGKILL)
        raise


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("LIGHTNING_RUN_WATCHDOG_S", "240")), exit=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("cache"), ap.add_argument("out"), ap.add_argument("tag")
    ap.add_argument("--ckpt"), ap.add_argument("--die-at", type=int), ap.add_argument("--devices", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    dm = StreamDataModule(lambda: ShardStream(a.cache, view="graphs", batch_size=16, seed=3), num_workers=1, prefetch_factor=2)
    callbacks = [Die(a.die_at)] if a.die_at is not None else []
    callbacks += [
        ModelCheckpoint(dirpath=out / f"{a.tag}-steps", filename="{step}", every_n_train_steps=1, save_top_k=-1),
        ModelCheckpoint(dirpath=out / f"{a.tag}-epochs", filename="{epoch}-end", every_n_epochs=1, save_on_train_epoch_end=True, save_top_k=-1),
    ]
    trainer = quiet_cpu_trainer(a.devices, max_epochs=2, callbacks=callbacks)
    fit_killing_ranks(trainer, Tiny(out / a.tag), dm, a.ckpt)


if __name__ == "__main__":
    main()
