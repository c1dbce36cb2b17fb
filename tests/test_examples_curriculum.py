"""The curriculum example: builds its levels from the users' recipe (n 20 -> 50) and trains through a schedule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "curriculum"


def test_curriculum_example_builds_levels_and_trains_through_the_schedule(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [
        sys.executable,
        str(EXAMPLE / "train.py"),
        "--levels-dir",
        str(tmp_path / "levels"),
        "--levels",
        "3",
        "--build",
        "24",
        "--samples",
        "16",
        "--epochs-per-level",
        "2",
        "--batch-size",
        "1024",
        "--hidden",
        "32",
        "--workers",
        "1",
        "--device",
        "cpu",
        "--json",
    ]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== curriculum" in r.stdout and "wait_fraction" in r.stdout  # the stall monitor's summary
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["n_max"] == 50 and d["final_loss"] == d["final_loss"]
    graphs = [e["graphs"] for e in d["epochs"]]
    assert graphs[0] == graphs[1] == {"level0": 24, "level1": 0, "level2": 0}
    assert graphs[2] == graphs[3] == {"level0": 12, "level1": 36, "level2": 0}  # level 1, weight 3, replaying level 0, weight 1
    assert graphs[4] == graphs[5] == {"level0": 0, "level1": 12, "level2": 36}
    assert d["steps"] == sum(e["steps"] for e in d["epochs"]) - 1  # the monitor saw every step (1 warm-up)

    sys.path.insert(0, str(EXAMPLE))
    from levels import level_params

    from cachebuild.format import read_manifest

    # their training CausalDataset draws the scale from (1.0, 50.0) at every level (main.py)
    # and its edge probability is CausalDataset's default 0.3 at every level (it overrides the level's density)
    for level, (n, p_max, scale_hi) in enumerate([(20, 0.3, 50.0), (35, 0.3, 50.0), (50, 0.3, 50.0)]):
        m = read_manifest(tmp_path / "levels" / f"level{level}")
        assert m.schema("adj").max_shape[0] <= n and m.records == 24
        assert m.config["graph"]["n_max"] == n and m.config["graph"]["n_min"] == n - 1
        assert m.config["graph"]["edge_prob"] == p_max and m.config["interventions"]["value_scale"] == [1.0, scale_hi]
        assert level_params(level, 3)["graph.n_max"] == n
