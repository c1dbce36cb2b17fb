"""Views: how records become batches. A name -> factory registry, open for more views.

Built in: ``records`` (any cache), ``graphs`` and ``twins`` (causal caches).
Another module adds one with :func:`register_view` (e.g. ``mel`` and
``mel_files`` for mel caches); :class:`loaders.ShardStream` looks names up here.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from cachebuild.format.manifest import Manifest
from loaders.views.base import View
from loaders.views.graphs import GraphsView
from loaders.views.records import RecordsView
from loaders.views.twins import TwinsView, expand_compact

__all__ = ["View", "VIEWS", "register_view", "make_view", "available_views", "RecordsView", "GraphsView", "TwinsView", "expand_compact"]

ViewFactory = Callable[..., View]

VIEWS: dict[str, ViewFactory] = {
    "records": RecordsView,
    "graphs": GraphsView,
    "twins": TwinsView,
}
"""View name -> factory ``(manifest, batch_size, **options) -> View``."""


_LAZY_MODULES = {"mel": "loaders.views.mel", "mel_files": "loaders.views.mel"}
"""Views defined in modules that register themselves when imported, imported on first use."""


def register_view(name: str, factory: ViewFactory, replace: bool = False) -> None:
    """Make ``ShardStream(..., view=name)`` use ``factory``; refuses to shadow a name unless ``replace``."""
    if name in VIEWS and not replace and VIEWS[name] is not factory:
        raise ValueError(f"view {name!r} is already registered ({VIEWS[name]!r}); pass replace=True to override")
    VIEWS[name] = factory


def available_views() -> list[str]:
    """Every view name there is, sorted: the registered ones and those of modules that register
    themselves when imported (imported here; one whose imports fail is left out)."""
    for module in sorted(set(_LAZY_MODULES.values())):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    return sorted(VIEWS)


def make_view(name: str, manifest: Manifest, batch_size: int, **options: Any) -> View:
    """Build view ``name`` for a cache; unknown names and options are clear errors."""
    if name not in VIEWS and name in _LAZY_MODULES:
        try:
            importlib.import_module(_LAZY_MODULES[name])
        except ImportError:
            pass
    try:
        factory = VIEWS[name]
    except KeyError:
        raise ValueError(f"unknown view {name!r}; registered views: {', '.join(sorted(set(VIEWS) | set(_LAZY_MODULES)))}") from None
    signature = inspect.signature(factory)
    try:
        signature.bind(manifest, batch_size, **options)
    except TypeError as exc:
        takes = [p.name for p in list(signature.parameters.values())[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(k for k in options if k not in takes) or sorted(options)
        raise TypeError(f"view {name!r} does not take option(s) {unknown} (it takes: {', '.join(takes) or 'none'}): {exc}") from None
    return factory(manifest, batch_size, **options)
