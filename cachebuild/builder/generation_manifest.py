"""The manifest of a new generation, and its commit (snapshot first, ``manifest.json`` last).

A grown cache's manifest carries its generation bookkeeping in ``build``:

* ``generation``: the generation this manifest commits (absent: 0);
* ``generations``: one entry per generation it lists, oldest first:
  ``{generation, seed, first_shard, shards, first_record, records}``;
* ``first_record``: global id of the first listed record (past pruned generations);
* ``next_shard``, ``next_record``: where the next append continues numbering.

Everything else (fields, shards, codec, recipe) is the ordinary manifest, so
a reader of one generation is a reader of one cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cachebuild.builder.determinism import build_environment
from cachebuild.builder.markers import done_name
from cachebuild.errors import OutputError, ShardCorruptError
from cachebuild.format.atomic import atomic_write_bytes
from cachebuild.format.generations import GENERATIONS_DIR, GROWN_VERSION, generation_of, snapshot_path
from cachebuild.format.index import load_index
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, schemas_from_indexes, shape_bounds

__all__ = ["generation_table", "shard_number", "commit_generation", "listed_generations", "old_shape_bounds", "shard_files", "APPEND_RECORD"]


def shard_number(name: str) -> int:
    """``shard-00012.tar`` -> 12."""
    return int(name.removeprefix("shard-").removesuffix(".tar"))


def generation_table(manifest: Manifest) -> list[dict[str, Any]]:
    """The generations ``manifest`` lists, oldest first (a cache that never grew: one entry, generation 0)."""
    table = manifest.build.get("generations")
    if table is None:
        return [{"generation": 0, "seed": manifest.seed, "first_shard": 0, "shards": len(manifest.shards), "first_record": 0, "records": manifest.records}]
    return [dict(g) for g in table]


def listed_generations(manifest: Manifest) -> list[int]:
    """Generation numbers ``manifest`` lists, oldest first."""
    return [int(g["generation"]) for g in generation_table(manifest)]


def _load_index(root: Path, shard: ShardEntry, n_fields: int) -> np.ndarray:
    """Shard ``shard``'s index, read bounded by its records x fields (the cache may be a stranger's)."""
    try:
        return load_index(root / shard.index, n_fields, shard.records)
    except ShardCorruptError as exc:
        raise OutputError(str(exc)) from exc


def _kept_table(old: Manifest, entry: dict[str, Any], keep: int | None) -> list[dict[str, Any]]:
    """The generations the next manifest lists: the old ones and ``entry``, cut to the newest ``keep``."""
    table = generation_table(old) + [entry]
    return table if keep is None else table[-keep:]


def _kept_old_shards(old: Manifest, entry: dict[str, Any], keep: int | None) -> tuple[ShardEntry, ...]:
    """The old shards the next manifest keeps listing."""
    first_kept = int(_kept_table(old, entry, keep)[0]["first_shard"])
    return tuple(s for s in old.shards if shard_number(s.name) >= first_kept)


def old_shape_bounds(root: Path, old: Manifest, entry: dict[str, Any], keep: int | None) -> list[np.ndarray]:
    """What the next manifest's field schemas need of the old shards it keeps (:func:`~cachebuild.format.manifest.shape_bounds` of
    each index), read and checked now: an append calls this before it writes anything, so a cache whose
    old index is corrupt is refused (:class:`~cachebuild.errors.OutputError`) with nothing built. One
    index is held at a time."""
    n_fields = len(old.fields)
    return [shape_bounds(_load_index(root, s, n_fields)) for s in _kept_old_shards(old, entry, keep)]


def _next_manifest(root: Path, old: Manifest, new: list[ShardEntry], entry: dict[str, Any], keep: int | None, old_bounds: list[np.ndarray]) -> Manifest:
    """Generation ``entry['generation']``: the old listing (cut to the newest ``keep`` generations) plus ``new``;
    ``old_bounds``: :func:`old_shape_bounds` of the same ``old``, ``entry`` and ``keep``."""
    table = _kept_table(old, entry, keep)
    kept = _kept_old_shards(old, entry, keep)
    shards = kept + tuple(new)
    fields = [(f.name, f.dtype) for f in old.fields]
    indexes = list(old_bounds) + [_load_index(root, s, len(fields)) for s in new]
    fields_schema = schemas_from_indexes(fields, indexes, [s.name for s in shards])
    build = dict(old.build)
    build.update(
        generation=int(entry["generation"]),
        generations=table,
        first_record=int(table[0]["first_record"]),
        next_shard=int(entry["first_shard"]) + int(entry["shards"]),
        next_record=int(entry["first_record"]) + int(entry["records"]),
        environment=build_environment(),
    )
    return Manifest(kind=old.kind, config=old.config, seed=old.seed, codec=old.codec, fields=fields_schema, shards=shards, version=GROWN_VERSION, build=build, created_by=old.created_by, root=old.root)


def commit_generation(root: Path, old: Manifest, new: list[ShardEntry], entry: dict[str, Any], keep: int | None, old_bounds: list[np.ndarray]) -> Manifest:
    """Write the new generation's snapshot, then replace ``manifest.json`` (the commit point); returns it.

    The previous generation gets its snapshot first (a cache's first append
    snapshots generation 0), so a reader of it finds its shard list after the
    commit. ``old_bounds``: :func:`old_shape_bounds`, read before the append built anything.
    """
    before = snapshot_path(root, generation_of(old))
    before.parent.mkdir(exist_ok=True)
    if not before.is_file():
        atomic_write_bytes(before, (root / MANIFEST_NAME).read_bytes())
    manifest = _next_manifest(root, old, new, entry, keep, old_bounds)
    data = manifest.to_json()
    Manifest.from_json(data, str(root))  # what every reader will check, checked before it is committed
    atomic_write_bytes(snapshot_path(root, generation_of(manifest)), data)
    atomic_write_bytes(root / MANIFEST_NAME, data)
    return manifest


APPEND_RECORD = f"{GENERATIONS_DIR}/append.json"
"""An unfinished append's record (its plan), removed when the generation is committed."""


def shard_files(shard: ShardEntry) -> tuple[str, str, str]:
    """The three files of a shard: tar, index, done marker."""
    return shard.name, shard.index, done_name(shard.name)
