"""cachebuild: pre-generate training data into compressed tar shards, offline and in parallel.

Public builder API (see the README's "Your own data")::

    from cachebuild import FunctionSource, build
    source = FunctionSource.per_record(make_one, {"x": "float32"})
    summary = build(source, "cache/mine", records=100_000)

The names below are imported on first use (:func:`__getattr__`), not with the package: the
loader imports ``cachebuild.format`` (which runs this file first) and must not load the
builder, the recipes or the generators with it (DESIGN: "the loader reads the manifest, never
the generator's code"; ``tests/test_loader_import_boundary.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cachebuild._version import __version__

if TYPE_CHECKING:
    from cachebuild.api import build
    from cachebuild.builder.builder import BuildOptions, BuildSummary
    from cachebuild.builder.entry import build_cache
    from cachebuild.builder.plan import block_rng
    from cachebuild.builder.source import RecordSource
    from cachebuild.function_source import FunctionSource
    from cachebuild.sources import SourceKind, register_kind

__all__ = [
    "BuildOptions",
    "BuildSummary",
    "FunctionSource",
    "RecordSource",
    "SourceKind",
    "__version__",
    "block_rng",
    "build",
    "build_cache",
    "register_kind",
]

_HOMES = {
    "BuildOptions": "cachebuild.builder.builder",
    "BuildSummary": "cachebuild.builder.builder",
    "FunctionSource": "cachebuild.function_source",
    "RecordSource": "cachebuild.builder.source",
    "SourceKind": "cachebuild.sources",
    "block_rng": "cachebuild.builder.plan",
    "build": "cachebuild.api",
    "build_cache": "cachebuild.builder.entry",
    "register_kind": "cachebuild.sources",
}
"""The module each public name lives in, imported when the name is first read."""


def __getattr__(name: str) -> Any:
    """``cachebuild.build``, ``from cachebuild import FunctionSource``: import the name's module, keep the name."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cachebuild' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
