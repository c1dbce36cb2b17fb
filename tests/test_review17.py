"""Review of the seventeenth session's changes: defects found, each test failed before its fix
(docs/DECISIONS.md, "Review of the seventeenth session's changes")."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Iterator

import pytest

from loaders import Mixture, ShardStream, Stage
from loaders.handover import Handover
from mixture_fixtures import levels  # noqa: F401

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from loaders.lightning import StreamDataModule  # noqa: E402


class _Validated(pl.LightningModule):
    """Records, for each validation run, the epoch and how many training batches that epoch had run."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.trained: dict[int, int] = {}
        self.validated: list[tuple[int, int]] = []

    def training_step(self, batch: dict[str, Any], index: int) -> Any:
        self.trained[self.current_epoch] = self.trained.get(self.current_epoch, 0) + 1
        return self.layer(torch.ones(1, 1)).sum()

    def validation_step(self, batch: Any, index: int) -> None:
        return None

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.validated.append((self.current_epoch, self.trained.get(self.current_epoch, 0)))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _WithValidation(StreamDataModule):
    def val_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(list(range(4)), batch_size=2)


@pytest.mark.parametrize("grow", [True, False])
def test_validation_runs_at_the_end_of_every_epoch_of_a_schedule(levels: dict[str, str], grow: bool) -> None:  # noqa: F811
    """Lightning computes ``val_check_batch`` once, from epoch 0's length: with epochs of other lengths
    (a schedule stage), validation ran mid-epoch (a longer epoch) or never (a shorter one)."""
    roots = {"small": levels["small"], "mid": levels["mid"]}
    first, later = ({"small": 1}, {"small": 1, "mid": 3}) if grow else ({"small": 1, "mid": 3}, {"small": 1})

    def make() -> ShardStream:
        return ShardStream(Mixture(roots, schedule=[Stage((0, 1), first), Stage((1, None), later)]), view="graphs", batch_size=16, seed=0)

    lengths = []
    for epoch in range(3):
        s = make()
        s.set_epoch(epoch)
        lengths.append(len(s))
    assert lengths[0] != lengths[1] and lengths[1] % lengths[0] and lengths[0] % lengths[1]
    model = _Validated()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=_WithValidation(make))
    assert model.trained == dict(enumerate(lengths))
    assert model.validated == [(e, lengths[e]) for e in range(3)], f"epoch lengths {lengths}"


def _numbers() -> Iterator[int]:
    yield from range(1_000_000)


@pytest.mark.parametrize("shared", [False, True])
def test_a_ctrl_c_while_the_handover_thread_starts_leaves_no_thread(monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """A KeyboardInterrupt in ``Thread.start()`` (which waits for the new thread to run: 2 of 30 Ctrl-Cs
    of a compact="pool" pass landed there) left a started thread no one could close: it held the
    pass's source and woke 10 times a second for the life of the process."""
    start = threading.Thread.start

    def interrupted(self: threading.Thread) -> None:
        start(self)
        if self.name == "cachebuild-handover":
            raise KeyboardInterrupt

    earlier = set(threading.enumerate())  # (a thread another test left is that test's to report)
    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Handover(_numbers(), lambda x: x, 2, shared=shared)
    monkeypatch.undo()
    left = [t for t in threading.enumerate() if t.name == "cachebuild-handover" and t not in earlier]
    for t in left:
        t.join(timeout=2)
    assert not any(t.is_alive() for t in left), "the hand-over thread outlived an interrupted start"
