"""The public builder API: ``build(recipe or source, out, ...)`` -> :class:`BuildSummary`.

One path for every kind of data: a TOML recipe (a file, or a dict) names its
``kind``; :mod:`cachebuild.sources` maps the kind to a source; the recipe's
``[build]`` table and the call's arguments become :class:`BuildOptions`; the
builder does the rest. A :class:`RecordSource` object can be passed directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from cachebuild.builder import BuildOptions, BuildSummary, build_cache
from cachebuild.builder.source import RecordSource
from cachebuild.config_file import apply_overrides, load_toml, naming_recipe
from cachebuild.errors import ConfigError
from cachebuild.format.codec import parse_codec
from cachebuild.format.packing import DEFAULT_PACK
from cachebuild.jobs import check_family_keys, recipe_options
from cachebuild.recipes import parse_recipe
from cachebuild.sources import DEFAULT_KIND, SourceKind, resolve_kind

__all__ = ["build", "build_recipe", "read_recipe"]


def read_recipe(recipe: str | Path | Mapping[str, Any], overrides: Iterable[str] = (), values: Mapping[str, Any] | None = None) -> tuple[SourceKind, dict[str, Any]]:
    """The recipe document (``--set`` overrides applied) and the kind it names."""
    doc = dict(recipe) if isinstance(recipe, Mapping) else load_toml(recipe)
    doc = apply_overrides(doc, overrides, values)
    return resolve_kind(doc.setdefault("kind", DEFAULT_KIND)), doc


def build_recipe(
    recipe: str | Path | Mapping[str, Any],
    out: str | Path,
    *,
    overrides: Iterable[str] = (),
    records: int | None = None,
    seed: int | None = None,
    workers: int | None = None,
    backend: str = "loky",
    address: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    append: bool = False,
    keep: int | None = None,
    build_values: Mapping[str, Any] | None = None,
) -> tuple[BuildSummary, str]:
    """Build the cache a recipe describes; returns the summary and the kind's unit (``graphs``, ...).

    ``build_values`` are recipe keys set by flags or arguments (``{"build.codec": "none"}``; None: not
    given), applied after ``overrides`` as ``generate``'s flags are: a flag overrides the recipe."""
    path = None if isinstance(recipe, Mapping) else recipe
    overrides = list(overrides)  # read twice (applied, then checked)
    with naming_recipe(path, overrides):
        kind, doc = read_recipe(recipe, overrides, {"seed": seed, **(build_values or {})})
        if records is not None:
            doc[kind.count_key] = records
        parsed = parse_recipe(doc, kind.count_key, kind.default_codec)
        if kind.name == "causal":  # `cachebuild build` of a causal recipe, as `generate`
            check_family_keys(parsed, overrides, build_values or {})
        source, count = kind.make(parsed)
        if append and count is not None:
            raise ConfigError(f"recipe kind {kind.name!r} reads a fixed set of inputs ({count} records): an append needs a generator (fresh records from fresh seeds)")
        if count is not None and parsed.count is not None and parsed.count != count:  # was ignored: --records 5 built all 20
            raise ConfigError(
                f"recipe kind {kind.name!r} makes one record per input, {count} {kind.unit} here: a count of {parsed.count} "
                f"(--records, or {kind.count_key!r} in the recipe) cannot apply; for synthetic clips set [source] synthetic = N"
            )
        total = count if count is not None else (parsed.count or kind.default_count)
        if total is None:
            raise ConfigError(f"recipe kind {kind.name!r} needs a record count: set '{kind.count_key} = N' in the recipe or pass --records N")
        opts = recipe_options(parsed, out, total, workers, backend, address, overwrite, progress, append, keep)
    return build_cache(source, opts, unit=kind.unit), kind.unit


