"""The ``twins`` view of a causal cache: one batch row per (graph, intervention k, row j).

A graph with K interventions and S base rows yields K*S twin rows (a default
graph: about 15 x 64 = 960). The plan works on graphs (their row counts come
from the index shapes, no decoding): a batch holds consecutive rows of the
epoch's graph order, so it decodes only the few graphs it spans (about
``B / 960 + 1``), and its rows are mixed across those graphs by a
deterministic in-batch permutation.

Row ``i`` of a batch is graph ``g``, intervention ``k``, row ``j``. Shapes use
``B`` batch size, ``N`` max nodes, ``K`` max interventions and ``S`` rows per
world (from the manifest, so they never change), ``G`` the most graphs one
batch can span.

Default keys (a drop-in for a trainer that consumed per-row dicts):

=================  ===================  ==================================================
key                shape, dtype         meaning
=================  ===================  ==================================================
``base_samples``   ``[B, S, N]`` f32    the graph's base (observational) rows
``int_samples``    ``[B, S, N]`` f32    the rows of intervened world k (twin of base)
``target_row``     ``[B, N]`` f32       base row j
``int_row``        ``[B, N]`` f32       row j of world k
``delta``          ``[B, N]`` f32       ``int_row - target_row``
``int_mask``       ``[B, N]`` f32       one-hot of the intervened node
``int_node_idx``   ``[B]`` int64        the intervened node
``value``          ``[B]`` f32          the intervention value c
``adj``            ``[B, N, N]`` f32    adjacency of the graph (0/1)
``node_mask``      ``[B, N]`` bool      node < n
``n``              ``[B]`` int64        nodes of the graph
``graph_id``       ``[B]`` int64        the graph's record id
``int_index``      ``[B]`` int64        k
``row_index``      ``[B]`` int64        j
``is_pad``         ``[B]`` bool         a repeat that fills the epoch's last batches
=================  ===================  ==================================================

``compact=True`` sends each graph's context once per batch instead of once per
row (a batch of 4096 rows then moves about 40x fewer bytes to the GPU):
the per-row keys ``target_row, int_row, delta, int_mask, int_node_idx, value,
int_index, row_index, is_pad`` plus ``graph_index`` int64 ``[B]`` (slot of the
row's graph in the context arrays) and the context ``ctx_base [G, S, N]``,
``ctx_int [G, K, S, N]``, ``ctx_adj [G, N, N]`` f32, ``ctx_node_mask [G, N]``
bool, ``ctx_n [G]`` int64, ``ctx_record_id [G]`` int64 (-1 in unused slots),
``ctx_mask [G]`` bool. :func:`expand_compact` rebuilds the default keys from
it on the GPU (``base_samples = ctx_base[graph_index]``, ...).

``delta="computed"`` takes ``int_row - target_row`` (float32, bit-identical
to the stored delta of a causal cache) instead of decompressing ``delta``;
``"auto"`` (default) does so for causal caches, ``"stored"`` reads the field.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from loaders.blockread import read_block
from loaders.shards import ShardSet
from loaders.plan import BatchItems
from loaders.views.base import ShapesFn, View, pad_mask, require_fields, resolve_delta

__all__ = ["TwinsView", "expand_compact", "max_graphs_per_batch"]

_ROW_KEYS = ("target_row", "int_row", "delta", "int_mask", "int_node_idx", "value", "int_index", "row_index")


def max_graphs_per_batch(items_per_graph: np.ndarray, batch_size: int) -> int:
    """The most distinct graphs ``batch_size`` consecutive rows of the (cyclic) row stream can touch."""
    pos = np.asarray(items_per_graph)[np.asarray(items_per_graph) > 0]
    if pos.size == 0:
        return 1
    return int(min(pos.size, -(-(batch_size - 1) // int(pos.min())) + 1))


class TwinsView(View):
    """Twin rows of a causal cache, planned by graph, mixed within batches; ``compact`` context once per graph."""

    name = "twins"

    def __init__(self, manifest: Manifest, batch_size: int, compact: bool = False, delta: str = "auto"):
        super().__init__(manifest, batch_size)
        delta = resolve_delta(manifest, delta)
        need = ["adj", "base", "int", "targets", "values"] + (["delta"] if delta == "stored" else [])
        require_fields(manifest, need, self.name)
        base = manifest.schema("base")
        if base.min_shape[:1] != base.max_shape[:1]:
            raise ValueError(f"view 'twins' needs the same number of base rows in every graph; cache has {base.min_shape[0]}..{base.max_shape[0]}")
        self.compact = compact
        self.delta = delta
        self.n_max = manifest.schema("adj").max_shape[0]
        self.k_max = manifest.schema("targets").max_shape[0]
        self.s = base.max_shape[0]
        self.g_max: int | None = None
        self._decode = need

    def options(self) -> dict[str, Any]:
        return {"compact": self.compact, "delta": self.delta}

    def bind(self, shapes: ShapesFn) -> np.ndarray:
        ints = shapes("int")
        if len(ints) and (ints[:, 1] != self.s).any():
            bad = int(np.flatnonzero(ints[:, 1] != self.s)[0])
            raise ValueError(f"view 'twins': record {bad} has {int(ints[bad, 1])} rows per intervened world, base has {self.s}")
        items = ints[:, 0] * self.s if len(ints) else np.zeros(0, np.int64)
        self.g_max = max_graphs_per_batch(items, self.batch_size)
        return items

    def layout(self) -> Layout:
        if self.g_max is None:
            raise RuntimeError("TwinsView.layout() needs bind() first (the stream calls it)")
        B, N, K, S, G = self.batch_size, self.n_max, self.k_max, self.s, self.g_max
        f32 = "float32"
        keys = {
            "target_row": Field((B, N), f32),
            "int_row": Field((B, N), f32),
            "delta": Field((B, N), f32),
            "int_mask": Field((B, N), f32, 0),
            "int_node_idx": Field((B,), "int64"),
            "value": Field((B,), f32),
            "int_index": Field((B,), "int64"),
            "row_index": Field((B,), "int64"),
        }
        if self.compact:
            keys.update(
                graph_index=Field((B,), "int64"),
                ctx_base=Field((G, S, N), f32, 0),
                ctx_int=Field((G, K, S, N), f32, 0),
                ctx_adj=Field((G, N, N), f32, 0),
                ctx_node_mask=Field((G, N), "bool", False),
                ctx_n=Field((G,), "int64", 0),
                ctx_record_id=Field((G,), "int64", -1),
                ctx_mask=Field((G,), "bool", False),
            )
        else:
            keys.update(
                base_samples=Field((B, S, N), f32),
                int_samples=Field((B, S, N), f32),
                adj=Field((B, N, N), f32),
                node_mask=Field((B, N), "bool"),
                n=Field((B,), "int64"),
                graph_id=Field((B,), "int64"),
            )
        keys["is_pad"] = Field((B,), "bool")
        return Layout(keys)

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        S, K, N, B = self.s, self.k_max, self.n_max, self.batch_size
        uniq, inv = items.unique, items.slot
        G = len(uniq)
        if G > self.g_max:
            raise RuntimeError(f"batch {items.index} spans {G} graphs, more than the planned {self.g_max}")
        blocks = read_block(shards, uniq, self._decode, self.decode_threads)
        if self.compact:
            cbase, cint, cadj = out["ctx_base"], out["ctx_int"], out["ctx_adj"]
        else:
            cbase, cint, cadj = np.zeros((G, S, N), np.float32), np.zeros((G, K, S, N), np.float32), np.zeros((G, N, N), np.float32)
        blocks["base"].scatter(cbase)
        blocks["int"].scatter(cint)
        blocks["adj"].scatter(cadj)
        ctgt = np.zeros((G, K), np.int64)
        cval = np.zeros((G, K), np.float32)
        blocks["targets"].scatter(ctgt)
        blocks["values"].scatter(cval)
        n = blocks["adj"].shapes[:, 0]
        k = items.items // S
        j = items.items - k * S
        world = inv * K + k  # (graph slot, intervention) as one index
        np.take(cbase.reshape(-1, N), inv * S + j, axis=0, out=out["target_row"], mode="clip")
        np.take(cint.reshape(-1, N), world * S + j, axis=0, out=out["int_row"], mode="clip")
        if self.delta == "stored":
            cdel = np.zeros((G, K, S, N), np.float32)
            blocks["delta"].scatter(cdel)
            np.take(cdel.reshape(-1, N), world * S + j, axis=0, out=out["delta"], mode="clip")
        else:
            np.subtract(out["int_row"], out["target_row"], out=out["delta"])
        node = ctgt.reshape(-1)[world]
        out["int_node_idx"][...] = node
        out["int_mask"][np.arange(B), node] = 1.0
        out["value"][...] = cval.reshape(-1)[world]
        out["int_index"][...] = k
        out["row_index"][...] = j
        out["is_pad"][...] = items.is_pad
        if self.compact:
            out["graph_index"][...] = inv
            pad_mask(n, N, out["ctx_node_mask"][:G])
            out["ctx_n"][:G] = n
            out["ctx_record_id"][:G] = uniq
            out["ctx_mask"][:G] = True
        else:
            np.take(cbase, inv, axis=0, out=out["base_samples"], mode="clip")
            np.take(cint.reshape(-1, S, N), world, axis=0, out=out["int_samples"], mode="clip")
            np.take(cadj, inv, axis=0, out=out["adj"], mode="clip")
            pad_mask(n[inv], N, out["node_mask"])
            out["n"][...] = n[inv]
            out["graph_id"][...] = items.records


def expand_compact(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The default (per-row) twins keys from a ``compact=True`` batch, by indexing (works on GPU tensors).

    ``base_samples = ctx_base[graph_index]``, ``int_samples = ctx_int[graph_index, int_index]``,
    ``adj``, ``node_mask``, ``n`` likewise, ``graph_id = ctx_record_id[graph_index]``;
    the per-row keys pass through.
    """
    g = batch["graph_index"]
    out = {k: batch[k] for k in _ROW_KEYS + ("is_pad",)}
    out["base_samples"] = batch["ctx_base"][g]
    out["int_samples"] = batch["ctx_int"][g, batch["int_index"]]
    out["adj"] = batch["ctx_adj"][g]
    out["node_mask"] = batch["ctx_node_mask"][g]
    out["n"] = batch["ctx_n"][g]
    out["graph_id"] = batch["ctx_record_id"][g]
    return out
