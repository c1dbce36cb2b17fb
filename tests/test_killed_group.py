"""A test that SIGKILLs a build's process group leaves nothing in /dev/shm (tests/killed_group.py).

Every CI run left one set of two ``joblib_memmapping_folder_<pid>_...`` folders and 7-8
``sem.loky-<pid>-...`` semaphores in /dev/shm: ``test_cli.py``'s kill -9 of a 2-worker build's
process group killed loky's resource tracker with it, the one process that removes them when a
build dies. The build ends every other way without them (docs/DECISIONS.md, "/dev/shm leftovers").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killed_group import SHM, group_pids, kill_group, leftovers

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not SHM.is_dir() or not sys.platform.startswith("linux"), reason="joblib and loky use /dev/shm on Linux")
@pytest.mark.timeout(120)
def test_a_killed_build_group_leaves_nothing_in_dev_shm(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", "12000", "--shard-mb", "24", "--workers", "2", "-q", "--out", str(tmp_path / "c")]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and len(group_pids(proc.pid)) < 4:  # the build, its resource trackers, a worker: the pool is set up
            assert time.monotonic() < deadline, group_pids(proc.pid)
            time.sleep(0.05)
        assert proc.poll() is None, f"the build ended before it could be killed (rc {proc.returncode})"
        pids = group_pids(proc.pid)
        removed = kill_group(proc)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    # the kill left them (the tracker died with the build) ...
    assert any(n.startswith("sem.loky-") for n in removed) and any(n.startswith("joblib_memmapping_folder_") for n in removed), removed
    assert leftovers(pids) == []  # ... and the test removed them
