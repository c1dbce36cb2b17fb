"""``build_cache``: the one entry point of the builder, a fresh build (or its resume) or an append.

Kept apart from :mod:`cachebuild.builder.builder` (the fresh build) and
:mod:`cachebuild.builder.append` (a new generation, which reuses the fresh
build's shard step) so that neither imports the other in a circle.
"""

from __future__ import annotations

from cachebuild.builder.append import append_cache
from cachebuild.builder.builder import BuildOptions, BuildSummary, build_fresh
from cachebuild.builder.source import RecordSource

__all__ = ["build_cache"]


def build_cache(source: RecordSource, opts: BuildOptions, unit: str = "records") -> BuildSummary:
    """Build (or finish, or confirm) the cache described by ``source`` and ``opts``; with
    ``opts.append``, add a generation of fresh records to the existing cache instead."""
    if opts.append:
        return append_cache(source, opts, unit)
    return build_fresh(source, opts, unit)
