"""Class oversampling in the ``mel`` view: some labels' files read more than once per epoch.

The users' leak trainer has ``leak_oversample_factor`` (``dataset_trainer.py``: 1 in some
versions, 2 in the newest): ``build_indices`` repeats every LEAK segment's index that many
times before its sampler shuffles, so an epoch holds each LEAK segment ``factor`` times.
``ShardStream(root, view="mel", oversample={"LEAK": 2})`` gives the same epoch: the plan's
file order repeats each file of an oversampled label ``factor`` times (copies next to each
other in the order; the mixing pools then spread their segments over the pool's batches, as
for any file), so every segment of such a file is read ``factor`` times per epoch and every
other segment once. Labels are read once per process and generation (the 0-d ``label``
field of every record: one small block read per 65,536 records).

Only for a single cache (a :class:`~loaders.Mixture` has ``weights`` for proportions).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cachebuild.errors import ConfigError
from cachebuild.format.decode import FieldBlock, read_block
from cachebuild.format.manifest import Manifest
from cachebuild.format.reader import ShardSet

__all__ = ["parse_oversample", "record_repeats", "block_labels", "MAX_FACTOR"]

MAX_FACTOR = 1000
_CHUNK = 65_536


def _label_ids(manifest: Manifest) -> dict[str, int]:
    source = (manifest.config or {}).get("source", {}) if isinstance(manifest.config, dict) else {}
    table = source.get("label2id") if isinstance(source, dict) else None
    return {str(k): int(v) for k, v in table.items()} if isinstance(table, dict) else {}


def parse_oversample(option: Mapping[Any, Any] | None, manifest: Manifest, view: str) -> tuple[tuple[int, int], ...]:
    """``{label name or id: factor}`` as sorted ``(label id, factor)`` pairs (factors 1 left out);
    :class:`ConfigError` naming the view, the key and the labels the cache has."""
    if option is None:
        return ()
    if not isinstance(option, Mapping):
        raise ConfigError(f"view {view!r}: oversample must be a dict of label -> factor, e.g. {{'LEAK': 2}}, got {option!r}")
    ids = _label_ids(manifest)
    out: dict[int, int] = {}
    for key, factor in option.items():
        if isinstance(key, str) and key in ids:
            label = ids[key]
        elif isinstance(key, (int, np.integer)) and not isinstance(key, bool) and key >= 0 and (not ids or int(key) in ids.values()):
            label = int(key)  # an id the cache's label table lacks (a typo) would oversample nothing
        else:
            known = ", ".join(f"{name!r} ({i})" for name, i in sorted(ids.items(), key=lambda kv: kv[1])) or "none named; use label ids"
            raise ConfigError(f"view {view!r}: oversample key {key!r} is not a label of {manifest.root} (labels: {known})")
        if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or not 1 <= factor <= MAX_FACTOR:
            raise ConfigError(f"view {view!r}: oversample[{key!r}] = {factor!r} must be a whole number of reads per epoch, 1..{MAX_FACTOR}")
        out[label] = int(factor)
    return tuple(sorted((k, v) for k, v in out.items() if v != 1))


def block_labels(block: FieldBlock) -> np.ndarray:
    """Label of every record of a block (0-d int16 arrays) as int64 ``[G]``."""
    out = np.zeros(len(block.shapes), np.int64)
    block.scatter(out)
    return out


def record_repeats(shards: ShardSet, records: int, factors: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Reads per epoch of each of the first ``records`` records (``int64 [records]``): its label's factor, else 1."""
    labels = np.empty(records, np.int64)
    for a in range(0, records, _CHUNK):
        ids = np.arange(a, min(a + _CHUNK, records), dtype=np.int64)
        labels[a : a + len(ids)] = block_labels(read_block(shards, ids, ["label"])["label"])
    repeats = np.ones(records, np.int64)
    for label, factor in factors:
        repeats[labels == label] = factor
    return repeats
