"""Ctrl-C says "rerun the same command to resume" only where a rerun resumes; ``bench`` of an empty
cache and ``prune`` of an interrupted build are one line each.

The review of 2026-11-24 (thirteenth session) pressed Ctrl-C in ``cachebuild verify`` and
``cachebuild bench``: both printed ``interrupted: rerun the same command to resume``, though
neither resumes anything (a rerun starts over). They now print ``interrupted`` (exit 130);
the builders and ``stage`` keep the hint.
"""

from __future__ import annotations

import json
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


def test_bench_of_a_cache_with_no_records_is_one_line(tmp_path):
    """A manifest listing no shards (``verify`` passes it) made ``cachebuild bench`` end in
    ``IndexError: list index out of range`` with a traceback."""
    cache = tmp_path / "cache"
    build_toy(cache, records=600)
    doc = json.loads((cache / "manifest.json").read_text())
    doc["shards"], doc["records"] = [], 0
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, "-m", "cachebuild", "bench", str(empty), "--batches", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: {empty} holds no records (its manifest lists 0 shards): nothing to bench"


def test_prune_of_an_interrupted_first_build_says_so(tmp_path):
    """``cachebuild prune`` of a folder whose first build was interrupted said "is not a cachebuild
    cache (no manifest.json)"; ``--append`` already said "holds an unfinished build"."""
    out = tmp_path / "cache"
    build = subprocess.Popen(
        [sys.executable, "-m", "cachebuild", "generate", "--graphs", "20000", "--out", str(out), "-j", "1", "--shard-mb", "4", "-q"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and build.poll() is None and not list(out.glob("shard-*.done.json")):
        time.sleep(0.02)
    assert build.poll() is None, "the build ended before it was interrupted"
    os.kill(build.pid, signal.SIGINT)
    _, err = build.communicate(timeout=120)
    assert build.returncode == 130, err
    assert not (out / "manifest.json").exists()
    done = subprocess.run([sys.executable, "-m", "cachebuild", "prune", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: prune: {out} holds an unfinished build (finish it first: rerun it)"
