"""Real Lightning DDP (2 gloo ranks, CPU, 1 DataLoader worker each) over epochs of other lengths: every
rank's ``on_train_epoch_start`` reads the epoch's own count, and each epoch's records, over both ranks,
are the planned ones exactly once (docs/DECISIONS.md, "Lightning: the epoch's batch count before
on_train_epoch_start"). Our datamodule and a user's own ``make_loader`` datamodule, with
``limit_train_batches`` and with ``reload_dataloaders_every_n_epochs``."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from bounded_run import tails
from fork_runner import ForkServer
from mixture_fixtures import levels  # noqa: F401
from ports import free_port

pytest.importorskip("lightning")

pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).with_name("lightning_epoch_start_run.py")
RUN_TIMEOUT_S = 270  # the ranks' own watchdog fires at 240 s
RANKS = 2


def _run(forks: ForkServer, levels: dict[str, str], out: Path, tag: str, *extra: str) -> None:  # noqa: F811
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    done = forks.run([sys.executable, str(SCRIPT), levels["small"], levels["mid"], str(out), tag, "--devices", str(RANKS), *extra], env, RUN_TIMEOUT_S)
    assert done.returncode == 0, tails(done)


def _planned(levels: dict[str, str]) -> tuple[dict[int, list[int]], list[int]]:  # noqa: F811
    """Each epoch's records (single process, the same global plan) and its batches per rank."""
    sys.path.insert(0, str(SCRIPT.parent))
    from lightning_epoch_start_run import schedule_stream

    stream, records, steps = schedule_stream(levels["small"], levels["mid"]), {}, []
    for epoch in range(3):
        stream.set_epoch(epoch)
        records[epoch] = sorted(i for b in stream for i in b["record_id"][~b["is_pad"]].tolist())
        steps.append(stream.plan().steps(RANKS))
    return records, steps


@pytest.mark.parametrize(
    "own, extra",
    [(True, ()), (True, ("--limit", "4")), (False, ("--reload",))],
    ids=["own", "own-limit4", "StreamDataModule-reload"],  # (each ~35 s on 2 shared cores; StreamDataModule and own-reload pass too)
)
def test_ddp_epoch_start_counts_and_every_record_once(levels: dict[str, str], tmp_path: Path, lightning_forks: ForkServer, own: bool, extra: tuple[str, ...]) -> None:  # noqa: F811
    records, steps = _planned(levels)
    assert steps[0] != steps[1]
    limit = int(extra[1]) if extra[:1] == ("--limit",) else None
    _run(lightning_forks, levels, tmp_path, "run", *(["--own"] if own else []), *extra)
    want = {str(e): min(n, limit) if limit else n for e, n in enumerate(steps)}
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for rank in range(RANKS):
        assert json.loads((tmp_path / f"run-starts-rank{rank}.json").read_text()) == want, f"rank {rank}"
        batches = [json.loads(line) for line in (tmp_path / f"run-rank{rank}.jsonl").read_text().splitlines()]
        assert Counter(b["epoch"] for b in batches) == {int(e): n for e, n in want.items()}, f"rank {rank}"
        for b in batches:
            seen[b["epoch"]].extend(b["ids"])
    for epoch in range(3):
        if limit is None:
            assert sorted(seen[epoch]) == records[epoch], f"epoch {epoch}: {len(seen[epoch])} of {len(records[epoch])} records"
        else:  # cut: no record more often than the epoch holds it (a mixture's larger share repeats records)
            assert not Counter(seen[epoch]) - Counter(records[epoch]), f"epoch {epoch}"
