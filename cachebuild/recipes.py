"""From a TOML recipe plus CLI flags to (generator config, build options).

A recipe's top level may hold ``seed``, ``graphs`` (or ``files``) and a
``[build]`` table (``shard_mb``, ``codec``, ``level``, ``workers``); every other
table belongs to the generator's own parser, which validates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cachebuild.config_file import apply_overrides, load_toml
from cachebuild.errors import ConfigError
from cachebuild.format.codec import Codec, parse_codec

__all__ = ["Recipe", "load_recipe", "parse_recipe", "BUILD_KEYS"]

BUILD_KEYS = ("shard_mb", "codec", "level", "workers")


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: the generator's table, and the build-level settings."""

    table: dict[str, Any]
    seed: int
    count: int | None
    codec: Codec
    shard_bytes: int
    workers: int | None


def _int(key: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError.bad_value(key, value, f"must be a whole number >= {minimum}")
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
    seed = _int("seed", doc.get("seed", 0), 0)
    count = doc.get(count_key)
    if count is not None:
        count = _int(count_key, count, 1)
    shard_mb = build.get("shard_mb", 256)
    if not isinstance(shard_mb, (int, float)) or isinstance(shard_mb, bool) or shard_mb <= 0:
        raise ConfigError.bad_value("build.shard_mb", shard_mb, "must be a number of megabytes > 0")
    workers = build.get("workers")
    if workers is not None:
        workers = _int("build.workers", workers, 1)
    codec = parse_codec(build.get("codec", default_codec), build.get("level"))
    table = {k: v for k, v in doc.items() if k not in ("build", count_key)}
    return Recipe(table, seed, count, codec, int(shard_mb * (1 << 20)), workers)