def build(
    what: RecordSource | str | Path | Mapping[str, Any],
    out: str | Path,
    *,
    records: int | None = None,
    seed: int | None = None,
    workers: int | None = None,
    backend: str = "loky",
    progress: bool = True,
    overwrite: bool = False,
    overrides: Iterable[str] = (),
    codec: str | None = None,
    level: int | None = None,
    pack: int | None = None,
    share: int | None = None,
    shard_mb: float | None = None,
    address: str | None = None,
    append: bool = False,
    keep: int | None = None,
) -> BuildSummary:
    """Build (or resume, or confirm) a cache at ``out`` and return its :class:`BuildSummary`.

    ``what`` is a :class:`RecordSource` (then ``records`` is required; ``seed``
    defaults to 0, ``codec`` to zstd, ``shard_mb`` to 256, ``pack`` (records per tar member, see
    :mod:`cachebuild.format.packing`) to 1 for records of 8 KiB and more and 256 to 4,096 for smaller
    ones, about 4 MB per member (:func:`~cachebuild.format.packing.default_pack`), and a rerun that leaves ``pack`` out
    keeps the cache's own; with ``append`` a seed, codec, level or pack left out is the cache's
    own; ``share``, the most decoded bytes consecutive small entries of a packed zstd member may
    share one frame with, defaults to :data:`~cachebuild.format.packing.SHARE_BYTES`, 0 for one frame
    per entry (see :mod:`cachebuild.format.shared_frames`)), or a recipe: a TOML path or a dict, whose ``kind`` picks the source
    and whose ``[build]`` table sets codec and shard size; ``codec``, ``level``, ``pack`` and
    ``shard_mb`` given here override that table, as the CLI's flags do (``overrides`` are
    ``"key=value"`` strings as with ``--set``). Same inputs give byte-identical shards for any
    ``workers`` and ``backend``; rerunning after an interruption finishes it.

    ``append=True`` adds ``records`` fresh records to the existing cache at
    ``out`` as its next generation (same recipe and seed, checked; see
    :mod:`cachebuild.builder.append`); ``keep=N`` then lists only the newest N
    generations and deletes older shards no reader holds.
    """
    run: dict[str, Any] = {"workers": workers, "backend": backend, "address": address, "overwrite": overwrite, "progress": progress, "append": append, "keep": keep}
    if isinstance(what, RecordSource):
        if records is None:
            raise ConfigError("build(source, ...) needs records=N (how many records to make)")
        return build_cache(what, _source_options(out, records, seed, codec, level, pack, shard_mb, run, share))
    if not isinstance(what, (str, Path, Mapping)):
        raise ConfigError(f"build() takes a RecordSource or a recipe (TOML path or dict), got {type(what).__name__}")
    values = {"build.codec": codec, "build.level": level, "build.pack": pack, "build.share": share, "build.shard_mb": shard_mb}
    summary, _ = build_recipe(what, out, overrides=overrides, records=records, seed=seed, build_values=values, **run)
    return summary


def _source_options(
    out: str | Path, records: int, seed: int | None, codec: str | None, level: int | None, pack: int | None, shard_mb: float | None, run: dict[str, Any], share: int | None = None
) -> BuildOptions:
    """Build options for a :class:`RecordSource` passed directly; what is left out (None) is the default,
    or with ``append`` the cache's own."""
    return BuildOptions(
        out=out,
        records=records,
        seed=0 if seed is None else seed,
        codec=parse_codec(codec or "zstd", level, ("codec", "level", "pack"), DEFAULT_PACK if pack is None else pack, share),
        shard_bytes=_shard_bytes(256 if shard_mb is None else shard_mb),
        pack_given=pack is not None,
        seed_given=seed is not None,
        codec_given=codec is not None or level is not None,
        **run,
    )


def _shard_bytes(shard_mb: Any) -> int:
    """``shard_mb`` in bytes, checked as the recipe's ``build.shard_mb`` is (a NaN or a negative size is refused)."""
    return parse_recipe({"build": {"shard_mb": shard_mb}}).shard_bytes
