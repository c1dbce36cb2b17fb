"""The shard format: tar members, per-member codec, sidecar index, manifest.

This package is the only part of ``cachebuild`` the loader imports: it knows
how bytes are laid out on disk and nothing about graphs or audio.
"""

from cachebuild.format.codec import Codec, parse_codec
from cachebuild.format.index import INDEX_DTYPE, MAX_NDIM, load_index
from cachebuild.format.manifest import FORMAT_VERSION, Manifest, ShardEntry, read_manifest
from cachebuild.format.shard_reader import ShardReader
from cachebuild.format.shard_writer import ShardWriter, WrittenShard

__all__ = [
    "Codec",
    "parse_codec",
    "INDEX_DTYPE",
    "MAX_NDIM",
    "load_index",
    "FORMAT_VERSION",
    "Manifest",
    "ShardEntry",
    "read_manifest",
    "ShardReader",
    "ShardWriter",
    "WrittenShard",
]
