"""Epochs of other lengths under real Lightning (CPU, one process): the count is right by the time
``on_train_epoch_start`` runs, for our datamodule and for a user's own, and
``reload_dataloaders_every_n_epochs`` runs each epoch once (docs/DECISIONS.md, "Lightning: the epoch's
batch count before on_train_epoch_start"). Each test failed before the fix, but two that guard the
new rule's edges (a checkpoint taken at an epoch's start, an empty pass): each fails when its edge's
handling is taken out. The 2-rank DDP run is tests/test_lightning_epoch_start_ddp.py."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest

from loaders import Mixture, ShardStream, Stage, make_loader
from mixture_fixtures import levels  # noqa: F401

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import TQDMProgressBar  # noqa: E402

from loaders.lightning import StreamDataModule  # noqa: E402


class _Recorder(pl.LightningModule):
    """Records each epoch's (non-pad) record ids, and ``num_training_batches`` at its start."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}
        self.at_start: dict[int, int] = {}
        self.batches: dict[int, int] = {}

    def on_train_epoch_start(self) -> None:
        self.at_start[self.current_epoch] = self.trainer.num_training_batches

    def training_step(self, batch: dict[str, Any], index: int) -> Any:
        self.batches[self.current_epoch] = self.batches.get(self.current_epoch, 0) + 1
        self.seen.setdefault(self.current_epoch, []).extend(batch["record_id"][~batch["is_pad"]].tolist())
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _FirstCallback(pl.Callback):
    """A user's callback (first in the list): what it reads at the epoch's start."""

    def __init__(self) -> None:
        self.at_start: dict[int, int] = {}

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self.at_start[trainer.current_epoch] = trainer.num_training_batches


class _Bar(TQDMProgressBar):
    """Lightning's progress bar: the total it shows for each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.totals: dict[int, Any] = {}

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        super().on_train_epoch_start(trainer, module)
        self.totals[trainer.current_epoch] = self.train_progress_bar.total


class _OwnModule(pl.LightningDataModule):
    """A user's own datamodule: ``train_dataloader()`` returns ``make_loader(...)`` (one loader, or a new one each call)."""

    def __init__(self, make: Callable[[], ShardStream], new_each_time: bool = False, follow: bool = False) -> None:
        super().__init__()
        self.make, self.new_each_time, self.follow = make, new_each_time, follow
        self.loader: Any = None

    def train_dataloader(self) -> Any:
        if self.loader is None or self.new_each_time:
            self.loader = make_loader(self.make(), num_workers=0)
            if self.follow:
                self.loader.set_epoch(self.trainer.current_epoch)
        return self.loader


def _schedule(levels: dict[str, str], grow: bool = True) -> Callable[[], ShardStream]:  # noqa: F811
    roots = {"small": levels["small"], "mid": levels["mid"]}
    first, later = ({"small": 1}, {"small": 1, "mid": 3}) if grow else ({"small": 1, "mid": 3}, {"small": 1})
    return lambda: ShardStream(Mixture(roots, schedule=[Stage((0, 1), first), Stage((1, None), later)]), view="graphs", batch_size=16, seed=0)


def _planned(make: Callable[[], ShardStream], epochs: int) -> dict[int, list[int]]:
    stream, out = make(), {}
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        out[epoch] = sorted(i for b in stream for i in b["record_id"][~b["is_pad"]].tolist())
    return out


def _lengths(make: Callable[[], ShardStream], epochs: int) -> list[int]:
    out = []
    for epoch in range(epochs):
        s = make()
        s.set_epoch(epoch)
        out.append(len(s))
    return out


def _fit(dm: Any, epochs: int = 3, callbacks: list[Any] = (), progress: bool = False, **kw: Any) -> _Recorder:
    model = _Recorder()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kw,
    )
    with warnings.catch_warnings():  # Lightning's own advice (few workers, IterableDataset with __len__)
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return model


def _limited(length: int, limit: int | float) -> int:
    return min(length, limit) if isinstance(limit, int) else int(length * limit)


@pytest.mark.parametrize("ours", [True, False], ids=["StreamDataModule", "own-datamodule"])
@pytest.mark.parametrize("grow, limit", [(True, 1.0), (False, 1.0), (True, 7), (True, 0.5)])
def test_epoch_start_hooks_see_the_epochs_own_batch_count(levels: dict[str, str], ours: bool, grow: bool, limit: int | float) -> None:  # noqa: F811
    """``on_train_epoch_start`` (a callback first in the list, the module, the progress bar's total) read the
    previous epoch's count (6, 6, 9 for epochs of 6, 9, 9); a user's own datamodule also cut every epoch at epoch
    0's length. Now every hook reads the epoch's own count, after ``limit_train_batches``, and trains it whole."""
    make = _schedule(levels, grow)
    lengths = _lengths(make, 3)
    assert lengths[0] != lengths[1] == lengths[2]
    first, bar = _FirstCallback(), _Bar()
    model = _fit(StreamDataModule(make) if ours else _OwnModule(make), callbacks=[first, bar], progress=True, limit_train_batches=limit)
    want = {e: _limited(n, limit) for e, n in enumerate(lengths)}
    assert first.at_start == want and model.at_start == want and bar.totals == want, f"epoch lengths {lengths}, limit {limit}"
    assert model.batches == want
    if limit == 1.0:
        assert {e: sorted(ids) for e, ids in model.seen.items()} == _planned(make, 3)


