"""loky's resource tracker, started by a CLI build, runs with its own warnings about leaked semaphores
ignored: when a failing build aborted its workers on a loaded machine, the tracker printed "There appear
to be 1 leaked semlock objects ..." under the build's one-line error (seen once in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import os, sys
import psutil
from cachebuild.cli import main
try:
    main(["generate", "--graphs", "40", "-o", sys.argv[1], "-q", "-j", "2", "--shard-mb", "0.05"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
for child in psutil.Process(os.getpid()).children(recursive=True):
    cmd = child.cmdline()
    if any("resource_tracker import main" in part for part in cmd):
        print(" ".join(cmd))
"""


def test_the_cli_starts_lokys_resource_tracker_with_its_semaphore_warnings_off(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "c")], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    trackers = [line for line in res.stdout.splitlines() if "resource_tracker import main" in line]
    assert trackers and all("-Wignore::UserWarning:joblib.externals.loky.backend.resource_tracker" in t for t in trackers), res.stdout
