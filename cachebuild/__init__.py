"""cachebuild: pre-generate training data into compressed tar shards, offline and in parallel.

Public builder API (see the README's "Your own data")::

    from cachebuild import FunctionSource, build
    source = FunctionSource.per_record(make_one, {"x": "float32"})
    summary = build(source, "cache/mine", records=100_000)
"""

from cachebuild._version import __version__
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
