"""Acceptance audit of issues 11 and 16 (seventeenth session): defects found trying them as a user.

Each test failed before its fix (see docs/DECISIONS.md, "Acceptance audit of issues 11 and 16").
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from cachebuild import build
from grow_fixtures import toy_source
from loaders import Mixture, ShardStream, Stage
from mixture_fixtures import levels  # noqa: F401

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from loaders.lightning import StreamDataModule  # noqa: E402


class _Recorder(pl.LightningModule):
    """Records the (non-pad) record ids each epoch trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: dict[str, Any], index: int) -> Any:
        self.seen.setdefault(self.current_epoch, []).extend(batch["record_id"][~batch["is_pad"]].tolist())
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(dm: StreamDataModule, epochs: int, callbacks: list[Any] = (), **trainer_kw: Any) -> dict[int, list[int]]:
    model = _Recorder()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **trainer_kw,
    )
    with warnings.catch_warnings():  # Lightning's own advice (few workers, IterableDataset with __len__)
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return model.seen


def _planned(make: Any, epochs: int) -> dict[int, list[int]]:
    stream, out = make(), {}
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        out[epoch] = sorted(i for b in stream for i in b["record_id"][~b["is_pad"]].tolist())
    return out


@pytest.mark.parametrize("limit", [1.0, 12])
def test_lightning_trains_every_batch_of_a_schedule_stage_that_grows_the_epoch(levels: dict[str, str], limit: float) -> None:  # noqa: F811
    """Lightning read ``len(loader)`` once and cut every later epoch there: with a schedule whose
    second stage doubles the epoch, epochs 1.. trained on 10 of their 19 batches (the rest lost)."""
    roots = {"small": levels["small"], "mid": levels["mid"]}

    def make() -> ShardStream:
        mix = Mixture(roots, schedule=[Stage((0, 1), {"small": 1}), Stage((1, None), {"small": 1, "mid": 3})])
        return ShardStream(mix, view="graphs", batch_size=16, seed=0)

    seen = _fit(StreamDataModule(make), epochs=3, limit_train_batches=limit)
    planned = _planned(make, 3)
    for epoch in range(3):
        if limit == 1.0:
            assert sorted(seen[epoch]) == planned[epoch], f"epoch {epoch}: trained {len(seen[epoch])} of {len(planned[epoch])} records"
        else:  # an int limit still caps every epoch
            assert len(seen[epoch]) == min(12 * 16, len(planned[epoch]))


def test_lightning_trains_a_grown_generation_whole(tmp_path: Path) -> None:
    """An append between epochs: epoch 1 reads the new generation, all of it (was cut at epoch 0's length)."""
    root = tmp_path / "grow"
    build(toy_source(), root, records=120, seed=5, shard_mb=0.02, progress=False, workers=1)

    class Append(pl.Callback):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            if trainer.current_epoch == 0:
                build(toy_source(), root, records=200, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)

    seen = _fit(StreamDataModule(lambda: ShardStream(str(root), view="records", batch_size=16, seed=0)), epochs=2, callbacks=[Append()])
    assert sorted(seen[0]) == list(range(120))
    assert sorted(seen[1]) == list(range(320)), f"epoch 1 trained {len(seen[1])} of 320 records"


def test_a_stream_with_the_epoch_length_hook_still_pickles(levels: dict[str, str]) -> None:  # noqa: F811
    """The hook is process-local: a pickled stream (spawned workers, ranks) leaves it behind."""
    import pickle

    dm = StreamDataModule(lambda: ShardStream(levels["small"], view="graphs", batch_size=16, seed=0))
    stream = dm.train_dataloader().stream
    copy = pickle.loads(pickle.dumps(stream))
    assert "begin_pass" in vars(stream) and "begin_pass" not in vars(copy)
    assert len(copy) == len(stream)
