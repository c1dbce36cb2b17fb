"""The generic ``records`` view: any cache's array fields, stacked, varying ones padded with masks.

Batch keys (``B`` = batch size, ``M`` = the field's max shape from the manifest):

* ``<field>``: ``[B, *M]`` of the field's dtype, zero beyond each record's shape;
* ``<field>_shape``: int64 ``[B, ndim]``, each record's shape (varying fields only);
* ``<field>_mask``: bool ``[B, *M]``, true inside the record's shape (varying fields, ``masks=True``);
* ``record_id``: int64 ``[B]``; ``is_pad``: bool ``[B]`` (a repeat that fills the epoch's last batches).

``bucket_by=FIELD`` groups records of similar size of that varying field into the same batches
(:func:`loaders.ragged.bucket_order`, spans of ``bucket_batches`` batches), so that
:func:`loaders.ragged.trim_to_batch_max` cuts most of the padding; shapes stay fixed without it.

``mix=N`` (or ``"auto"``: 64 MB of padded records per pool, at least 1,024) reads *pools*, for caches
of small records in shared zstd frames (``build.share=65536``; :mod:`loaders.frame_order`): the
epoch's order keeps the records of each frame together, is cut into pools of ``N`` records, and each
batch draws its records at random from its pool, which is decoded once, each frame once
(:mod:`loaders.views.records_pool`; shared between DataLoader workers). A batch then mixes records of
the ``N / (records per frame)`` frames of its pool, drawn from the whole cache, rather than records
drawn one by one (``mix=None``, the default). Same keys, shapes and values either way.

JSON fields are metadata and are not batched (read them with :func:`cachebuild.format.read_record`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from cachebuild.errors import ConfigError
from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet
from loaders.frame_order import block_order, frame_blocks
from loaders.plan import BatchItems, EpochPlan
from loaders.pools import auto_mix
from loaders.ragged import DEFAULT_BUCKET_BATCHES, bucket_order
from loaders.views.base import ShapesFn, View, array_fields, check_mixing, copy_repeats, field_layout, require_fields
from loaders.views.records_pool import first_pool, pool_fields, read_rows, row_items, shape_mask, write_pool
from loaders.views.store import RecordStore

__all__ = ["RecordsView", "shape_mask"]


POOL_PART = 1024
"""Records per part of a shared pool decode (:mod:`loaders.shared_pools`) in the pooled mode: a frame of
64 KiB holds ~58 token sequences, so a part cuts at most two frames (decoded by both workers) per ~18."""


def _check_bucket(manifest: Manifest, field: str | None, batches: int) -> tuple[str | None, int]:
    """``bucket_by`` must name a varying array field; ``bucket_batches`` a whole number >= 1."""
    if isinstance(batches, bool) or not isinstance(batches, (int, np.integer)) or batches < 1:
        raise ConfigError(f"view 'records': bucket_batches = {batches!r} must be a whole number of batches >= 1")
    if field is None:
        return None, int(batches)
    varying = [f.name for f in array_fields(manifest) if f.varying_axes]
    if field not in varying:
        raise ConfigError(f"view 'records': bucket_by = {field!r} is not a field of varying shape in {manifest.root} (those: {varying or 'none'})")
    return field, int(batches)


def _check_mix(mix: Any, schemas: Sequence[Any], bucket_by: str | None) -> int | None:
    """Records per pool of the pooled mode (``"auto"``: :func:`loaders.pools.auto_mix` of a padded record's bytes), or ``None``."""
    if mix is None:
        return None
    if bucket_by is not None:
        raise ConfigError(f"view 'records': mix = {mix!r} and bucket_by = {bucket_by!r} cannot be combined (pools keep each shared frame's records together; buckets group records by length)")
    whole = isinstance(mix, (int, np.integer)) and not isinstance(mix, bool) and mix >= 1
    if not whole and not (isinstance(mix, str) and mix == "auto"):
        raise ConfigError(f"view 'records': mix must be >= 1 records per pool, 'auto' or None (no pools), got {mix!r}")
    if isinstance(mix, str):
        mix = auto_mix(sum(int(np.prod(f.max_shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize + 8 * f.ndim for f in schemas))
    if not schemas:
        raise ConfigError("view 'records': mix needs at least one array field to batch")
    return check_mixing("records", mix, 1)[0]


class RecordsView(View):
    """One batch row per record; every array field (or those in ``fields``) padded to its max shape."""

    name = "records"

    def __init__(
        self,
        manifest: Manifest,
        batch_size: int,
        fields: Sequence[str] | None = None,
        masks: bool = True,
        bucket_by: str | None = None,
        bucket_batches: int = DEFAULT_BUCKET_BATCHES,
        mix: int | str | None = None,
    ):
        super().__init__(manifest, batch_size)
        schemas = array_fields(manifest)
        if fields is not None:
            require_fields(manifest, fields, self.name)
            wanted = set(fields)
            bad = [f.name for f in manifest.fields if f.name in wanted and f not in schemas]
            if bad:
                raise ValueError(f"view 'records' batches array fields only; {bad} are JSON")
            schemas = [f for f in schemas if f.name in wanted]
        self.schemas = schemas
        self.masks = masks
        self.bucket_by, self.bucket_batches = _check_bucket(manifest, bucket_by, bucket_batches)
        self._sizes: np.ndarray | None = None
        self.mix = _check_mix(mix, schemas, self.bucket_by)
        self.store: RecordStore | None = None
        if self.mix is not None:  # pools of whole members, decoded once and kept padded
            self.store = RecordStore(pool_fields(schemas), self._decode_into, first_pool)  # (loaders.views.records_pool, pool_ahead)
            self.pool_part = POOL_PART  # (workers sharing a pool's decode take parts this large)

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"fields": [f.name for f in self.schemas], "masks": self.masks}
        if self.bucket_by is not None:  # (absent when not asked: states saved before the option still load)
            opts |= {"bucket_by": self.bucket_by, "bucket_batches": self.bucket_batches}
        if self.mix is not None:  # (likewise)
            opts["mix"] = self.mix
        return opts

    def bind(self, shapes: ShapesFn) -> np.ndarray | None:
        if self.bucket_by is not None:  # each record's size of that field, from the index alone
            self._sizes = np.prod(shapes(self.bucket_by), axis=1, dtype=np.int64)
        if self.mix is not None:  # one item per record, so that the plan cuts pools
            return np.ones(len(shapes(self.schemas[0].name)), np.int64)
        return None

    def arrange(self, order: np.ndarray, shards: Callable[[], ShardSet], records: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
        order = super().arrange(order, shards, records, seed, epoch, shuffle)
        if self.mix is not None and shuffle:  # the records of each shared frame together: a pool decodes whole frames
            return block_order(order, self._frame_blocks(shards(), records))
        if self._sizes is None:
            return order
        return bucket_order(order, self._sizes, self.batch_size, self.bucket_batches, seed, epoch, shuffle)

    def _frame_blocks(self, shards: ShardSet, records: int) -> np.ndarray:
        """:func:`loaders.frame_order.frame_blocks` of the largest field, once per cache size (a grown cache: again)."""
        kept = self.__dict__.get("_blocks")
        if kept is None or len(kept) != records:
            largest = max(self.schemas, key=lambda f: int(np.prod(f.max_shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize)
            kept = self.__dict__["_blocks"] = frame_blocks(shards, largest.name)
        return kept

    def decoded_fields(self) -> list[str]:
        return [f.name for f in self.schemas]

    def layout(self) -> Layout:
        B = self.batch_size
        # (a field of one shape is written whole, every row: no fill first; a varying one is zero-padded,
        # except from pools, whose padded rows are copied whole)
        pad = self.mix is None
        keys: dict[str, Field] = {f.name: field_layout(f, B) if f.varying_axes and pad else Field((B,) + tuple(f.max_shape), f.dtype) for f in self.schemas}

        def add(key: str, spec: Field, of: str = "") -> None:
            if key in keys:  # a user's field named record_id, or x_shape next to a varying x
                why = f" (the shape of field {of!r})" if of else ""
                raise ConfigError(
                    f"view 'records': field {key!r} of {self.manifest.root} has the name of a key the view adds{why}: "
                    f"leave it out with fields=[...] (the cache's array fields: {[f.name for f in self.schemas]})"
                )
            keys[key] = spec

        for f in self.schemas:
            if f.varying_axes:
                add(f"{f.name}_shape", Field((B, f.ndim), "int64"), f.name)
                if self.masks:
                    add(f"{f.name}_mask", Field((B,) + tuple(f.max_shape), "bool"), f.name)
        add("record_id", Field((B,), "int64"))
        add("is_pad", Field((B,), "bool"))
        return Layout(keys)

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        if self.store is not None:
            self._assemble_pooled(shards, items, out)
            return
        uniq, first, inv = items.unique, items.first, items.slot
        blocks = read_block(shards, uniq, [f.name for f in self.schemas], self.decode_threads)
        whole: list[str] = []  # keys written for every row here (repeats included)
        for f in self.schemas:
            blk = blocks[f.name]
            if not f.varying_axes:
                blk.scatter(out[f.name], first)
                continue
            shapes = blk.shapes[inv]
            out[f"{f.name}_shape"][...] = shapes
            mask = out[f"{f.name}_mask"] if self.masks else None
            if blk.segments is not None:  # ragged 1-d: the mask of the lengths (written here) is also where the data goes
                mask = self._scratch_mask(f.name, f.max_shape) if mask is None else mask
                blk.segments.fill_masked(out[f.name], inv, mask)
                whole.append(f.name)
                continue
            blk.scatter(out[f.name], first)
            if mask is not None:
                shape_mask(shapes, f.max_shape, mask)
        copy_repeats(out, first, inv, [f.name for f in self.schemas if f.name not in whole])
        out["record_id"][...] = items.records
        out["is_pad"][...] = items.is_pad

    def _decode_into(self, shards: ShardSet, ids: np.ndarray, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        """Decode records ``ids`` into the store's rows ``dest`` (:func:`loaders.views.records_pool.write_pool`)."""
        write_pool(read_block(shards, ids, [f.name for f in self.schemas], self.decode_threads), self.schemas, arrays, dest)

    def assemble_batch(self, shards: ShardSet, plan: EpochPlan, b: int, out: dict[str, np.ndarray]) -> None:
        if self.store is None or plan.pools is None:
            super().assemble_batch(shards, plan, b, out)
            return
        self._assemble_pooled(shards, row_items(plan, b), out)

    def _assemble_pooled(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        """A batch of a pooled plan: each row its record's, read from the store, zero outside the record's shape."""
        assert self.store is not None, "a pooled view has a store"
        arrays, where = self.store.rows(shards, items)
        try:
            read_rows(arrays, where[items.slot], self.schemas, out, lambda f: out[f"{f.name}_mask"] if self.masks else self._scratch_mask(f.name, f.max_shape))
        finally:
            self.store.finish_batch()  # shared pools this batch read may be reused
        out["record_id"][...] = items.records
        out["is_pad"][...] = items.is_pad

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_scratch", None)  # scratch arrays stay in their process
        state.pop("_blocks", None)  # (and the frame blocks: computed again where needed)
        return state

    def _scratch_mask(self, name: str, max_shape: Sequence[int]) -> np.ndarray:
        """A reused bool ``[B, *max_shape]`` for a ragged field's lengths when the batch has no mask key."""
        scratch: dict[str, np.ndarray] = self.__dict__.setdefault("_scratch", {})
        if name not in scratch:
            scratch[name] = np.empty((self.batch_size,) + tuple(max_shape), bool)
        return scratch[name]
