"""Shared fixtures: toy caches built once per session with the real builder."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachebuild.builder import BuildOptions, build_cache
from cachebuild.format.codec import Codec
from cachebuild.testing import ToySource


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
