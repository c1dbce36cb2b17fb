"""The ``graphs`` view of a causal cache: one batch row per graph, padded to the cache's max sizes.

Batch keys (``B`` batch size; ``N`` max nodes, ``K`` max interventions, ``S``
base rows, all from the manifest's max shapes, so shapes never change):

==============  =====================  =========================================================
key             shape, dtype           meaning
==============  =====================  =========================================================
``adj``         ``[B, N, N]`` uint8    adjacency, zero outside ``n x n``
``base``        ``[B, S, N]`` float32  observational rows, zero on padded nodes
``int``         ``[B, K, S, N]`` f32   intervened (twin) worlds, zero on padded nodes/interventions
``delta``       ``[B, K, S, N]`` f32   ``int - base``, zero on padding
``targets``     ``[B, K]`` int16       intervened node per intervention, ``-1`` on padding
``values``      ``[B, K]`` float32     intervention value ``c``, zero on padding
``node_mask``   ``[B, N]`` bool        node ``j < n``
``int_mask``    ``[B, K]`` bool        intervention ``k`` < the graph's count
``n``           ``[B]`` int64          nodes of the graph
``num_int``     ``[B]`` int64          interventions of the graph
``record_id``   ``[B]`` int64          the graph's record id in the cache
``is_pad``      ``[B]`` bool           a repeat that fills the epoch's last batches
==============  =====================  =========================================================

``fields`` adds or removes stored fields (e.g. ``weights``, ``noise_scale``;
each padded the same way). ``delta="computed"`` skips decompressing the stored
``delta`` and computes ``int - base`` in float32 instead (bit-identical for
caches whose delta is defined so, as the causal generator's is; about 40% less
zstd work); ``"auto"`` (default) does so for causal caches.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet
from loaders.plan import BatchItems
from loaders.views.base import View, copy_repeats, field_layout, pad_mask, require_fields, resolve_delta, subtract_into

__all__ = ["GraphsView", "DEFAULT_GRAPH_FIELDS"]

DEFAULT_GRAPH_FIELDS = ("adj", "base", "int", "delta", "targets", "values")


class GraphsView(View):
    """One row per graph, padded to max n and max K, with node and intervention masks."""

    name = "graphs"

    def __init__(self, manifest: Manifest, batch_size: int, fields: Sequence[str] = DEFAULT_GRAPH_FIELDS, delta: str = "auto"):
        super().__init__(manifest, batch_size)
        delta = resolve_delta(manifest, delta)
        require_fields(manifest, ("adj", "targets"), self.name)
        require_fields(manifest, fields, self.name)
        if delta == "computed":
            require_fields(manifest, ("int", "base"), self.name)
        self.fields = list(dict.fromkeys(fields))
        self.delta = delta
        self.n_max = manifest.schema("adj").max_shape[0]
        self.k_max = manifest.schema("targets").max_shape[0]

    def options(self) -> dict[str, Any]:
        return {"fields": self.fields, "delta": self.delta}

    def _decoded(self) -> list[str]:
        names = list(self.fields)
        if self.delta == "computed" and "delta" in names:
            names.remove("delta")
            names += [n for n in ("int", "base") if n not in names]
        return list(dict.fromkeys(names + ["adj", "targets"]))

    def decoded_fields(self) -> list[str]:
        return self._decoded()

    def layout(self) -> Layout:
        B = self.batch_size
        keys: dict[str, Field] = {}
        for name in self.fields:
            f = field_layout(self.manifest.schema(name), B)
            if name == "targets":
                f = Field(f.shape, f.dtype, -1)
            elif name == "delta" and self.delta == "computed":
                f = Field(f.shape, f.dtype)  # assemble writes every element
            keys[name] = f
        keys["node_mask"] = Field((B, self.n_max), "bool")
        keys["int_mask"] = Field((B, self.k_max), "bool")
        keys["n"] = Field((B,), "int64")
        keys["num_int"] = Field((B,), "int64")
        keys["record_id"] = Field((B,), "int64")
        keys["is_pad"] = Field((B,), "bool")
        return Layout(keys)

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        uniq, first, inv = items.unique, items.first, items.slot
        blocks = read_block(shards, uniq, self._decoded(), self.decode_threads)
        n = blocks["adj"].shapes[inv, 0]
        k = blocks["targets"].shapes[inv, 0]
        pad_mask(n, self.n_max, out["node_mask"])
        pad_mask(k, self.k_max, out["int_mask"])
        filled: dict[str, np.ndarray] = {}
        for name in self._decoded():
            if name in out:
                filled[name] = out[name]
            elif self.delta == "computed" and name in ("int", "base"):
                schema = self.manifest.schema(name)
                filled[name] = np.zeros((self.batch_size,) + tuple(schema.max_shape), schema.dtype)
            else:
                continue  # decoded for its shapes only
            blocks[name].scatter(filled[name], first)
        copy_repeats(filled, first, inv, list(filled))
        if self.delta == "computed" and "delta" in out:
            # int and base are zero on padded nodes (0 - 0 = +0.0); padded interventions are zeroed after:
            # a plain subtract and a masked zero cost 30% less than a subtract with ``where``
            subtract_into(filled["int"], filled["base"][:, None], out["delta"])
            out["delta"][~out["int_mask"]] = 0
        out["n"][...] = n
        out["num_int"][...] = k
        out["record_id"][...] = items.records
        out["is_pad"][...] = items.is_pad
