"""The pause before DataLoader workers fork inside a DDP rank (loaders/fork_settle.py): exactly where the
CPython <= 3.11 fork hang can strike (a real gloo process group, in a subprocess of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ports import free_port

REPO = Path(__file__).resolve().parents[1]

_RANK = r"""
import json, os, sys, time
import multiprocessing as mp
import torch.distributed as dist
from loaders.fork_settle import fork_race_exposed, settle_before_fork, SETTLE_S
from loaders import ShardStream, make_loader

out = {"before_init": fork_race_exposed("fork")}
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
out["fork"] = fork_race_exposed("fork")
out["ctx_fork"] = fork_race_exposed(mp.get_context("fork"))
out["spawn"] = fork_race_exposed("spawn")
out["forkserver"] = fork_race_exposed("forkserver")
out["fork_on_312"] = fork_race_exposed("fork", (3, 12, 0))
out["python"] = list(sys.version_info[:3])
root = sys.argv[2]
loader = make_loader(ShardStream(root, view="graphs", batch_size=8, seed=0), num_workers=1, multiprocessing_context="fork", persistent_workers=True)
waits = []
orig = time.sleep
def spy(s):
    waits.append(s)
    orig(s)
time.sleep = spy
first = [b["record_id"].tolist() for b in loader]
second = [b["record_id"].tolist() for b in loader]
time.sleep = orig
out["waits"] = [w for w in waits if w == SETTLE_S]
out["batches"] = [len(first), len(second)]
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_a_forking_pass_in_a_process_group_waits_once_where_the_fork_can_hang(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    build = [sys.executable, "-m", "cachebuild", "generate", "--graphs", "40", "--out", str(tmp_path / "c"), "--workers", "1", "-q"]
    assert subprocess.run(build, env=env, capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([sys.executable, "-c", _RANK, str(free_port()), str(tmp_path / "c")], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    affected = tuple(got["python"]) < (3, 12)
    assert got["before_init"] is False  # no process group: no gloo threads
    assert got["fork"] is affected and got["ctx_fork"] is affected
    assert got["spawn"] is False and got["forkserver"] is False and got["fork_on_312"] is False
    # persistent workers: the first pass forks (one wait where affected), the second reuses them
    assert len(got["waits"]) == (1 if affected else 0)
    assert got["batches"] == [5, 5]
