"""Lightning with StreamDataModule, tried as a user would (review): ``limit_train_batches``, step
checkpoints, ``val_check_interval``; real 2-rank gloo DDP on CPU and one process.

Found: a step checkpoint on the last batch of an epoch cut short by ``limit_train_batches`` resumed
with the *rest of that cut epoch* (Lightning moves on to the next epoch, and reloads the loader's
saved position itself after the datamodule had), so the resumed run trained on batches the
uninterrupted run never saw, one epoch behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loader_fixtures import causal_cache  # noqa: F401
from bounded_run import tails
from fork_runner import ForkServer
from ports import free_port

pytest.importorskip("lightning")

pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).with_name("lightning_limit_run.py")
RUN_TIMEOUT_S = 270  # the ranks' own watchdog fires at 240 s


def _run(forks: ForkServer, cache: Path, out: Path, tag: str, *extra: str) -> subprocess.CompletedProcess:
    """One run in a fresh process (forked, Lightning imported) and its own process group, killed whole (ranks
    and DataLoader workers) when it ends or hangs."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return forks.run([sys.executable, str(SCRIPT), str(cache), str(out), tag, *extra], env, RUN_TIMEOUT_S)


def _batches(out: Path, tag: str, rank: int) -> list[tuple[int, list[int]]]:
    return [(b["epoch"], b["ids"]) for b in map(json.loads, (out / f"{tag}-rank{rank}.jsonl").read_text().splitlines())]


@pytest.mark.parametrize("devices", [1, 2])
def test_step_checkpoint_on_a_cut_epochs_last_batch_resumes_with_the_next_epoch(causal_cache, tmp_path, devices, lightning_forks):
    ref = _run(lightning_forks, causal_cache, tmp_path, "ref", "--devices", str(devices))
    assert ref.returncode == 0, tails(ref)
    want = {r: _batches(tmp_path, "ref", r) for r in range(devices)}
    assert all([e for e, _ in want[r]] == [0] * 5 + [1] * 5 + [2] * 5 for r in range(devices))
    for step in (5, 4):  # on the cut epoch's last batch (the bug), and one before it
        tag = f"from{step}"
        resumed = _run(lightning_forks, causal_cache, tmp_path, tag, "--devices", str(devices), "--ckpt", str(tmp_path / "ref-steps" / f"step={step}.ckpt"))
        assert resumed.returncode == 0, tails(resumed)
        for r in range(devices):
            assert _batches(tmp_path, tag, r) == want[r][step:], f"resumed from step {step}, rank {r}"


def test_val_check_interval_resume_from_a_step_checkpoint_is_exact(causal_cache, tmp_path, lightning_forks):
    """Validation inside the epoch (every 4 batches) neither moves the training position nor varies itself."""
    args = ["--devices", "1", "--limit", "10", "--epochs", "2", "--val-every", "4"]
    ref = _run(lightning_forks, causal_cache, tmp_path, "ref", *args)
    assert ref.returncode == 0, tails(ref)
    want = _batches(tmp_path, "ref", 0)
    val = _batches(tmp_path, "ref-val", 0)
    assert len(val) == 2 * 2 * 2 and len({json.dumps(ids) for _, ids in val[::2]}) == 1  # 2 checks x 2 epochs x 2 batches, same batches
    resumed = _run(lightning_forks, causal_cache, tmp_path, "mid", *args, "--ckpt", str(tmp_path / "ref-steps" / "step=6.ckpt"))
    assert resumed.returncode == 0, tails(resumed)
    assert _batches(tmp_path, "mid", 0) == want[6:]
