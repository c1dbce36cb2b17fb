"""How the ``records`` view's pooled mode (``mix=``) keeps a pool's records decoded, and reads a batch from them.

The pool's records live in a :class:`loaders.views.store.RecordStore` (shared
between DataLoader workers by :mod:`loaders.shared_pools`), one row per record:

* a field of one shape, or of varying shape over several axes: the record's
  padded row (``field``), its shape beside it (``field_shape``); bytes past the
  record's shape are whatever the row held before (a reused region is not
  cleared), so a batch zeroes them through the shape's mask;
* a 1-d field of many lengths (token ids): *flat*. A decode call's records
  (consecutive rows ``a..b`` of a region, the whole pool or a worker's part of
  it) go into the elements of those rows, flattened: zstd's decoded buffers
  copied whole where they fit (small records: headers and neighbours' bytes
  beside them), else the records' own elements one right after another (they
  fit: ``b - a`` records of at most the max length), and ``field_at`` holds
  each record's first element in the flattened field (no padded row written,
  no element index where the buffers fit: :meth:`~cachebuild.format.segments.Segments.pack_into`).
  A batch row is a window of the flat data starting at the record
  (:func:`_read_flat`).
  Records a decode gets in other rows, or whose data zstd left unaligned, take
  their padded row (``field_at`` = the row's first element) instead.

Batches are the same bytes as the unpooled view's: each record's own elements,
zero beyond them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from cachebuild.format.decode import FieldBlock
from cachebuild.format.segments import length_mask, small_int, window_rows
from loaders.plan import BatchItems, EpochPlan
from loaders.views.store import Dense

__all__ = ["pool_fields", "is_flat", "write_pool", "read_rows", "row_items", "plan_key", "first_pool", "shape_mask"]


def is_flat(schema: Any) -> bool:
    """A 1-d field of varying length: kept flat in the store."""
    return bool(schema.varying_axes) and schema.ndim == 1


def pool_fields(schemas: Sequence[Any]) -> dict[str, Dense]:
    """The store's arrays for ``schemas`` (none cleared when a region is reused: batches mask)."""
    dense: dict[str, Dense] = {}
    for f in schemas:
        dense[f.name] = Dense(tuple(f.max_shape), f.dtype, False)
        if f.varying_axes:
            dense[f"{f.name}_shape"] = Dense((f.ndim,), "int64", False)
        if is_flat(f):
            dense[f"{f.name}_at"] = Dense((), "int64", False)
    return dense


