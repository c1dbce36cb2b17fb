"""A Ray build with the default worker count uses the CPUs of worker nodes that join while it runs.

The count was taken once, when the build connected: a head started with no CPUs of its own
(``--num-cpus=0``, the usual head of an autoscaling cluster, whose worker nodes come once there is
work) gave 1, and the whole build ran one shard at a time on a cluster that had grown to many CPUs.
Real Ray: a head (``ray.init(num_cpus=0)``) in one process, a worker node (``ray start --block``)
that joins after the build started, a CLI build by address with a user's module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from ray_head import kill_group

pytest.importorskip("ray")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

USER_CODE = """
import os
import time

import numpy as np
from cachebuild import FunctionSource

LOG = {log!r}


def _slow(rng, index):
    if index % 50 == 0:  # a shard's first record
        with open(LOG, "a") as f:
            f.write(f"{{index}} {{time.time()}} {{os.getpid()}}\\n")
    time.sleep(0.02)
    return {{"x": rng.standard_normal(8).astype(np.float32)}}


def make():
    return FunctionSource.per_record(_slow, {{"x": "float32"}}, block_records=10)
"""


@pytest.fixture
def cpu_less_head(tmp_path: Path) -> Iterator[str]:
    """A Ray head with no CPUs (another process, its own session), its GCS address."""
    code = "import time, ray\nray.init(num_cpus=0, include_dashboard=False)\nprint(ray.get_runtime_context().gcs_address, flush=True)\ntime.sleep(900)\n"
    with open(tmp_path / "head.err", "w") as err:
        head = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    try:
        address = head.stdout.readline().strip() if head.stdout else ""
        assert address, (tmp_path / "head.err").read_text()[-4000:]
        yield address
    finally:
        kill_group(head)
        if head.stdout:
            head.stdout.close()


@pytest.mark.timeout(400)
def test_a_default_build_uses_the_cpus_of_a_node_that_joins(tmp_path: Path, cpu_less_head: str) -> None:
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray_cli is None:
        pytest.skip("the ray command is not installed")
    user, log = tmp_path / "user", tmp_path / "starts.log"
    user.mkdir()
    (user / "joinuser.py").write_text(USER_CODE.format(log=str(log)))
    (user / "recipe.toml").write_text('kind = "joinuser:make"\nrecords = 1200\n[build]\nshard_mb = 0.0016\n')
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    node = None
    # `ray start` records its cluster in /tmp/ray/ray_current_cluster, where every later ray.init() without an
    # address (other tests' local Rays) would look for it: put that file back as it was
    address_file = Path("/tmp/ray/ray_current_cluster")
    before = address_file.read_bytes() if address_file.exists() else None
    with open(tmp_path / "build.err", "w") as err:
        build = subprocess.Popen(
            [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-o", str(tmp_path / "out"), "-q", "--backend", "ray", "--address", cpu_less_head],
            cwd=user,
            stderr=err,
            env=env,
            start_new_session=True,
        )
    try:
        time.sleep(3)  # connected, one shard waiting for a CPU
        with open(tmp_path / "node.log", "w") as out:
            node = subprocess.Popen(
                [ray_cli, "start", f"--address={cpu_less_head}", "--num-cpus=2", "--block", "--disable-usage-stats"], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        assert build.wait(300) == 0, (tmp_path / "build.err").read_text()[-4000:]
    finally:
        if build.poll() is None:
            kill_group(build)
        if node is not None:
            kill_group(node)
            if before is None:
                address_file.unlink(missing_ok=True)
            else:
                address_file.write_bytes(before)
    starts = sorted((float(t), int(pid)) for _, t, pid in (line.split() for line in log.read_text().splitlines()))
    assert len(starts) >= 24  # (and the build's probe of record 0, in the CLI)
    overlapping = sum(b - a < 0.8 for (a, _), (b, _) in zip(starts, starts[1:]))  # a shard takes >= 1 s (50 x 20 ms)
    assert overlapping >= 4, f"one shard at a time on a cluster of 2 CPUs: {starts}"
