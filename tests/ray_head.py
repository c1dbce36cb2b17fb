"""A real Ray head in another process, for tests that connect to a running cluster by address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def ray_head(log: Path, env: dict[str, str], num_cpus: int) -> Iterator[str]:
    """``ray.init`` in its own process group (stderr to ``log``), yielding its GCS address; killed after."""
    code = f"import time, ray\nray.init(num_cpus={num_cpus}, include_dashboard=False)\nprint(ray.get_runtime_context().gcs_address, flush=True)\ntime.sleep(900)\n"
    with open(log, "w") as err:
        head = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True, env=env)
    try:
        address = head.stdout.readline().strip() if head.stdout else ""
        assert address, f"the Ray head did not start (rc={head.poll()}):\n{log.read_text()[-4000:]}"
        yield address
    finally:
        kill_group(head)
        if head.stdout:
            head.stdout.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group (a Ray head and what it started), SIGKILL after 60 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
