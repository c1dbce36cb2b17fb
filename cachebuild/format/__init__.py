"""The shard format: tar members, per-member codec, sidecar index, manifest; its writer and its one reader.

This package is the only part of ``cachebuild`` the loader imports: it knows
how bytes are laid out on disk and nothing about graphs or audio. Names and
constants: :mod:`~cachebuild.format.names`; writing: :mod:`~cachebuild.format.shard_writer`;
reading: :mod:`~cachebuild.format.reader` (open and check shards),
:mod:`~cachebuild.format.decode` (blocks of records, vectorised) and
:mod:`~cachebuild.format.records` (one record, whole-shard checks).
"""

from cachebuild.format.codec import Codec, parse_codec
from cachebuild.format.decode import FieldBlock, read_block
from cachebuild.format.index import INDEX_DTYPE, MAX_NDIM, load_index
from cachebuild.format.manifest import FORMAT_VERSION, Manifest, ShardEntry, read_manifest
from cachebuild.format.reader import ShardSet, open_cache
from cachebuild.format.records import read_record
from cachebuild.format.shard_writer import ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "INDEX_DTYPE",
    "MAX_NDIM",
    "Codec",
    "FieldBlock",
    "Manifest",
    "ShardEntry",
    "ShardSet",
    "ShardWriter",
    "load_index",
    "open_cache",
    "parse_codec",
    "read_block",
    "read_manifest",
    "read_record",
]
