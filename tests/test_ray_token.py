"""A Ray cluster with token authentication, given by ``--address HOST:PORT``: the error says what to set.

Found by the acceptance audit of issue 6: ``ray start --head`` turns Ray's token authentication on
when ``~/.ray/auth_token`` exists (any local ``ray.init()`` writes one: a build with ``--backend ray``
and no address did), and ``ray.init`` sends the token by itself only for ``--address auto``. The
documented ``--address HOST:PORT`` then failed with "cannot connect to the Ray cluster at H:P:
Failed to connect to Ray cluster at H:P", the reason only in Ray's own log lines above it. Real Ray
head in another process (token authentication on), real CLI; each side has its own ``HOME``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from ray_head import ray_head as start_ray_head

REPO = Path(__file__).resolve().parent.parent
TOKEN = "a3f1c2d4e5b60718293a4b5c6d7e8f90"


@pytest.fixture
def token_head(tmp_path: Path) -> Iterator[str]:
    """A real Ray head with token authentication (``RAY_AUTH_TOKEN``), its GCS address; killed after."""
    pytest.importorskip("ray")
    home = tmp_path / "head-home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    with start_ray_head(tmp_path / "head.err", env, num_cpus=1) as address:
        yield address


def _generate(tmp_path: Path, out: str, address: str, **env_set: str) -> subprocess.CompletedProcess:
    home = tmp_path / "client-home"  # no ~/.ray/auth_token here
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), **env_set}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        if key not in env_set:
            env.pop(key, None)
    args = [sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", "40", "-o", str(tmp_path / out), "-q", "-j", "1", "--backend", "ray", "--address", address]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(400)
def test_a_token_cluster_by_address_says_what_to_set_and_then_builds(tmp_path: Path, token_head: str) -> None:
    res = _generate(tmp_path, "a", token_head)
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    assert res.returncode == 2 and last.startswith(f"error: cannot connect to the Ray cluster at {token_head}: "), res.stderr[-4000:]
    assert "set RAY_AUTH_MODE=token" in last and "Traceback" not in res.stderr, res.stderr[-4000:]
    wrong = _generate(tmp_path, "b", token_head, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 32)
    last = wrong.stderr.strip().splitlines()[-1] if wrong.stderr.strip() else ""
    assert wrong.returncode == 2 and "the cluster refused this token" in last, wrong.stderr[-4000:]
    ok = _generate(tmp_path, "c", token_head, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)  # what the message says to do
    assert ok.returncode == 0, ok.stderr[-4000:]
    local = _generate(tmp_path, "d", "local", RAY_AUTH_MODE="disabled")
    assert local.returncode == 0, local.stderr[-4000:]
    digest = {o: {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / o).iterdir())} for o in "cd"}
    assert digest["c"] == digest["d"]
