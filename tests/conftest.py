"""Shared fixtures: toy caches built once per session with the real builder."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

# Dask clusters the tests start themselves (a user's running cluster) keep their scratch space ("dask-scratch-space",
# made by the scheduler and the workers) in a folder of this session's, removed at its end, not in /tmp for good
# (a build's own cluster uses a private folder anyway: cachebuild/builder/backends.py). Set before dask is imported,
# and inherited by the scripts tests start.
_DASK_TMP = tempfile.mkdtemp(prefix="cachebuild-tests-dask-")
os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", _DASK_TMP)
atexit.register(shutil.rmtree, _DASK_TMP, True)

from cachebuild.builder import BuildOptions, build_cache  # noqa: E402
from cachebuild.format.codec import Codec  # noqa: E402
from cachebuild.testing import ToySource  # noqa: E402
from fork_runner import ForkServer  # noqa: E402


def build_toy(out: Path, records: int = 600, codec: Codec = Codec(), shard_bytes: int = 20_000, workers: int = 1, seed: int = 0, **kw):
    """Build a toy cache (several shards) and return its summary."""
    opts = BuildOptions(out=out, records=records, seed=seed, codec=codec, shard_bytes=shard_bytes, workers=workers, progress=False, sync=False, **kw)
    return build_cache(ToySource(), opts)


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "cache"
    build_toy(out)
    return out


@pytest.fixture(scope="session")
def toy_cache_raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toyraw") / "cache"
    build_toy(out, codec=Codec("none", 0))
    return out


@pytest.fixture(scope="session")
def lightning_forks() -> Iterator[ForkServer]:
    """Runs the Lightning test scripts (``[python, SCRIPT, ARGS...]``) each in a fresh process forked from one
    that imported torch, Lightning and our loaders once (tests/fork_runner.py): a new interpreter paid
    Lightning's import every run, 4-7 s on 2 cores (a DDP run's second rank, which Lightning starts as
    ``python SCRIPT ARGS...``, still does)."""
    pytest.importorskip("lightning")
    server = ForkServer(dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])), preload=("torch", "lightning.pytorch", "loaders.lightning"))
    try:
        yield server
    finally:
        server.close()