def write_pool(blocks: dict[str, FieldBlock], schemas: Sequence[Any], arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
    """Decoded ``blocks`` (block row ``i`` = store row ``dest[i]``) into the store's ``arrays``.

    ``dest`` must lie in one region of the store (:meth:`loaders.views.store.RecordStore._by_region`):
    a flat field's records may be laid out anywhere in the rows ``dest`` spans, and regions are reused one by one."""
    consecutive = len(dest) > 0 and int(dest[-1]) - int(dest[0]) + 1 == len(dest) and bool((np.diff(dest) == 1).all())
    for f in schemas:
        blk, data = blocks[f.name], arrays[f.name]
        if f.varying_axes:
            arrays[f"{f.name}_shape"][dest] = blk.shapes
        if not is_flat(f):
            blk.scatter(data, dest)
            continue
        width = data.shape[1]
        if blk.segments is None:  # (records zstd left unaligned: padded rows)
            arrays[f"{f.name}_at"][dest] = dest * width
            blk.scatter(data, dest)
        elif consecutive:  # (a whole pool or part: flat)
            arrays[f"{f.name}_at"][dest] = blk.segments.pack_into(data.reshape(-1), int(dest[0]) * width, len(dest) * width)
        else:  # (rows spread over the region: each record at its row's start)
            arrays[f"{f.name}_at"][dest] = dest * width
            blk.segments.scatter_windows(data, dest)


def read_rows(arrays: dict[str, np.ndarray], row: np.ndarray, schemas: Sequence[Any], out: dict[str, np.ndarray], mask_of: Any) -> None:
    """Batch rows = store rows ``row``: every field of ``schemas`` into ``out`` (and its shape), zero
    outside each record's shape; ``mask_of(schema)`` is the bool array for that field's mask."""
    for f in schemas:
        if not f.varying_axes:
            # (mode="clip": rows are in range by construction, and "raise" takes 3x as long, via a copy)
            np.take(arrays[f.name], row, axis=0, out=out[f.name], mode="clip")
            continue
        shapes = np.take(arrays[f"{f.name}_shape"], row, axis=0, out=out[f"{f.name}_shape"], mode="clip")
        mask = mask_of(f)
        shape_mask(shapes, f.max_shape, mask)
        if is_flat(f):
            _read_flat(arrays[f.name].reshape(-1), arrays[f"{f.name}_at"][row], shapes[:, 0], out[f.name], mask)
        else:
            np.take(arrays[f.name], row, axis=0, out=out[f.name], mode="clip")
            _zero_outside(out[f.name], mask)


def _read_flat(flat: np.ndarray, at: np.ndarray, length: np.ndarray, out: np.ndarray, mask: np.ndarray) -> None:
    """``out[i] = flat[at[i] : at[i] + length[i]]``, zero beyond (``mask``: the lengths' mask, ``out``'s shape).

    Each row is a window of the flat data from its record's first element (:func:`window_rows`: copied
    whole), zeroed past the record through the mask. Where the batch's widest record is at least half
    the row (the usual case), the windows are as wide as the row, so the copy and the zeroing are one
    contiguous multiply into the batch; else as wide as the widest record, the rest of the row zeroed."""
    wide = int(length.max()) if len(length) else 0
    if wide == 0:
        out[...] = 0
        return
    if 2 * wide >= out.shape[1] and len(flat) >= out.shape[1] and out.flags.c_contiguous:
        wide = out.shape[1]
    else:
        out[:, wide:] = 0
    limit = len(flat) - wide  # the last start whose window stays inside the array
    gathered = window_rows(flat, np.minimum(at, limit), wide)
    rows, inside = out[:, :wide], mask[:, :wide]
    if rows.dtype.kind in "biu":  # (the copy and the zeroing in one pass)
        np.multiply(gathered, inside, out=rows)
    else:  # (bytes past a record may read as NaN: NaN * 0 is NaN)
        rows[...] = 0
        np.copyto(rows, gathered, where=inside)
    for i in np.flatnonzero(at > limit).tolist():  # (records in the array's last window: a few at most)
        n = int(length[i])
        out[i, :n] = flat[int(at[i]) : int(at[i]) + n]


def _zero_outside(data: np.ndarray, mask: np.ndarray) -> None:
    """``data[~mask] = 0``: a multiply for integers and bools (half the time of a masked copy); a masked copy
    for floats, where the bytes outside may be NaN (NaN * 0 is NaN)."""
    if data.dtype.kind in "biu":
        np.multiply(data, mask, out=data)
    else:
        np.copyto(data, 0, where=~mask)


def shape_mask(shapes: np.ndarray, max_shape: Sequence[int], out: np.ndarray) -> None:
    """``out[i, j0, j1, ...] = all(j_d < shapes[i, d])``, vectorised over the batch: one broadcast
    compare for the first axis written straight into ``out``, one ``&=`` per further axis."""
    nd = len(max_shape)
    if nd == 0:
        out[...] = True
        return
    if nd == 1:
        length_mask(shapes[:, 0], out)
        return
    kind = small_int(max(max_shape))
    for d, m in enumerate(max_shape):
        idx = np.arange(m, dtype=kind).reshape((1,) + (1,) * d + (m,) + (1,) * (nd - d - 1))
        lim = shapes[:, d].astype(kind).reshape((-1,) + (1,) * nd)
        if d == 0:
            np.less(idx, lim, out=out)
        else:
            out &= idx < lim


def plan_key(plan: EpochPlan) -> tuple[Any, ...]:
    """What a pooled batch names its plan by (a store keeps its regions while it is the same)."""
    assert plan.pools is not None, "a pooled plan"
    return (plan.seed, plan.epoch, len(plan.order), len(plan.pools), plan.chunk)


def first_pool(plan: EpochPlan) -> tuple[tuple[Any, ...], int, np.ndarray] | None:
    """``(plan key, plan fingerprint, record ids)`` of ``plan``'s first pool (a store decodes it ahead), or ``None``."""
    if plan.pools is None:
        return None
    return plan_key(plan), plan.fingerprint(), plan.pool_records(0)


def row_items(plan: EpochPlan, b: int) -> BatchItems:
    """Batch ``b`` of a pooled plan with one entry per row (``unique`` repeats a record where padding
    does): each row's pool and place, what the record store reads, without the plan's search for the
    batch's distinct records (a sort of the batch: 7% of a pooled batch's time)."""
    assert plan.pools is not None, "a pooled plan"
    pool, place, items, is_pad = plan.pool_rows(b)
    records = plan.order[plan.pools[pool] + place]
    rows = np.arange(len(records), dtype=np.int64)
    return BatchItems(b, records, items, is_pad, records, rows, rows, pool, place, plan.pool_size, plan.pool_span, plan_key(plan), plan.pool_records, plan.fingerprint())
