"""The example trainers run a few steps on CPU, with our loader and with --baseline (the users' pipeline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _run(script: str, *args: str, timeout: float = 120) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(EXAMPLES / script), "--device", "cpu", "--json", *args],
                       capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== " in r.stdout and "wait_fraction" in r.stdout  # the stall monitor's summary
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def causal_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_causal_build

    out = tmp_path_factory.mktemp("ex") / "causal"
    run_causal_build(None, [], {"graphs": 120, "build.shard_mb": 1}, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def mel_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_mel_build

    out = tmp_path_factory.mktemp("ex") / "mel"
    run_mel_build(None, [], {"build.shard_mb": 1}, out, synthetic=40, workers=1, progress=False)
    return out


def test_train_causal_ours(causal_cache):
    d = _run("train_causal.py", "--cache", str(causal_cache), "--steps", "4", "--batch-size", "256", "--hidden", "32", "--workers", "0")
    assert d["steps"] == 3 and d["final_loss"] == d["final_loss"]  # 4 steps, 1 warm-up; loss not NaN


def test_train_causal_baseline():
    d = _run("train_causal.py", "--baseline", "--steps", "3", "--batch-size", "256", "--hidden", "32", "--workers", "0")
    assert d["steps"] == 2


def test_train_mel_ours_with_file_eval(mel_cache):
    d = _run("train_mel.py", "--cache", str(mel_cache), "--epochs", "2", "--steps", "3", "--batch-size", "256", "--eval-files", "16", "--workers", "0", "--width", "8")
    assert d["epoch"] == 1 and d["steps"] == 2
    assert d["files"] == 40 and 0.0 <= d["file_accuracy"] <= 1.0


def test_train_mel_baseline_from_cache(mel_cache):
    d = _run("train_mel.py", "--cache", str(mel_cache), "--baseline", "--steps", "3", "--batch-size", "256", "--workers", "0", "--width", "8")
    assert d["steps"] == 2 and d["files"] == 40 and 0.0 <= d["file_accuracy"] <= 1.0


def test_train_mel_baseline_synthetic_h5(tmp_path):
    d = _run("train_mel.py", "--cache", str(tmp_path / "none"), "--baseline", "--synthetic-files", "20", "--steps", "2",
             "--batch-size", "128", "--workers", "0", "--width", "8", "--no-eval")
    assert d["steps"] == 1 and "file_accuracy" not in d
