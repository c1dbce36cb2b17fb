"""Shared fixtures: toy caches built once per session with the real builder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from cachebuild.builder import BuildOptions, build_cache
from cachebuild.format.codec import Codec
from cachebuild.testing import ToySource
from fork_runner import ForkServer


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
