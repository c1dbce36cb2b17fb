"""What a view is: records of a cache -> fixed-shape batches, assembled with array operations.

A view says how many *items* each record yields (one per record, or one per
twin row; known from the index shapes, without decoding), declares its batch
:class:`~loaders.batch.Layout` once, and fills one batch from the block of
records its rows need. The plan (:mod:`loaders.plan`) decides which items go
in which batch; the view never sees ranks, workers or epochs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from cachebuild.errors import ConfigError
from cachebuild.format.manifest import FieldSchema, Manifest
from cachebuild.format.names import JSON_DTYPE
from loaders.batch import Field, Layout
from cachebuild.format.reader import ShardSet
from loaders.plan import BatchItems, EpochPlan

__all__ = ["View", "check_mixing", "resolve_delta", "DELTA_MODES", "ShapesFn", "pad_mask", "copy_repeats", "subtract_into", "field_layout", "array_fields", "require_fields"]

ShapesFn = Callable[[str], np.ndarray]
"""``field name -> int64 [records, ndim]`` shapes of that field for every record (index only)."""


class View:
    """Base class of views. Subclasses set ``name`` and implement :meth:`layout` and :meth:`assemble`.

    ``decode_threads`` is the zstd thread count for the block reads (the stream
    sets it: 1 inside DataLoader workers). ``mix`` and ``chunk`` say how the
    plan mixes a many-item view's items across batches (records per pool,
    items kept together; ``mix=None``: record after record, see
    :mod:`loaders.pools`); views with one item per record leave them unset.
    """

    name = "?"
    mix: int | None = None
    chunk: int = 1

    def __init__(self, manifest: Manifest, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.manifest = manifest
        self.batch_size = batch_size
        self.decode_threads = 1

    def options(self) -> dict[str, Any]:
        """The view's settings (part of the plan's identity in a saved state)."""
        return {}

    def bind(self, shapes: ShapesFn) -> np.ndarray | None:
        """Learn what the cache holds (from index shapes); return items per record (``None``: one each)."""
        return None

    def record_repeats(self, shards: Callable[[], ShardSet], records: int) -> np.ndarray | None:
        """Reads per epoch of each record, when the view reads some more than once (``mel``'s
        ``oversample``; ``shards()`` opens the cache only then); ``None``: every record once."""
        return None

    def arrange(self, order: np.ndarray, shards: Callable[[], ShardSet], records: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
        """The epoch's record order as this view reads it: ``order`` (the shuffled record ids) with
        each record repeated :meth:`record_repeats` times; a view may also regroup it (``records``'
        ``bucket_by``). A pure function of its arguments and the cache, like the plan."""
        repeats = self.record_repeats(shards, records)
        return order if repeats is None else np.repeat(order, repeats[order])

    def decoded_fields(self) -> list[str]:
        """The stored fields :meth:`assemble` decodes (what a benchmark counts as the payload read).

        Default: every array field of the cache; views that read fewer say which."""
        return [f.name for f in array_fields(self.manifest)]

    def reset(self) -> None:
        """Forget records kept decoded between batches (a view with a :class:`~loaders.views.store.RecordStore`)."""
        store = getattr(self, "store", None)
        if store is not None:
            store.clear()

    def layout(self) -> Layout:
        """The fixed batch layout (call after :meth:`bind`)."""
        raise NotImplementedError

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        """Fill the pre-allocated (and pre-filled) arrays ``out`` of one batch."""
        raise NotImplementedError

    def assemble_batch(self, shards: ShardSet, plan: EpochPlan, b: int, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with global batch ``b`` of ``plan`` (what the stream calls): :meth:`assemble` of
        ``plan.batch(b)``; a view that needs less of the plan may ask it for less."""
        self.assemble(shards, plan.batch(b), out)


def check_mixing(view: str, mix: Any, chunk: Any) -> tuple[int | None, int]:
    """Validated ``(mix, chunk)`` options of a many-item view."""
    if mix is not None and (isinstance(mix, bool) or not isinstance(mix, (int, np.integer)) or mix < 1):
        raise ValueError(f"view {view!r}: mix must be >= 1 records per pool or None (record after record), got {mix!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"view {view!r}: chunk must be >= 1 items, got {chunk!r}")
    return (None if mix is None else int(mix)), int(chunk)


DELTA_MODES = ("auto", "stored", "computed")


def resolve_delta(manifest: Manifest, delta: str) -> str:
    """``auto``: compute ``int - base`` for causal caches (whose generator defines delta so,
    bit for bit in float32: 40% less zstd work), else read the stored field."""
    if delta not in DELTA_MODES:
        raise ValueError(f"delta must be one of {DELTA_MODES}, got {delta!r}")
    if delta == "auto":
        have = set(manifest.field_names)
        return "computed" if manifest.kind == "causal" and {"int", "base"} <= have else "stored"
    return delta


def array_fields(manifest: Manifest) -> list[FieldSchema]:
    """The non-JSON fields of a cache, in manifest order."""
    return [f for f in manifest.fields if f.dtype != JSON_DTYPE]


def require_fields(manifest: Manifest, names: Sequence[str], view: str) -> None:
    """A clear error when a view needs fields the cache does not have (or is given one name, not a list of them)."""
    if isinstance(names, str):  # fields="adj" would read as the fields 'a', 'd', 'j'
        raise ConfigError(f"view '{view}': fields must be a list of field names, got the string {names!r} (write [{names!r}])")
    have = set(manifest.field_names)
    missing = [n for n in names if n not in have]
    if missing:
        raise ConfigError(f"view '{view}' needs field(s) {missing} that cache {manifest.root or '?'} (kind '{manifest.kind}') lacks; it has {sorted(have)}")


def pad_mask(lengths: np.ndarray, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """``mask[i, j] = j < lengths[i]``: bool ``[len(lengths), size]``."""
    mask = np.arange(size)[None, :] < np.asarray(lengths)[:, None]
    if out is not None:
        out[...] = mask
        return out
    return mask


def subtract_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a - b`` (broadcast), the same IEEE result whichever kernel runs.

    Torch's kernel where torch runs on this thread alone (a DataLoader worker sets one thread):
    about 30% less CPU than numpy's for the graphs view's 6.5 MB ``delta`` (broadcast over the
    interventions). numpy's elsewhere: in a main process torch would split the work over its
    intra-op threads, which wait on cores busy with the workers.
    """
    if torch.get_num_threads() == 1:
        torch.sub(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    else:
        np.subtract(a, b, out=out)


def copy_repeats(out: Mapping[str, np.ndarray], first: np.ndarray, inv: np.ndarray, keys: Sequence[str]) -> None:
    """Rows that repeat an earlier record (padding) copy that record's row, for ``keys``."""
    src = first[inv]
    dup = np.flatnonzero(src != np.arange(len(inv)))
    if dup.size:
        for k in keys:
            out[k][dup] = out[k][src[dup]]


def field_layout(schema: FieldSchema, batch: int) -> Field:
    """A zero-padded batch key for a stored field: ``[batch, *max_shape]`` of its dtype."""
    return Field((batch,) + tuple(schema.max_shape), schema.dtype, 0)
