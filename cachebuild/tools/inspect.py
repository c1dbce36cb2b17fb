"""Human-readable summary of a cache: counts, sizes, ratio, field schemas, one record.

The record is read through the loader's decoder (:func:`cachebuild.format.records.read_record`),
strictly: its ``.npy`` headers are checked too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cachebuild.builder.builder import ratio_text
from cachebuild.errors import ConfigError
from cachebuild.format.manifest import Manifest, read_manifest
from cachebuild.format.names import JSON_DTYPE, record_key
from cachebuild.format.reader import ShardSet
from cachebuild.format.records import read_record

__all__ = ["inspect_cache", "describe_value"]


def describe_value(value: Any) -> str:
    """One line for a decoded field: shape, dtype and value range, or the JSON text."""
    if isinstance(value, np.ndarray):
        if value.size == 0:
            return f"{value.dtype}{list(value.shape)} (empty)"
        v = value.astype(np.float64)
        return f"{value.dtype}{list(value.shape)} min {v.min():.4g} max {v.max():.4g} mean {v.mean():.4g}"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 300 else text[:297] + "..."


def recipe_lines(config: dict[str, Any], prefix: str = "", unused: Mapping[str, str] | None = None) -> list[str]:
    """The recipe the cache was built from, one dotted ``key = value`` per line (the form ``--set``/TOML take).

    ``unused`` (dotted key -> why) turns a key into a TOML comment: a causal recipe's size key of another
    graph family, which a recipe file may hold but ``--set`` refuses (it would be ignored)."""
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines += recipe_lines(value, f"{prefix}{key}.", unused)
        elif unused and f"{prefix}{key}" in unused:
            lines.append(f"  # {prefix}{key} = {json.dumps(value)}  ({unused[prefix + key]})")
        else:
            lines.append(f"  {prefix}{key} = {json.dumps(value)}")
    return lines


def _unused_family_keys(config: dict[str, Any]) -> dict[str, str]:
    """The graph size keys of a causal recipe that its family ignores (``graph.m`` of a ``topo`` recipe), with why."""
    from cachebuild.causal.config import FAMILY_OF_KEY

    graph = config.get("graph")
    family = graph.get("family", "topo") if isinstance(graph, dict) else None
    return {key: f"graph.family {owner!r} only: unused here" for key, owner in FAMILY_OF_KEY.items() if family is not None and owner != family}


def generation_lines(m: Manifest, root: Path) -> list[str]:
    """A grown cache's generations: the one committed, those listed (records each), older ones kept for readers."""
    if "generations" not in m.build:
        return []
    from cachebuild.builder.generation_manifest import generation_table
    from cachebuild.format.generations import GENERATIONS_DIR, generation_of

    try:
        table = generation_table(m)
        listed = ", ".join(f"{int(g['generation'])} ({int(g['records'])})" for g in table)
        oldest = int(table[0]["generation"])
    except (KeyError, TypeError, ValueError, IndexError):
        return [f"generation {generation_of(m)} (build.generations is malformed: not written by cachebuild)"]
    folder = root / GENERATIONS_DIR
    older = sorted(int(p.stem[4:]) for p in folder.glob("gen-*.json") if p.stem[4:].isdigit() and int(p.stem[4:]) < oldest)
    lines = [f"generation {generation_of(m)} (lists generations {listed}; record ids from {m.build.get('first_record', 0)})"]
    if older:
        lines.append(f"           older generations still on disk (for readers and checkpoints): {', '.join(map(str, older))}")
    return lines


def _pack_text(m: Manifest) -> str:
    """``, 256 records per member`` (the shards' ``pack``; several values in a grown or mixed cache),
    and ``, small entries share frames of up to 1024 bytes`` (``codec.share``, format v4)."""
    packs = sorted({s.pack for s in m.shards})
    if not packs:
        return ""
    share = f", small entries share frames of up to {m.codec.share} bytes" if m.codec.share else ""
    held = max(min(s.pack, s.records) for s in m.shards)  # a shard smaller than its pack is one shorter member per field
    fewer = f" (members here hold at most {held}: the shards are smaller)" if held < packs[-1] else ""
    return f", {'/'.join(map(str, packs))} record{'s' if packs != [1] else ''} per member{fewer}{share}"


def inspect_cache(root: str | Path, record: int = 0) -> list[str]:
    """Lines describing the cache at ``root`` and record number ``record``."""
    root = Path(root)
    m = read_manifest(root)
    stored = sum(s.bytes for s in m.shards)
    raw = sum(s.raw_bytes for s in m.shards)
    lines = [
        f"cache      {root}",
        f"kind       {m.kind} (format v{m.version}, {m.created_by})",
        f"records    {m.records} in {len(m.shards)} shard{'' if len(m.shards) == 1 else 's'} (seed {m.seed})",
        f"codec      {m.codec.name}" + (f" level {m.codec.level}" if m.codec.name == "zstd" else "") + _pack_text(m),
        f"bytes      raw {raw / 1e6:.1f} MB, stored {stored / 1e6:.1f} MB, {ratio_text(raw / stored if stored else 0.0, m.codec.pack, m.shards)}",
        *generation_lines(m, root),
    ]
    if m.config and m.kind == "mel" and isinstance(m.config.get("mel"), dict):
        # mel recipes take bare keys (--set n_mels=64); where the audio came from is not a recipe key
        lines += ["recipe:", *recipe_lines(m.config["mel"])]
        lines += ["source (not a recipe key):", *recipe_lines({k: v for k, v in m.config.items() if k != "mel"})]
    elif m.config:
        lines += ["recipe:", *recipe_lines(m.config, unused=_unused_family_keys(m.config) if m.kind == "causal" else None)]
    lines.append("fields:")
    for f in m.fields:
        if f.dtype == JSON_DTYPE:
            lines.append(f"  {f.name:<12} json")
        else:
            vary = f" (varying axes {list(f.varying_axes)})" if f.varying_axes else ""
            lines.append(f"  {f.name:<12} {f.dtype:<8} max shape {list(f.max_shape)}{vary}")
    if not isinstance(record, int) or isinstance(record, bool) or not 0 <= record < max(m.records, 1):
        allowed = f"0 to {m.records - 1}" if m.records else "none (the cache is empty)"
        raise ConfigError(f"--record {record} is out of range: {root} holds {m.records} records ({allowed})")
    if m.records:
        with ShardSet(m, root) as shards:
            values = read_record(shards, record, strict=True)
        s = int(np.searchsorted(m.shard_starts(), record, side="right") - 1)
        key = m.shards[s].first_record + record - int(m.shard_starts()[s])
        lines.append(f"record {record} (shard {m.shards[s].name}{'' if key == record else f', tar key {record_key(key)}'}):")
        lines += [f"  {name:<12} {describe_value(value)}" for name, value in values.items()]
    return lines
