"""The trainer's process, decoding at 0 workers, keeps its heap between batches (:func:`settle_heap`).

Before, each batch's zstd output and decode buffers (tens of MB, freed together) were given back to the
kernel and faulted in again on the next batch. Measured here as minor page faults per batch in a fresh
process, against the same process with glibc's malloc options set in the environment, where
``settle_heap`` leaves glibc's defaults alone (the user's choice wins), unless the variable was set only
after the process started (glibc never saw it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, resource, sys
if sys.argv[2:] == ["late"]:  # set after this process started, as Dask's LocalCluster does for its workers
    os.environ["MALLOC_TRIM_THRESHOLD_"] = "65536"
from loaders import ShardStream, make_loader
loader = make_loader(ShardStream(sys.argv[1], view="records", batch_size=96, seed=0), num_workers=0)
for _ in loader:  # warm: the first epoch grows the heap
    pass
before, n = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, 0
for _ in range(3):
    for _ in loader:
        n += 1
from cachebuild.format import malloc
print(json.dumps({"faults_per_batch": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n, "level": malloc._LEVEL, "module": malloc.__file__}))
"""


def _record(rng: np.random.Generator, index: int) -> dict:
    return {"x": rng.standard_normal(16_384 + 64 * (index % 9)).astype(np.float32)}  # ~64 KB, a few sizes


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("heap") / "cache"
    build(FunctionSource.per_record(_record, {"x": "float32"}), root, records=480, workers=1, progress=False)
    return root


def _faults(cache: Path, *args: str, **env: str) -> dict:
    """The child's faults per batch, its ``settle_heap`` level and the module it ran; in a clean environment
    (no malloc variables of the test session's) and the repository as its folder."""
    clean = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR") if k in os.environ}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(cache), *args], env={**clean, "PYTHONPATH": str(REPO), **env}, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_batches_at_0_workers_do_not_fault_their_heap_in_again(cache):
    got = _faults(cache)
    kept = _faults(cache, MALLOC_TOP_PAD_=str(128 << 10))  # (glibc's default value: only the variable's presence matters)
    settled, glibc_defaults = got["faults_per_batch"], kept["faults_per_batch"]
    assert got["level"] == 1 and kept["level"] == 1 and got["module"].startswith(str(REPO)), (got, kept)
    assert glibc_defaults > 200, (got, kept)  # ~6 MB of records a batch: the default heap gives it back every time
    assert settled < glibc_defaults / 4, (got, kept)
    late = _faults(cache, "late")  # glibc read its options at the start: a variable set afterwards changed nothing there
    assert late["faults_per_batch"] < glibc_defaults / 4, (late, kept)
