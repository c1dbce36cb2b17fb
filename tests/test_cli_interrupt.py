"""Ctrl-C says "rerun the same command to resume" only where a rerun resumes.

The review of 2026-11-24 (thirteenth session) pressed Ctrl-C in ``cachebuild verify`` and
``cachebuild bench``: both printed ``interrupted: rerun the same command to resume``, though
neither resumes anything (a rerun starts over). They now print ``interrupted`` (exit 130);
the builders and ``stage`` keep the hint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import build_toy

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.dist


def _interrupt_once_reading(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    """Run a real ``cachebuild`` process, SIGINT it once it has a shard of ``cache`` mapped (inside the command)."""
    proc = subprocess.Popen([sys.executable, "-m", "cachebuild", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            maps = ""
        if f"{cache}/shard-" in maps:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the command ended before it was interrupted"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_bench_interrupted_says_interrupted_only(tmp_path):
    cache = tmp_path / "cache"
    build_toy(cache, records=600)
    done = _interrupt_once_reading(["bench", str(cache), "--seconds", "120", "--workers", "0"], cache)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted", done.stderr
    assert "Traceback" not in done.stderr
