"""The generic ``records`` view: any cache's array fields, stacked, varying ones padded with masks.

Batch keys (``B`` = batch size, ``M`` = the field's max shape from the manifest):

* ``<field>``: ``[B, *M]`` of the field's dtype, zero beyond each record's shape;
* ``<field>_shape``: int64 ``[B, ndim]``, each record's shape (varying fields only);
* ``<field>_mask``: bool ``[B, *M]``, true inside the record's shape (varying fields, ``masks=True``);
* ``record_id``: int64 ``[B]``; ``is_pad``: bool ``[B]`` (a repeat that fills the epoch's last batches).

JSON fields are metadata and are not batched (read them with :func:`cachebuild.format.read_record`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from cachebuild.errors import ConfigError
from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet
from loaders.plan import BatchItems
from loaders.views.base import View, array_fields, copy_repeats, field_layout, require_fields

__all__ = ["RecordsView", "shape_mask"]


def shape_mask(shapes: np.ndarray, max_shape: Sequence[int], out: np.ndarray) -> None:
    """``out[i, j0, j1, ...] = all(j_d < shapes[i, d])``, vectorised over the batch."""
    out[...] = True
    nd = len(max_shape)
    for d, m in enumerate(max_shape):
        idx = np.arange(m).reshape((1,) + (1,) * d + (m,) + (1,) * (nd - d - 1))
        out &= idx < shapes[:, d].reshape((-1,) + (1,) * nd)


class RecordsView(View):
    """One batch row per record; every array field (or those in ``fields``) padded to its max shape."""

    name = "records"

    def __init__(self, manifest: Manifest, batch_size: int, fields: Sequence[str] | None = None, masks: bool = True):
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

    def options(self) -> dict[str, Any]:
        return {"fields": [f.name for f in self.schemas], "masks": self.masks}

    def decoded_fields(self) -> list[str]:
        return [f.name for f in self.schemas]

    def layout(self) -> Layout:
        B = self.batch_size
        keys: dict[str, Field] = {f.name: field_layout(f, B) for f in self.schemas}

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
        uniq, first, inv = items.unique, items.first, items.slot
        blocks = read_block(shards, uniq, [f.name for f in self.schemas], self.decode_threads)
        for f in self.schemas:
            blk = blocks[f.name]
            blk.scatter(out[f.name], first)
            if f.varying_axes:
                shapes = blk.shapes[inv]
                out[f"{f.name}_shape"][...] = shapes
                if self.masks:
                    shape_mask(shapes, f.max_shape, out[f"{f.name}_mask"])
        copy_repeats(out, first, inv, [f.name for f in self.schemas])
        out["record_id"][...] = items.records
        out["is_pad"][...] = items.is_pad
