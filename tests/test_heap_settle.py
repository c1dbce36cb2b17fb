"""The trainer's process, decoding at 0 workers, keeps its heap between batches (:func:`settle_heap`).

Before, each batch's zstd output and decode buffers (tens of MB, freed together) were given back to the
kernel and faulted in again on the next batch. Measured here as minor page faults per batch in a fresh
process, against the same process with glibc's malloc options set in the environment, where
``settle_heap`` leaves glibc's defaults alone (the user's choice wins).
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
import json, resource, sys
from loaders import ShardStream, make_loader
loader = make_loader(ShardStream(sys.argv[1], view="records", batch_size=96, seed=0), num_workers=0)
for _ in loader:  # warm: the first epoch grows the heap
    pass
before, n = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, 0
for _ in range(3):
    for _ in loader:
        n += 1
print(json.dumps({"faults_per_batch": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n}))
"""


def _record(rng: np.random.Generator, index: int) -> dict:
    return {"x": rng.standard_normal(16_384 + 64 * (index % 9)).astype(np.float32)}  # ~64 KB, a few sizes


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("heap") / "cache"
    build(FunctionSource.per_record(_record, {"x": "float32"}), root, records=480, workers=1, progress=False)
    return root


def _faults(cache: Path, **env: str) -> float:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(cache)], env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True, timeout=120, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["faults_per_batch"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_batches_at_0_workers_do_not_fault_their_heap_in_again(cache):
    settled = _faults(cache)
    glibc_defaults = _faults(cache, MALLOC_TOP_PAD_=str(128 << 10))  # (glibc's default value: only the variable's presence matters)
    assert glibc_defaults > 200, glibc_defaults  # ~6 MB of records a batch: the default heap gives it back every time
    assert settled < glibc_defaults / 4, (settled, glibc_defaults)