@pytest.mark.parametrize("ours", [True, False], ids=["StreamDataModule", "own-datamodule"])
def test_reload_dataloaders_every_epoch_runs_each_epoch_once(levels: dict[str, str], ours: bool) -> None:  # noqa: F811
    """``reload_dataloaders_every_n_epochs=1`` iterates the loader twice at each epoch's start (once when it
    reloads it, once when the epoch runs) and the first iterator is dropped unread: that pass counted, and
    Lightning's epochs 1 and 2 trained the stream's epochs 2 and 4. An unread pass is now run again."""
    make = _schedule(levels)
    model = _fit(StreamDataModule(make) if ours else _OwnModule(make), epochs=3, reload_dataloaders_every_n_epochs=1)
    assert {e: sorted(ids) for e, ids in model.seen.items()} == _planned(make, 3)
    assert model.at_start == dict(enumerate(_lengths(make, 3)))


def test_a_new_stream_every_epoch_is_warned_of_and_set_epoch_follows_the_trainer(levels: dict[str, str]) -> None:  # noqa: F811
    """A ``train_dataloader()`` that makes a new stream at every reload runs epoch 0 every time (its stage
    too): a warning says so; calling ``set_epoch(trainer.current_epoch)`` on the new loader is right."""
    make = _schedule(levels)
    model = _Recorder()
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=_OwnModule(make, new_each_time=True))
    assert [str(w.message) for w in caught if "runs its epoch 0 as the trainer's epoch 1" in str(w.message)]
    model = _fit(_OwnModule(make, new_each_time=True, follow=True), epochs=3, reload_dataloaders_every_n_epochs=1)
    assert {e: sorted(ids) for e, ids in model.seen.items()} == _planned(make, 3)


def test_a_checkpoint_taken_at_an_epochs_start_resumes_that_epoch(levels: dict[str, str], tmp_path: Any) -> None:  # noqa: F811
    """The pass is decided before ``on_train_epoch_start``: a checkpoint saved there holds the new epoch's
    start, and must resume that epoch, not count it as done and skip it. (Lightning itself resumes such a
    checkpoint as if the previous epoch's batch count were done in the new one: it trains the new epoch's
    last batches only, 3 of 9 here; the stream serves that epoch's first ones.)"""
    make = _schedule(levels)

    class SaveAtStart(pl.Callback):
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            if trainer.current_epoch == 1:
                trainer.save_checkpoint(tmp_path / "start1.ckpt")

    _fit(StreamDataModule(make), epochs=2, callbacks=[SaveAtStart()])
    model = _Recorder()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=StreamDataModule(make), ckpt_path=str(tmp_path / "start1.ckpt"))
    planned = _planned(make, 3)
    assert set(model.seen) == {1, 2} and set(model.seen[1]) < set(planned[1]) and sorted(model.seen[2]) == planned[2]


def test_prepare_pass_and_an_unread_pass(levels: dict[str, str]) -> None:  # noqa: F811
    """Without a trainer: ``prepare_pass`` makes ``len(loader)`` the next epoch's, once however often it is
    called; an ``iter()`` dropped unread is run again; one whose batch was taken is not."""
    make = _schedule(levels)
    lengths = _lengths(make, 4)
    loader = make_loader(make(), num_workers=0)
    assert len(list(loader)) == lengths[0] and len(loader) == lengths[0]
    loader.prepare_pass()
    loader.prepare_pass()
    assert len(loader) == lengths[1]
    iter(loader)  # dropped unread
    assert len(list(loader)) == lengths[1] and loader.state_dict()["epoch"] == 1
    it = iter(loader)
    next(it)
    assert len(list(loader)) == lengths[3] and loader.state_dict()["epoch"] == 3


def test_an_empty_pass_is_not_run_again(levels: dict[str, str]) -> None:  # noqa: F811
    """A pass with no batch to hand out (``set_epoch`` naming the epoch of a state saved at its end) is no
    unread pass: the next ``iter()`` moves on to the next epoch, not to the same empty rest again."""
    loader = make_loader(_schedule(levels)(), num_workers=0)
    list(loader)
    loader.load_state_dict(loader.state_dict())
    loader.set_epoch(0)
    assert list(loader) == []
    assert len(list(loader)) == len(loader) > 0 and loader.state_dict()["epoch"] == 1


@pytest.mark.parametrize("ours", [True, False], ids=["StreamDataModule", "own-datamodule"])
def test_a_generation_appended_between_epochs_is_counted_at_the_epochs_start(tmp_path: Any, ours: bool) -> None:
    """``--append`` at epoch 0's end: epoch 1 (320 records, 20 batches) is counted at its start, and trained whole."""
    from cachebuild import build
    from grow_fixtures import toy_source

    root = tmp_path / "grow"
    build(toy_source(), root, records=120, seed=5, shard_mb=0.02, progress=False, workers=1)

    class Append(pl.Callback):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            if trainer.current_epoch == 0:
                build(toy_source(), root, records=200, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)

    def make() -> ShardStream:
        return ShardStream(str(root), view="records", batch_size=16, seed=0)

    first = _FirstCallback()
    model = _fit(StreamDataModule(make) if ours else _OwnModule(make), epochs=2, callbacks=[Append(), first])
    assert first.at_start == model.at_start == {0: 8, 1: 20}
    assert sorted(model.seen[0]) == list(range(120)) and sorted(model.seen[1]) == list(range(320))
