"""Recipe kinds: a registry from a recipe's ``kind`` to the source that builds it.

Built in: ``causal`` (the default when a recipe has no ``kind``) and ``mel``.
Your own: ``kind = "module:attribute"``, importable from the current folder or
``PYTHONPATH``, or a name registered by a package under the
``cachebuild.sources`` entry point group, or :func:`register_kind` at run time.
The attribute is either a :class:`~cachebuild.RecordSource` (used as is) or a
factory called with the recipe's ``[params]`` table as keyword arguments.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cachebuild.builder.source import RecordSource
from cachebuild.errors import ConfigError, SourceError
from cachebuild.recipes import Recipe

__all__ = ["SourceKind", "KINDS", "register_kind", "resolve_kind", "DEFAULT_KIND", "ENTRY_POINT_GROUP", "load_attribute"]

DEFAULT_KIND = "causal"
ENTRY_POINT_GROUP = "cachebuild.sources"

# make(recipe) -> (source, record count or None: the recipe's count is required)
Maker = Callable[[Recipe], "tuple[RecordSource, int | None]"]


@dataclass(frozen=True)
class SourceKind:
    """How a recipe of one kind becomes a source: its count key, unit and default codec."""

    name: str
    make: Maker
    count_key: str = "records"
    unit: str = "records"
    default_codec: str = "zstd"
    default_count: int | None = None


def _make_causal(recipe: Recipe) -> "tuple[RecordSource, int | None]":
    from cachebuild.builder.causal_source import CausalSource
    from cachebuild.causal import parse_causal_config

    return CausalSource(parse_causal_config(recipe.table)), None


def _make_mel(recipe: Recipe) -> "tuple[RecordSource, int | None]":
    from cachebuild.builder.mel_source import mel_source_from

    spec = recipe.table.get("source", {})
    if not isinstance(spec, dict):
        raise ConfigError.bad_value("source", spec, "must be a table: [source] h5 = FILE | wav = DIR | synthetic = N")
    unknown = sorted(set(spec) - {"h5", "wav", "synthetic", "datasets"})
    if unknown:
        raise ConfigError(f"unknown config key 'source.{unknown[0]}' (allowed: h5, wav, synthetic, datasets)")
    source = mel_source_from(recipe, spec.get("h5"), spec.get("wav"), spec.get("synthetic"), spec.get("datasets"))
    return source, len(source.source)


KINDS: dict[str, SourceKind] = {
    "causal": SourceKind("causal", _make_causal, count_key="graphs", unit="graphs", default_count=10_000),
    "mel": SourceKind("mel", _make_mel, count_key="files", unit="files", default_codec="none"),
}


def register_kind(kind: SourceKind, replace: bool = False) -> None:
    """Add a recipe kind (``replace=True`` to override one)."""
    if kind.name in KINDS and not replace:
        raise ValueError(f"recipe kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind


def load_attribute(spec: str) -> Any:
    """Import ``module:attribute`` (the current folder is searched too); ConfigError naming it if that fails."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError.bad_value("kind", spec, "a built-in kind or 'module:attribute'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # loky workers inherit sys.path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and not (module_name == exc.name or module_name.startswith(exc.name + ".")):  # found, but a package it imports is not
            raise ConfigError(f"recipe kind {spec!r}: importing module {module_name!r} failed: {exc} (a package it imports is not installed)") from None
        raise ConfigError(f"recipe kind {spec!r}: cannot import module {module_name!r} ({exc}); is it in the current folder or on PYTHONPATH?") from None
    except Exception as exc:
        raise ConfigError(f"recipe kind {spec!r}: importing module {module_name!r} raised {type(exc).__name__}: {exc}") from None
    _ship_by_value(module)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"recipe kind {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _ship_by_value(module: Any) -> None:
    """Pickle a user's module (not an installed package) by value for the build workers.

    Workers started before the module's folder was put on ``sys.path`` (loky
    reuses its executor within a process) could not import it by name; by value,
    its functions travel with the source.
    """
    import sysconfig

    path = str(getattr(module, "__file__", "") or "")
    installed = [p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]} if p]
    if not path or any(path.startswith(p) for p in installed) or module.__name__.split(".")[0] in ("cachebuild", "loaders"):
        return
    try:
        import cloudpickle  # what loky pickles with when it is installed (a dependency of ours)
    except ImportError:  # pragma: no cover
        return
    cloudpickle.register_pickle_by_value(module)


def _user_maker(spec: str, obj: Any) -> Maker:
    def make(recipe: Recipe) -> "tuple[RecordSource, int | None]":
        params = recipe.table.get("params", {})
        if not isinstance(params, Mapping):
            raise ConfigError.bad_value("params", params, "must be a table of keyword arguments for the source factory")
        extra = sorted(set(recipe.table) - {"kind", "seed", "params"})
        if extra:
            raise ConfigError(f"unknown config key {extra[0]!r} for recipe kind {spec!r} (allowed: kind, seed, records, params, build)")
        if isinstance(obj, RecordSource):
            if params:
                raise ConfigError(f"recipe kind {spec!r} is a source, not a factory: it takes no [params]")
            return obj, None
        try:
            source = obj(**params)
        except TypeError as exc:
            raise ConfigError(f"recipe kind {spec!r}: cannot call it with params {dict(params)}: {exc}") from None
        except Exception as exc:
            raise SourceError(f"source {spec!r}: its factory raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(source, RecordSource):
            raise SourceError(f"source {spec!r}: the factory returned a {type(source).__name__}, not a RecordSource (kind, block_records, fields, config_dict, estimated_record_bytes, blocks)")
        return source, None

    return make


def _entry_point(name: str) -> Any | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # the registering package is broken or half installed: one line, not a traceback
                raise ConfigError(f"recipe kind {name!r}: the '{ENTRY_POINT_GROUP}' entry point {ep.value!r} does not load: {type(exc).__name__}: {exc}") from None
    return None


def resolve_kind(name: str) -> SourceKind:
    """The registered kind ``name``, an entry point of that name, or ``module:attribute``."""
    if not isinstance(name, str) or not name:
        raise ConfigError.bad_value("kind", name, f"a built-in kind ({', '.join(sorted(KINDS))}) or 'module:attribute'")
    if name in KINDS:
        return KINDS[name]
    if ":" not in name:
        obj = _entry_point(name)
        if obj is None:
            raise ConfigError.bad_value("kind", name, f"one of {', '.join(sorted(KINDS))}, an installed '{ENTRY_POINT_GROUP}' entry point, or 'module:attribute'")
        return SourceKind(name, _user_maker(name, obj))
    return SourceKind(name, _user_maker(name, load_attribute(name)))
