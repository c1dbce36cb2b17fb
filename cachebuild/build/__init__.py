"""The parallel, deterministic, resumable cache builder."""

from cachebuild.build.builder import BuildOptions, BuildSummary, build_cache
from cachebuild.build.plan import ShardSpec, plan_shards, shard_name
from cachebuild.build.source import RecordSource

__all__ = ["BuildOptions", "BuildSummary", "build_cache", "ShardSpec", "plan_shards", "shard_name", "RecordSource"]
