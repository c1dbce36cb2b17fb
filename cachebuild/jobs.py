"""Library entry points behind the CLI commands (callable from Python too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from cachebuild.builder import BuildOptions, BuildSummary, build_cache
from cachebuild.config_file import naming_recipe
from cachebuild.errors import ConfigError
from cachebuild.builder.mel_source import mel_source_from
from cachebuild.causal.config import FAMILY_OF_KEY
from cachebuild.recipes import Recipe, load_recipe

__all__ = ["run_causal_build", "run_mel_build", "recipe_options", "check_family_keys", "DEFAULT_GRAPHS"]

DEFAULT_GRAPHS = 10_000

# Mel float16 compresses ~1.3x, tar framing eats most of that, and zstd halves the
# loader's segments/s per core (benchmarks/RESULTS.md, bench_mel): raw by default.
MEL_DEFAULT_CODEC = "none"


def recipe_options(
    recipe: Recipe, out: str | Path, records: int, workers: int | None, backend: str, address: str | None, overwrite: bool, progress: bool, append: bool = False, keep: int | None = None
) -> BuildOptions:
    """Build options from a parsed recipe plus the run settings (command line or ``cachebuild.build``)."""
    return BuildOptions(
        out=out,
        records=records,
        seed=recipe.seed,
        codec=recipe.codec,
        shard_bytes=recipe.shard_bytes,
        workers=workers or recipe.workers,
        backend=backend,
        address=address,
        overwrite=overwrite,
        progress=progress,
        append=append,
        keep=keep,
        pack_given=recipe.pack_given,
        seed_given=recipe.seed_given,
        codec_given=recipe.codec_given,
    )


def _check_kind(recipe: Any, kind: str, config_path: str | Path | None, command: str) -> None:
    """A recipe of another kind names the command that builds it (instead of an unknown-key error)."""
    got = recipe.table.get("kind", kind)
    if got != kind:
        raise ConfigError(
            f"{config_path}: this recipe is kind = {got!r}, and `cachebuild {command}` builds {kind!r} caches: "
            f"use `cachebuild build --config {config_path}`" + (" or `cachebuild mel --config ...`" if got == "mel" else "")
        )


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
    append: bool = False,
    keep: int | None = None,
) -> BuildSummary:
    """Parse the recipe, validate it, and build the causal-graph cache at ``out`` (``append``: add a generation to it)."""
    from cachebuild.sources import KINDS

    with naming_recipe(config_path, overrides):
        recipe = load_recipe(config_path, overrides, values, count_key="graphs")
        _check_kind(recipe, "causal", config_path, "generate")
        check_family_keys(recipe, overrides, values)
        source, _ = KINDS["causal"].make(recipe)  # the same maker as `cachebuild build` with kind = "causal"
        opts = recipe_options(recipe, out, recipe.count or DEFAULT_GRAPHS, workers, backend, address, overwrite, progress, append, keep)
    return build_cache(source, opts, unit="graphs")


def check_family_keys(recipe: Recipe, overrides: Iterable[str], values: Mapping[str, Any]) -> None:
    """A family's size key given on the command line (``--edge-prob``, ``--set graph.m=3``) for a recipe of
    another family would be ignored: refuse it in one line (a recipe file may spell out every key). Both
    ``generate`` and ``cachebuild build`` / :func:`cachebuild.build` of a causal recipe check it."""
    given = {k for k, v in values.items() if v is not None} | {o.split("=", 1)[0].strip() for o in overrides}
    graph = recipe.table.get("graph", {})
    family = graph.get("family", "topo") if isinstance(graph, dict) else "topo"
    for key, owner in FAMILY_OF_KEY.items():
        if key in given and family != owner:
            uses = ", ".join(f"{f}: {k}" for k, f in FAMILY_OF_KEY.items())
            raise ConfigError(f"config key '{key}' applies to graph.family '{owner}' only, and this recipe's family is {family!r}: it would be ignored ({uses})")


def run_mel_build(
    config_path: str | Path | None,
    overrides: Iterable[str],
    values: Mapping[str, Any],
    out: str | Path,
    from_h5: str | Path | None = None,
    from_wav: str | Path | None = None,
    synthetic: int | None = None,
    h5_datasets: Mapping[str, str] | None = None,
    workers: int | None = None,
    backend: str = "loky",
    address: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> BuildSummary:
    """Build a mel cache (one record per audio file) from exactly one source."""
    with naming_recipe(config_path, overrides):
        recipe = load_recipe(config_path, overrides, values, count_key="files", default_codec=MEL_DEFAULT_CODEC)
        _check_kind(recipe, "mel", config_path, "mel")
        source = mel_source_from(recipe, from_h5, from_wav, synthetic, h5_datasets)
        opts = recipe_options(recipe, out, len(source.source), workers, backend, address, overwrite, progress)
    return build_cache(source, opts, unit="files")
