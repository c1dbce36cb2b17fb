"""Real Lightning (CPU, DDP over 2 gloo ranks) with loaders.lightning.StreamDataModule.

One reference run of two epochs; one run killed mid-epoch and resumed from its
last checkpoint; one resume from the reference's epoch-end checkpoint. Every
rank must see epochs that differ and together cover the cache, and a resumed
run must train on exactly the batches the reference trained on from there.
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

from lightning_run import DIED, DIED_CODE  # noqa: E402

SCRIPT = Path(__file__).with_name("lightning_run.py")
RANKS = 2


RUN_TIMEOUT_S = 270
"""A run's wall-clock bound (its ranks' own watchdog fires at 240 s)."""
TRANSIENT = ("Address already in use", "EADDRINUSE", "Timeout (0:0", "clients joined")
"""A run that failed with one of these is tried once more: the rendezvous port (free when it was
picked) was taken before the store bound it, a rank started too late for the 90 s rendezvous
(torch's "Timed out after 91 seconds waiting for clients. 1/2 clients joined", on a loaded
machine), or the run hung and its ranks' watchdog dumped their stacks. The first attempt's
output (its end) is kept in the second's failure message, after the second's."""

pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(3 * 2 * RUN_TIMEOUT_S + 120)]
"""The test's own bound only backs up the runs' (a test that timed out showed no run's output): the
killed-run test, run alone, makes 3 runs (with the reference) of at most 2 attempts each."""


def _attempt(forks: ForkServer, cache: Path, out: Path, tag: str, *extra: str) -> subprocess.CompletedProcess:
    # the rendezvous port, picked outside the ephemeral range (tests/ports.py) rather than by Lightning;
    # rank 0 a fresh process forked with Lightning imported (tests/fork_runner.py), its own process group
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return forks.run([sys.executable, str(SCRIPT), str(cache), str(out), tag, *extra], env, RUN_TIMEOUT_S)


def _run(forks: ForkServer, cache: Path, out: Path, tag: str, *extra: str) -> subprocess.CompletedProcess:
    done = _attempt(forks, cache, out, tag, *extra)
    if done.returncode != 0 and any(t in done.stderr for t in TRANSIENT):
        first = tails(done, 2000)
        for stale in [*out.glob(f"{tag}-rank*.jsonl"), *out.glob(f"{tag}-steps/*"), *out.glob(f"{tag}-epochs/*")]:
            stale.unlink()
        done = _attempt(forks, cache, out, tag, *extra)
        done.stderr = f"{done.stderr}\n[test] first attempt, retried:\n{first}"
    return done


def _batches(out: Path, tag: str, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"{tag}-rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(causal_cache, tmp_path_factory, lightning_forks):
    out = tmp_path_factory.mktemp("lightning")
    done = _run(lightning_forks, causal_cache, out, "ref")
    assert done.returncode == 0, tails(done, 8000)
    return out, {r: _batches(out, "ref", r) for r in range(RANKS)}


def test_epochs_differ_and_cover_the_cache(reference):
    _, ref = reference
    per_epoch = {e: [i for r in range(RANKS) for b in ref[r] if b["epoch"] == e for i in b["ids"]] for e in (0, 1)}
    assert sorted(per_epoch[0]) == sorted(per_epoch[1]) == list(range(200))  # each record once per epoch, over both ranks
    assert per_epoch[0] != per_epoch[1]
    assert len({len([b for b in ref[r] if b["epoch"] == 0]) for r in range(RANKS)}) == 1  # equal steps per rank


def test_killed_mid_epoch_resumes_with_exactly_the_remaining_batches(causal_cache, reference, lightning_forks):
    out, ref = reference
    killed = _run(lightning_forks, causal_cache, out, "killed", "--die-at", "4")
    # every rank died after step 4, before its checkpoint, on purpose (not of a timeout or a crash: any exit code but 0 passed)
    died = [f"{DIED} rank {r} at step 4" for r in range(RANKS)]
    assert killed.returncode == DIED_CODE and all(d in killed.stderr for d in died), tails(killed, 8000)
    last = out / "killed-steps" / "step=3.ckpt"
    saved = sorted(p.name for p in (out / "killed-steps").glob("*"))
    assert last.exists() and not (out / "killed-steps" / "step=4.ckpt").exists(), f"checkpoints: {saved}\n{tails(killed, 8000)}"
    resumed = _run(lightning_forks, causal_cache, out, "resumed", "--ckpt", str(last))
    assert resumed.returncode == 0, tails(resumed, 8000)
    for r in range(RANKS):
        before, after = _batches(out, "killed", r), _batches(out, "resumed", r)
        assert [b["ids"] for b in before] == [b["ids"] for b in ref[r][:4]]
        assert [b["ids"] for b in after] == [b["ids"] for b in ref[r][3:]], f"rank {r}"
        assert [b["epoch"] for b in after] == [b["epoch"] for b in ref[r][3:]]


def test_resume_at_an_epoch_boundary_runs_the_next_epoch(causal_cache, reference, lightning_forks):
    out, ref = reference
    resumed = _run(lightning_forks, causal_cache, out, "boundary", "--ckpt", str(out / "ref-epochs" / "epoch=0-end.ckpt"))
    assert resumed.returncode == 0, tails(resumed, 8000)
    for r in range(RANKS):
        after = _batches(out, "boundary", r)
        expect = [b for b in ref[r] if b["epoch"] == 1]
        assert [b["ids"] for b in after] == [b["ids"] for b in expect] and {b["epoch"] for b in after} == {1}, f"rank {r}"
