"""The ``twins`` view of a causal cache: one batch row per (graph, intervention k, row j).

A graph with K interventions and S base rows yields K*S twin rows (a default
graph: about 15 x 64 = 960). The plan works on graphs (their row counts come
from the index shapes, no decoding) and mixes rows across graphs: the epoch's
graph order is cut into pools of ``mix`` graphs (default 1,024) whose rows,
in chunks of ``chunk`` consecutive rows of one world (default: 8 up to
B=4,096, then doubled so a batch holds at most 512 chunks: 32 at B=16,384;
:func:`auto_twin_chunk`), are permuted together (:mod:`loaders.pools`), so a
batch spans about 400 graphs at any batch size (``chunk=1``: about 1,000 at
B=4,096; ``mix=None``: consecutive rows, about ``B / (K*S) + 1`` graphs). Each process keeps the graphs of the current
pool decoded (:mod:`loaders.views.store`, about 55 KB per graph padded to
the cache's max K and n, so ~55 MB per 1,024 graphs, x2 at a pool boundary)
and decodes each graph once per epoch.

Row ``i`` of a batch is graph ``g``, intervention ``k``, row ``j``. Shapes use
``B`` batch size, ``N`` max nodes, ``K`` max interventions and ``S`` rows per
world (from the manifest, so they never change), ``G`` the most graphs one
batch can span.

Default keys (a drop-in for a trainer that consumed per-row dicts, as the users' 2026-01-06
``CausalDataset`` yielded them; their 2026-01-15 collate gives ``base_samples`` and
``int_samples`` as the row itself, ``[B, N]``: take ``target_row`` and ``int_row`` for those):

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
row, and each intervened world once: the per-row keys ``target_row, int_row,
delta, int_mask, int_node_idx, value, int_index, row_index, is_pad`` plus
``graph_index`` int64 ``[B]`` (slot of the row's graph in the graph context)
and ``world_index`` int64 ``[B]`` (slot of the row's (graph, k) world), the
graph context ``ctx_base [G, S, N]``, ``ctx_adj [G, N, N]`` f32,
``ctx_node_mask [G, N]`` bool, ``ctx_n [G]`` int64, ``ctx_record_id [G]``
int64 (-1 in unused slots), ``ctx_mask [G]`` bool, and the world context
``ctx_int [V, S, N]`` f32 (``G`` the most graphs and ``V`` the most worlds one
batch can span: 513 each at the defaults, ``chunk=8``, B=4096). A mixed batch
then moves about 6x fewer bytes than the default keys (with ``mix=None``,
about 40x). :func:`expand_compact` rebuilds the default keys from it on the
GPU (``base_samples = ctx_base[graph_index]``,
``int_samples = ctx_int[world_index]``, ...).

``compact="pool"`` sends no context at all: each row says where its graph lies in the
epoch's mixing pools, and a :class:`loaders.twins_context.TwinsContext` in the consumer
process holds the decoded pools (read from the cache there, each once per epoch) and
rebuilds the default keys from them on the device. Keys (the rows, their order and mixing
are those of the other modes): ``pool`` int32 ``[B]`` (the pool of the row's graph),
``pool_index`` int32 ``[B]`` (the graph's place in its pool: record id
``plan.pool_records(pool)[pool_index]``), ``int_index``, ``row_index`` int32 ``[B]``,
``is_pad`` bool ``[B]`` and ``plan`` int64 ``[3]``: the plan's fingerprint
(:meth:`loaders.plan.EpochPlan.fingerprint`), the epoch and the global batch number, so
the consumer finds the pools. 17 bytes per row instead of ~900; needs a mixed plan
(``shuffle=True``, ``mix`` set).

``delta="computed"`` takes ``int_row - target_row`` (float32, bit-identical
to the stored delta of a causal cache) instead of decompressing ``delta``;
``"auto"`` (default) does so for causal caches, ``"stored"`` reads the field.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet
from loaders.plan import BatchItems, EpochPlan
from loaders.pools import distinct
from loaders.pools import DEFAULT_MIX, chunk_lengths, max_records_per_batch
from loaders.views.base import ShapesFn, View, check_mixing, pad_mask, require_fields, resolve_delta
from loaders.views.store import Dense, RecordStore
from loaders.views.twins_regions import WORLDS, clear_stale

__all__ = ["TwinsView", "expand_compact", "max_graphs_per_batch", "max_worlds_per_batch", "DEFAULT_TWIN_CHUNK", "auto_twin_chunk", "decode_twins", "POOL_KEYS"]

_ROW_KEYS = ("target_row", "int_row", "delta", "int_mask", "int_node_idx", "value", "int_index", "row_index")

DEFAULT_TWIN_CHUNK = 8
TWIN_CHUNKS_PER_BATCH = 512
_NO_POOLS = "view 'twins': compact='pool' needs a mixed plan (shuffle=True and mix set); this plan has no pools"
POOL_KEYS = ("pool", "pool_index", "int_index", "row_index", "is_pad", "plan")
"""The keys of a ``compact="pool"`` batch."""


def auto_twin_chunk(batch_size: int, rows: int) -> int:
    """The default ``chunk`` of the twins view: the smallest power of two >= 8 that cuts a batch into at
    most 512 chunks (B=4096: 8; B=16384: 32), at most ``rows`` (one world). A batch then spans about 400
    graphs of a 1,024-graph pool at any batch size, while its compact context stays bounded
    (at most ~513 graphs and worlds) instead of growing to the whole pool with the batch."""
    chunk = DEFAULT_TWIN_CHUNK
    while batch_size > chunk * TWIN_CHUNKS_PER_BATCH and chunk * 2 <= max(rows, DEFAULT_TWIN_CHUNK):
        chunk *= 2
    return chunk


"""Consecutive rows of one world kept together in a mixed plan (divides the 64 rows per world)."""


def max_graphs_per_batch(items_per_graph: np.ndarray, batch_size: int, chunk: int = 1) -> int:
    """The most distinct graphs ``batch_size`` consecutive rows of the (cyclic) row stream can touch,
    when that stream is cut from runs of at most ``chunk`` rows of one graph (or whole graphs)."""
    return max_records_per_batch(items_per_graph, batch_size, chunk)


def max_worlds_per_batch(items_per_graph: np.ndarray, batch_size: int, rows: int, chunk: int = 1) -> int:
    """The most distinct (graph, k) worlds of ``rows`` rows each that one batch can touch, record after
    record (``ceil((B-1)/rows) + 1``) or as chunks of at most ``chunk`` rows starting at multiples of
    ``chunk`` (each within one world when ``chunk`` divides ``rows``, else ``1 + ceil((chunk-1)/rows)``)."""
    items = np.asarray(items_per_graph, dtype=np.int64)
    worlds = int(items.sum()) // max(rows, 1)
    if worlds == 0:
        return 1
    _, shortest = chunk_lengths(items, chunk)
    runs = -(-(batch_size - 1) // int(shortest)) + 1
    per_run = 1 if rows % chunk == 0 else 1 + -(-(chunk - 1) // rows)  # chunks start at multiples of chunk
    mixed = runs * per_run
    plain = -(-(batch_size - 1) // rows) + 1
    return int(min(worlds, batch_size, max(mixed, plain)))


def decode_twins(shards: ShardSet, ids: np.ndarray, fields: list[str], threads: int, arrays: dict[str, np.ndarray], dest: np.ndarray, zero: list[str] | None = None) -> None:
    """Decode the graphs ``ids`` into the padded ``arrays[name][dest]``: ``fields`` (``delta`` among them when it
    is read) and ``n``, the nodes of each graph. ``zero=None``: the rows are zero before; else the padded fields
    ``zero`` are cleared of what the rows' last graphs left (:mod:`loaders.views.twins_regions`; ``arrays`` then
    hold each row's ``K`` too). Read in record order (the frames of a shard then come in runs, handed to zstd
    without an object per frame; the same bytes land in the same rows)."""
    order = np.argsort(ids, kind="stable")
    ids, dest = ids[order], dest[order]
    blocks = read_block(shards, ids, fields, threads)
    n, k = blocks["adj"].shapes[:, 0], blocks["int"].shapes[:, 0]
    if zero is not None:
        clear_stale(arrays, dest, n, k, zero)
    for name in fields:
        blocks[name].scatter(arrays[name], dest)
    arrays["n"][dest] = n
    if zero is not None:
        arrays[WORLDS][dest] = k


class TwinsView(View):
    """Twin rows of a causal cache, mixed across a pool of graphs; ``compact`` context once per graph and world."""

    name = "twins"

    def __init__(self, manifest: Manifest, batch_size: int, compact: bool | str = False, delta: str = "auto", mix: int | None = DEFAULT_MIX, chunk: int | None = None):
        super().__init__(manifest, batch_size)
        delta = resolve_delta(manifest, delta)
        need = ["adj", "base", "int", "targets", "values"] + (["delta"] if delta == "stored" else [])
        require_fields(manifest, need, self.name)
        base = manifest.schema("base")
        self.mix, self.chunk = check_mixing(self.name, mix, auto_twin_chunk(batch_size, base.max_shape[0]) if chunk is None else chunk)
        if base.min_shape[:1] != base.max_shape[:1]:
            raise ValueError(f"view 'twins' needs the same number of base rows in every graph; cache has {base.min_shape[0]}..{base.max_shape[0]}")
        if not isinstance(compact, (bool, np.bool_)) and compact != "pool":
            raise ValueError(f"view 'twins': compact must be True, False or 'pool', got {compact!r}")
        if compact == "pool" and self.mix is None:
            raise ValueError("view 'twins': compact='pool' needs mixing pools (mix=None has none)")
        self.compact: bool | str = "pool" if compact == "pool" else bool(compact)
        self.delta = delta
        self.n_max = manifest.schema("adj").max_shape[0]
        self.k_max = manifest.schema("targets").max_shape[0]
        self.s = base.max_shape[0]
        self.g_max: int | None = None
        self.w_max: int | None = None
        self._decode = need
        S, K, N = self.s, self.k_max, self.n_max
        dense = {
            "base": Dense((S, N), "float32"),
            "int": Dense((K, S, N), "float32"),
            "adj": Dense((N, N), "float32"),
            "targets": Dense((K,), "int64", False),
            "values": Dense((K,), "float32", False),
            "n": Dense((), "int64", False),
        }
        if delta == "stored":
            dense["delta"] = Dense((K, S, N), "float32")
        self.fields = dense
        self.store: RecordStore | None = None if self.compact == "pool" else RecordStore(dense, self._decode_into)  # pool: decoded by the consumer

    def options(self) -> dict[str, Any]:
        return {"compact": self.compact, "delta": self.delta, "mix": self.mix, "chunk": self.chunk}

    def decoded_fields(self) -> list[str]:
        return [] if self.compact == "pool" else list(self._decode)

    def bind(self, shapes: ShapesFn) -> np.ndarray:
        ints = shapes("int")
        if len(ints) and (ints[:, 1] != self.s).any():
            bad = int(np.flatnonzero(ints[:, 1] != self.s)[0])
            raise ValueError(f"view 'twins': record {bad} has {int(ints[bad, 1])} rows per intervened world, base has {self.s}")
        items = ints[:, 0] * self.s if len(ints) else np.zeros(0, np.int64)
        self.g_max = max_graphs_per_batch(items, self.batch_size, self.chunk)
        self.w_max = max_worlds_per_batch(items, self.batch_size, self.s, self.chunk)
        return items

    def layout(self) -> Layout:
        if self.g_max is None or self.w_max is None:
            raise RuntimeError("TwinsView.layout() needs bind() first (the stream calls it)")
        B, N, S, G, V = self.batch_size, self.n_max, self.s, self.g_max, self.w_max
        f32 = "float32"
        if self.compact == "pool":
            kinds = ("int32", "int32", "int32", "int32", "bool")
            return Layout({**{k: Field((B,), d) for k, d in zip(POOL_KEYS, kinds)}, "plan": Field((3,), "int64")})
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
                world_index=Field((B,), "int64"),
                # the context keys are written whole by _compact_context (used slots, then the rest)
                ctx_base=Field((G, S, N), f32),
                ctx_int=Field((V, S, N), f32),
                ctx_adj=Field((G, N, N), f32),
                ctx_node_mask=Field((G, N), "bool"),
                ctx_n=Field((G,), "int64"),
                ctx_record_id=Field((G,), "int64"),
                ctx_mask=Field((G,), "bool"),
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

    def _decode_into(self, shards: ShardSet, ids: np.ndarray, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        decode_twins(shards, ids, self._decode, self.decode_threads, arrays, dest)

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        if self.store is None:
            return self._pool_rows(items, out)
        G = len(items.unique)
        if self.g_max is None or G > self.g_max:
            raise RuntimeError(f"batch {items.index} spans {G} graphs, more than the planned {self.g_max}")
        graphs, where = self.store.rows(shards, items)
        try:
            self._gather(graphs, where, items, out)
        finally:
            self.store.finish_batch()  # shared pools this batch read may be reused

    def assemble_batch(self, shards: ShardSet, plan: EpochPlan, b: int, out: dict[str, np.ndarray]) -> None:
        if self.store is not None:
            return super().assemble_batch(shards, plan, b, out)
        if plan.pools is None:
            raise ValueError(_NO_POOLS)
        pool, place, items, is_pad = plan.pool_rows(b)  # the rows of plan.batch(b), without its distinct records
        self._write_pool_rows(pool, place, items, is_pad, out)
        out["plan"][...] = (plan.fingerprint(), plan.epoch, b)

    def _pool_rows(self, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        """A ``compact="pool"`` batch from its items: where each row's graph lies in the pools, nothing decoded."""
        if items.pool is None or items.pool_index is None:
            raise ValueError(_NO_POOLS)
        self._write_pool_rows(items.pool[items.slot], items.pool_index[items.slot], items.items, items.is_pad, out)
        out["plan"][...] = (items.plan_id, items.plan_key[1], items.index)  # plan_key: (seed, epoch, ...)

    def _write_pool_rows(self, pool: np.ndarray, place: np.ndarray, items: np.ndarray, is_pad: np.ndarray, out: dict[str, np.ndarray]) -> None:
        k = items // self.s
        out["pool"][...] = pool
        out["pool_index"][...] = place
        out["int_index"][...] = k
        out["row_index"][...] = items - k * self.s
        out["is_pad"][...] = is_pad

    def _gather(self, graphs: dict[str, np.ndarray], where: np.ndarray, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        """Fill the batch's keys from the decoded graphs (``where[g]``: the row of ``items.unique[g]``)."""
        S, K, N, B = self.s, self.k_max, self.n_max, self.batch_size
        uniq, inv = items.unique, items.slot
        G = len(uniq)
        row = where[inv]  # each batch row's graph in the decoded arrays
        k = items.items // S
        j = items.items - k * S
        world = row * K + k  # (decoded graph, intervention) as one index
        np.take(graphs["base"].reshape(-1, N), row * S + j, axis=0, out=out["target_row"], mode="clip")
        np.take(graphs["int"].reshape(-1, N), world * S + j, axis=0, out=out["int_row"], mode="clip")
        if self.delta == "stored":
            np.take(graphs["delta"].reshape(-1, N), world * S + j, axis=0, out=out["delta"], mode="clip")
        else:
            np.subtract(out["int_row"], out["target_row"], out=out["delta"])
        node = graphs["targets"].reshape(-1)[world]
        out["int_node_idx"][...] = node
        out["int_mask"][np.arange(B), node] = 1.0
        out["value"][...] = graphs["values"].reshape(-1)[world]
        out["int_index"][...] = k
        out["row_index"][...] = j
        out["is_pad"][...] = items.is_pad
        n = graphs["n"][where]
        if self.compact:
            self._compact_context(graphs, where, inv * K + k, n, out)
            out["graph_index"][...] = inv
            out["ctx_record_id"][:G] = uniq
            out["ctx_record_id"][G:] = -1
        else:
            np.take(graphs["base"], row, axis=0, out=out["base_samples"], mode="clip")
            np.take(graphs["int"].reshape(-1, S, N), world, axis=0, out=out["int_samples"], mode="clip")
            np.take(graphs["adj"], row, axis=0, out=out["adj"], mode="clip")
            pad_mask(n[inv], N, out["node_mask"])
            out["n"][...] = n[inv]
            out["graph_id"][...] = items.records

    def _compact_context(self, graphs: dict[str, np.ndarray], where: np.ndarray, slot_world: np.ndarray, n: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Each graph of the batch once (slots in ``items.unique`` order) and each (graph, k) world once."""
        G, K, N = len(where), self.k_max, self.n_max
        if self.w_max is None:
            raise RuntimeError("TwinsView needs bind() first")
        worlds, world_index = distinct(slot_world)
        if len(worlds) > self.w_max:
            raise RuntimeError(f"batch spans {len(worlds)} worlds, more than the planned {self.w_max}")
        np.take(graphs["base"], where, axis=0, out=out["ctx_base"][:G], mode="clip")
        np.take(graphs["adj"], where, axis=0, out=out["ctx_adj"][:G], mode="clip")
        src = where[worlds // K] * K + worlds % K
        np.take(graphs["int"].reshape(-1, self.s, N), src, axis=0, out=out["ctx_int"][: len(worlds)], mode="clip")
        out["ctx_int"][len(worlds) :] = 0
        out["world_index"][...] = world_index.reshape(-1)
        pad_mask(n, N, out["ctx_node_mask"][:G])
        out["ctx_n"][:G] = n
        out["ctx_mask"][:G] = True
        for key in ("ctx_base", "ctx_adj", "ctx_node_mask", "ctx_n", "ctx_mask"):  # unused slots
            out[key][G:] = 0


def expand_compact(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The default (per-row) twins keys from a ``compact=True`` batch, by indexing (works on GPU tensors).

    ``base_samples = ctx_base[graph_index]``, ``int_samples = ctx_int[world_index]``,
    ``adj``, ``node_mask``, ``n`` likewise, ``graph_id = ctx_record_id[graph_index]``;
    the per-row keys pass through.
    """
    g = batch["graph_index"]
    out = {k: batch[k] for k in _ROW_KEYS + ("is_pad",)}
    out["base_samples"] = batch["ctx_base"][g]
    out["int_samples"] = batch["ctx_int"][batch["world_index"]]
    out["adj"] = batch["ctx_adj"][g]
    out["node_mask"] = batch["ctx_node_mask"][g]
    out["n"] = batch["ctx_n"][g]
    out["graph_id"] = batch["ctx_record_id"][g]
    return out
