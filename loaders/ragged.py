"""Variable-length fields at the batch's own maximum: trim a ``records`` batch, add lengths;
and length buckets, so that the records of one batch are of similar sizes.

The ``records`` view pads every varying field to the cache-wide maximum, so the
batch layout is fixed (one packed buffer, one host-to-device copy, one shape for
``torch.compile``). A model that does not need a fixed shape can cut each
batch down to the longest record *in that batch* (what a padding collate does)
with :func:`trim_to_batch_max`: the result holds views of the padded arrays
(no copy), ``<field>_lengths`` (the records' sizes along the first axis) and
trimmed masks. The epoch plan is untouched, so exactly-once and resume hold as
for any batch. Works on numpy arrays and torch tensors, on the host or the
device (on a GPU, reading the batch maximum is one small device-to-host copy).

Trimming alone gains little at large batches (most batches hold one near-maximal
record). :func:`bucket_order` is what the ``records`` view's ``bucket_by=FIELD``
option does to the epoch's record order (as Hugging Face's length-grouped
sampler does): the shuffled order is cut into spans of ``bucket_batches``
batches, each span is sorted by the field's size, cut into batches, and those
batches are shuffled within the span. The order stays a permutation of the
epoch's records (a pure function of seed, epoch and the cache's index shapes),
so exactly-once, equal batches per rank and resume hold as for any order; a last
partial batch stays last.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["trim_to_batch_max", "padding_fraction", "ragged_fields", "bucket_order", "DEFAULT_BUCKET_BATCHES"]

DEFAULT_BUCKET_BATCHES = 50
"""Batches per sorted span (Hugging Face's ``LengthGroupedSampler`` sorts mega-batches of 50)."""

_TAG_BUCKET = 0x6275636B  # "buck": the batch shuffle's own random stream


def ragged_fields(batch: Mapping[str, Any]) -> list[str]:
    """Fields of a ``records`` batch that vary in shape (those with a ``<field>_shape`` key)."""
    return [k for k in batch if f"{k}_shape" in batch and not k.endswith("_shape")]


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        out: np.ndarray = x.detach().cpu().numpy()
        return out
    return np.asarray(x)


def trim_to_batch_max(batch: Mapping[str, Any], fields: Sequence[str] | None = None) -> dict[str, Any]:
    """A copy of ``batch`` whose varying fields (and masks) end at this batch's largest record.

    Adds ``<field>_lengths`` (int64 ``[B]``, the size along the record's first
    axis). Raises ``KeyError`` naming a field that has no ``<field>_shape`` key
    (a fixed-shape field, or a batch from another view).
    """
    names = ragged_fields(batch) if fields is None else list(fields)
    out = dict(batch)
    for name in names:
        if f"{name}_shape" not in batch:
            raise KeyError(f"field {name!r} has no '{name}_shape' key: it is not a varying field of a 'records' batch (varying: {ragged_fields(batch)})")
        shapes = batch[f"{name}_shape"]
        top = _as_numpy(shapes).max(axis=0) if len(shapes) else np.zeros(shapes.shape[1], dtype=np.int64)
        index = (slice(None),) + tuple(slice(0, int(m)) for m in top)
        out[name] = batch[name][index]
        if f"{name}_mask" in batch:
            out[f"{name}_mask"] = batch[f"{name}_mask"][index]
        out[f"{name}_lengths"] = shapes[:, 0]
    return out


def padding_fraction(shapes: np.ndarray, padded: Sequence[int]) -> float:
    """Share of a ``[B, *padded]`` array that is padding, for records of ``shapes`` (int ``[B, ndim]``)."""
    shapes = np.asarray(shapes, dtype=np.int64)
    used = float(np.prod(shapes, axis=1).sum())
    total = float(len(shapes) * np.prod(np.asarray(padded, dtype=np.int64)))
    return 1.0 - used / total if total else 0.0


def bucket_order(order: np.ndarray, sizes: np.ndarray, batch_size: int, batches: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """``order`` (record ids) regrouped so that each batch holds records of similar ``sizes[id]``.

    Spans of ``batches * batch_size`` consecutive records are each sorted by size (ties keep their
    order), then the span's full batches are shuffled among themselves (from ``(seed, epoch)``;
    not when ``shuffle`` is false); a last partial batch stays last. Vectorised: two sorts.
    """
    order = np.asarray(order, dtype=np.int64)
    if batch_size < 1 or batches < 1:
        raise ValueError(f"batch_size and bucket_batches must be >= 1, got {batch_size} and {batches}")
    n = len(order)
    span = batch_size * batches
    pos = np.arange(n, dtype=np.int64)
    out = order[np.lexsort((pos, np.asarray(sizes)[order], pos // span))]
    full = n // batch_size
    if not shuffle or full < 2:
        return out
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), _TAG_BUCKET]))
    first = np.arange(full, dtype=np.int64)
    perm = np.lexsort((rng.random(full), first // batches))  # batches in random order within their span
    rows = (perm[:, None] * batch_size + np.arange(batch_size)).reshape(-1)
    return np.concatenate([out[rows], out[full * batch_size :]])
