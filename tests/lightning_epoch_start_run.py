"""A Lightning DDP run over a Mixture schedule whose epochs differ in length, for
tests/test_lightning_epoch_start_ddp.py (run as a script).

``python tests/lightning_epoch_start_run.py SMALL MID OUT TAG [--own] [--limit N] [--devices N] [--reload]``
trains a do-nothing model for 3 epochs on the ``graphs`` view (batch 16) of a schedule
(epoch 0: SMALL alone; then SMALL and MID 1:3), through :class:`loaders.lightning.StreamDataModule`
or (``--own``) a datamodule of the user's own whose ``train_dataloader()`` returns ``make_loader(...)``.
Every rank writes the batches it trained on to ``OUT/TAG-rank<r>.jsonl`` and, per epoch, what a
callback read as ``trainer.num_training_batches`` in ``on_train_epoch_start`` to ``OUT/TAG-starts-rank<r>.json``.

Bounded like tests/lightning_run.py (watchdog, 90 s collectives).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl  # noqa: E402

from loaders import Mixture, ShardStream, Stage, make_loader  # noqa: E402
from loaders.lightning import StreamDataModule  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_run import Tiny, fit_killing_ranks, quiet_cpu_trainer  # noqa: E402


def schedule_stream(small: str, mid: str) -> ShardStream:
    roots = {"small": small, "mid": mid}
    mix = Mixture(roots, schedule=[Stage((0, 1), {"small": 1}), Stage((1, None), {"small": 1, "mid": 3})])
    return ShardStream(mix, view="graphs", batch_size=16, seed=3)


class Own(pl.LightningDataModule):
    """A user's own datamodule: one ``make_loader`` of the stream, made in each rank."""

    def __init__(self, small: str, mid: str) -> None:
        super().__init__()
        self.small, self.mid, self.loader = small, mid, None

    def train_dataloader(self):
        if self.loader is None:
            self.loader = make_loader(schedule_stream(self.small, self.mid), num_workers=1, prefetch_factor=2)
        return self.loader


class Starts(pl.Callback):
    def __init__(self, path: Path) -> None:
        self.path, self.seen = path, {}

    def on_train_epoch_start(self, trainer, module) -> None:
        self.seen[trainer.current_epoch] = trainer.num_training_batches
        self.path.with_name(f"{self.path.name}-starts-rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("LIGHTNING_RUN_WATCHDOG_S", "240")), exit=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("small"), ap.add_argument("mid"), ap.add_argument("out"), ap.add_argument("tag")
    ap.add_argument("--own", action="store_true"), ap.add_argument("--reload", action="store_true")
    ap.add_argument("--limit", type=int, default=None), ap.add_argument("--devices", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out) / a.tag
    if a.own:
        dm: pl.LightningDataModule = Own(a.small, a.mid)
    else:
        dm = StreamDataModule(lambda: schedule_stream(a.small, a.mid), num_workers=1, prefetch_factor=2)
    extra = {"limit_train_batches": a.limit} if a.limit is not None else {}
    trainer = quiet_cpu_trainer(a.devices, max_epochs=3, enable_checkpointing=False, callbacks=[Starts(out)], reload_dataloaders_every_n_epochs=int(a.reload), **extra)
    fit_killing_ranks(trainer, Tiny(out), dm, None)


if __name__ == "__main__":
    main()
