"""A Lightning run with ``limit_train_batches`` (and optionally ``val_check_interval``), for
tests/test_lightning_review.py (run as a script).

``python tests/lightning_limit_run.py CACHE OUT TAG [--ckpt PATH] [--devices N] [--limit N] [--epochs N] [--val-every N]``
trains a do-nothing model through :class:`loaders.lightning.StreamDataModule` on
the ``graphs`` view (batch 16) for ``--epochs`` epochs cut to ``--limit``
batches each, writes every batch each rank trained on to
``OUT/TAG-rank<r>.jsonl`` and every validation batch to ``OUT/TAG-val-rank<r>.jsonl``,
and saves a checkpoint after every step (``OUT/TAG-steps/step=S.ckpt``).

Bounded like tests/lightning_run.py: a watchdog dumps the stacks and exits after
``LIGHTNING_RUN_WATCHDOG_S`` seconds (default 240), collectives time out after 90 s.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from loaders import ShardStream, make_loader  # noqa: E402
from loaders.lightning import StreamDataModule  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_run import Tiny as TrainTiny, fit_killing_ranks, quiet_cpu_trainer  # noqa: E402


class Tiny(TrainTiny):
    def validation_step(self, batch, batch_idx):
        self._write("-val", batch)


class WithValidation(StreamDataModule):
    """The README's advice: a validation ``make_loader`` of its own, every pass the same batches."""

    def __init__(self, cache: str, **kwargs):
        super().__init__(lambda: ShardStream(cache, view="graphs", batch_size=16, seed=3), **kwargs)
        self.cache = cache

    def val_dataloader(self):
        return make_loader(ShardStream(self.cache, view="graphs", batch_size=16, shuffle=False), num_workers=0)


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("LIGHTNING_RUN_WATCHDOG_S", "240")), exit=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("cache"), ap.add_argument("out"), ap.add_argument("tag")
    ap.add_argument("--ckpt"), ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--limit", type=int, default=5), ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--val-every", type=int, default=None)
    a = ap.parse_args()
    out = Path(a.out)
    dm = WithValidation(a.cache, num_workers=1, prefetch_factor=2)
    trainer = quiet_cpu_trainer(
        a.devices,
        max_epochs=a.epochs,
        limit_train_batches=a.limit,
        limit_val_batches=2 if a.val_every else 0,
        val_check_interval=a.val_every,
        callbacks=[ModelCheckpoint(dirpath=out / f"{a.tag}-steps", filename="{step}", every_n_train_steps=1, save_top_k=-1)],
    )
    fit_killing_ranks(trainer, Tiny(out / a.tag), dm, a.ckpt)


if __name__ == "__main__":
    main()
