"""A terminal's Ctrl-C mid-epoch reaches the DataLoader workers too (SIGINT to the whole process group).

Before: the workers died with it, and a loader with ``persistent_workers=True`` failed every later pass
("DataLoader worker (pid(s) ...) exited unexpectedly"), so a notebook user had to make a new loader.
Now workers ignore SIGINT (:mod:`loaders.worker_signals`): the trainer gets the ``KeyboardInterrupt``,
the next pass reads the next epoch whole, and a trainer that ends after it leaves no worker behind.
Each script runs in its own session, so the signal reaches only its own process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    from loaders import ShardStream, make_loader
    root, persistent, again = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    loader = make_loader(ShardStream(root, view="records", batch_size=16, seed=0), num_workers=2, persistent_workers=persistent)
    print("workers", flush=True)
    try:
        for i, b in enumerate(loader):
            if i == 3:
                os.killpg(os.getpgid(0), signal.SIGINT)  # (what a terminal's Ctrl-C does)
                time.sleep(1.0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        if not again:
            raise
    seen = np.concatenate([b["record_id"][~b["is_pad"]].numpy() for b in loader])
    print("next pass", len(seen), len(np.unique(seen)), flush=True)
    """
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ctrlc") / "c"
    build(FunctionSource.per_record(lambda rng, i: {"x": rng.normal(size=int(rng.integers(1, 9))).astype(np.float32)}, {"x": "float32"}), root, records=400, workers=1, shard_mb=0.01, progress=False)
    return root


def _run(cache: Path, persistent: bool, again: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(cache), str(int(persistent)), str(int(again))], env=env, cwd=REPO, capture_output=True, text=True, timeout=120, start_new_session=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("persistent", [True, False])
def test_after_a_ctrl_c_the_next_pass_reads_the_next_epoch_whole(cache: Path, persistent: bool) -> None:
    r = _run(cache, persistent, again=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "interrupted" in r.stdout and "next pass 400 400" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "exited unexpectedly" not in r.stderr


@pytest.mark.timeout(240)
def test_a_trainer_that_ends_on_ctrl_c_leaves_no_worker(cache: Path) -> None:
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.process_iter()}
    r = _run(cache, persistent=True, again=False)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, r.stderr[-2000:]
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before and _SCRIPT[:40].strip()[:20] in " ".join(p.info["cmdline"] or [])]
    assert not left, left
