"""The parallel, deterministic, resumable cache builder."""

from cachebuild.builder.builder import BuildOptions, BuildSummary
from cachebuild.builder.entry import build_cache
from cachebuild.builder.plan import ShardSpec, plan_shards, shard_name
from cachebuild.builder.source import RecordSource

__all__ = ["BuildOptions", "BuildSummary", "build_cache", "ShardSpec", "plan_shards", "shard_name", "RecordSource"]
