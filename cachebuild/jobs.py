"""Library entry points behind the CLI commands (callable from Python too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from cachebuild.build import BuildOptions, BuildSummary, build_cache
from cachebuild.recipes import load_recipe

__all__ = ["run_causal_build", "DEFAULT_GRAPHS"]

DEFAULT_GRAPHS = 10_000


def run_causal_build(
    config_path: str | Path | None,
    overrides: Iterable[str],
    values: Mapping[str, Any],
    out: str | Path,
    workers: int | None = None,
    backend: str = "loky",
    address: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> BuildSummary:
    """Parse the recipe, validate it, and build the causal-graph cache at ``out``."""
    from cachebuild.build.causal_source import CausalSource
    from cachebuild.causal import parse_causal_config

    recipe = load_recipe(config_path, overrides, values, count_key="graphs")
    cfg = parse_causal_config(recipe.table)
    opts = BuildOptions(
        out=out,
        records=recipe.count or DEFAULT_GRAPHS,
        seed=recipe.seed,
        codec=recipe.codec,
        shard_bytes=recipe.shard_bytes,
        workers=workers or recipe.workers,
        backend=backend,
        address=address,
        overwrite=overwrite,
        progress=progress,
    )
    return build_cache(CausalSource(cfg), opts, unit="graphs")
