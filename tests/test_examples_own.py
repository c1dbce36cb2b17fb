"""The two worked examples of "Your own data": built from their recipes with the CLI, streamed into their trainers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


@pytest.mark.parametrize("name,recipe,records", [("ssm", "ssm.toml", 300), ("sequences", "sequences.toml", 600)])
def test_example_builds_from_its_recipe_and_trains(name: str, recipe: str, records: int, tmp_path: Path) -> None:
    out = tmp_path / name
    build = [sys.executable, "-m", "cachebuild.cli", "build", "--config", recipe, "--records", str(records), "--out", str(out), "-q", "-j", "2"]
    r = subprocess.run(build, cwd=EXAMPLES / name, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{records} records" in r.stdout
    v = subprocess.run([sys.executable, "-m", "cachebuild.cli", "verify", str(out), "-q"], env=_env(), capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stderr
    train = [sys.executable, str(EXAMPLES / name / "train.py"), "--cache", str(out), "--steps", "4", "--batch-size", "64", "--workers", "0", "--device", "cpu", "--json"]
    t = subprocess.run(train, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert t.returncode == 0, t.stdout + t.stderr
    d = json.loads(t.stdout.strip().splitlines()[-1])
    assert d["steps"] == 3 and d["final_loss"] == d["final_loss"]  # 4 steps, 1 warm-up; loss not NaN
    if name == "sequences":
        assert 0.0 < d["padding"] < 1.0
