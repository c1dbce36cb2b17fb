"""From a TOML recipe plus CLI flags to (generator config, build options).

A recipe's top level may hold ``seed``, ``graphs`` (or ``files``) and a
``[build]`` table (``shard_mb``, ``codec``, ``level``, ``pack``, ``workers``); every other
table belongs to the generator's own parser, which validates it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cachebuild.checks import MAX_RECORDS
from cachebuild.config_file import apply_overrides, load_toml
from cachebuild.errors import ConfigError
from cachebuild.format.codec import Codec, parse_codec
from cachebuild.format.packing import DEFAULT_PACK

__all__ = ["Recipe", "load_recipe", "parse_recipe", "BUILD_KEYS"]

BUILD_KEYS = ("shard_mb", "codec", "level", "pack", "share", "workers")
MAX_SEED = (1 << 63) - 1
MAX_SHARD_MB = 65536  # 64 GiB shards; beyond that a typo


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: the generator's table, and the build-level settings."""

    table: dict[str, Any]
    seed: int
    count: int | None
    codec: Codec
    shard_bytes: int
    workers: int | None
    pack_given: bool = False
    """The recipe names ``build.pack`` (an append refuses one that packs otherwise than the cache)."""
    seed_given: bool = True
    """The recipe (or ``--seed``) names ``seed``; an append left without one takes the cache's."""
    codec_given: bool = True
    """The recipe (or ``--codec`` / ``--level``) names ``build.codec`` or ``build.level``; an append left without them takes the cache's."""


def _int(key: str, value: Any, minimum: int, maximum: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError.bad_value(key, value, f"must be a whole number from {minimum} to {maximum}")
    return value


def load_recipe(
    path: str | Path | None,
    overrides: Iterable[str] = (),
    values: Mapping[str, Any] | None = None,
    count_key: str = "graphs",
    default_codec: str = "zstd",
) -> Recipe:
    """Read ``path`` (or start empty), apply overrides, split build keys from generator keys."""
    doc = load_toml(path) if path else {}
    return parse_recipe(apply_overrides(doc, overrides, values), count_key, default_codec)


def parse_recipe(doc: Mapping[str, Any], count_key: str = "graphs", default_codec: str = "zstd") -> Recipe:
    """Split a recipe document (overrides already applied) into the generator's table and build settings."""
    build = doc.get("build", {})
    if not isinstance(build, dict):
        raise ConfigError.bad_value("build", build, "must be a table")
    unknown = sorted(set(build) - set(BUILD_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key 'build.{unknown[0]}' (allowed: {', '.join(BUILD_KEYS)})")
    seed = _int("seed", doc.get("seed", 0), 0, MAX_SEED)
    count = doc.get(count_key)
    if count is not None:
        count = _int(count_key, count, 1, MAX_RECORDS)
    shard_mb = build.get("shard_mb", 256)
    if not isinstance(shard_mb, (int, float)) or isinstance(shard_mb, bool) or not math.isfinite(shard_mb) or not 0 < shard_mb <= MAX_SHARD_MB:
        raise ConfigError.bad_value("build.shard_mb", shard_mb, f"must be a finite number of megabytes in (0, {MAX_SHARD_MB}]")
    workers = build.get("workers")
    if workers is not None:
        workers = _int("build.workers", workers, 1, 4096)
    codec = parse_codec(build.get("codec", default_codec), build.get("level"), ("build.codec", "build.level", "build.pack"), build.get("pack", DEFAULT_PACK), build.get("share"))
    if codec.name == "none" and build.get("level") is not None:
        warnings.warn(f"build.level = {build['level']!r} has no effect: build.codec is 'none' (members are stored uncompressed; use --codec zstd to compress)", UserWarning, stacklevel=2)
    table = {k: v for k, v in doc.items() if k not in ("build", count_key)}
    given = ("pack" in build, "seed" in doc, "codec" in build or "level" in build)
    return Recipe(table, seed, count, codec, int(shard_mb * (1 << 20)), workers, *given)
