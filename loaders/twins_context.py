"""``TwinsContext``: the graph context of ``twins`` batches made with ``compact="pool"``, held once per pool.

A ``compact="pool"`` batch (:mod:`loaders.views.twins`) carries no graph context,
only where each row's graph lies in the epoch's mixing pools (``pool``,
``pool_index``), its ``int_index``, ``row_index``, ``is_pad``, and ``plan``:
the plan's fingerprint, the epoch and the global batch number. The consumer
holds the context instead, in this object:

* **What it holds**: the decoded, padded graphs (``base``, ``int``, ``adj``,
  ``targets``, ``values``, ``n``, record ids; ``delta`` when it is read) of the
  pools the current batch touches (at most ``pool_span``, usually 2) and up to
  two decoded ahead, in ``pool_span + 2`` *regions* of ``pool_size`` graphs
  (``max_held`` counts them), decoded in place into host regions (pinned for a
  CUDA device, then copied there; a region's next decode waits for that copy).
* **How it gets them**: from the batch's ``plan`` and the stream's own plan of
  that epoch (:meth:`loaders.ShardStream.plan`) it knows the pools the batch
  touches (the stream positions ``[b*B, (b+1)*B)``, cyclic); a pool it does not
  hold is read from the cache in this process (``plan.pool_records(q)``, the
  twins view's block decode, through a shard set of the stream's own kind, so
  mixtures and remote caches read as the stream does) into a region no pool of
  the batch needs. Each pool is decoded once per epoch per consumer.
* **Ahead of time**: after a batch, the next pool this consumer needs
  (:mod:`loaders.pool_schedule`; a DDP rank's batches are every ``W``-th, the
  stride seen between its batches) is decoded in the background
  (:mod:`loaders.pool_decoder`: a thread, or ``decoder="process"``: processes
  decoding into shared memory, no GIL shared with the trainer's loop), so the
  trainer does not wait at pool boundaries; all decoding goes there, one pool at
  a time, and its errors reach the caller of :meth:`load` whose batch needs that
  pool. After the consumer's last batch of an epoch comes the next epoch's first
  pool, as the stream will plan it (unused if it then reads another generation).
* **Stateless beyond its cache**: a batch names its plan, so mid-epoch resume,
  DDP ranks, 0 or more (persistent) DataLoader workers need nothing else. A
  batch of a plan the stream does not plan for that epoch (another generation,
  seed or mixture) is a :class:`~cachebuild.errors.CacheMismatchError`.

:meth:`expand` rebuilds exactly the default ``twins`` keys by indexing on
``device``. It reads the batch's ``plan`` (24 bytes) on the host: for a batch
already on a CUDA device that read waits for the device; pass ``meta=``
(:meth:`meta` of the host batch, taken before :func:`loaders.to_device`) to avoid it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from cachebuild.errors import CacheMismatchError
from cachebuild.format.reader import ShardSet
from loaders.batch import torch_dtype
from loaders.plan import EpochPlan
from loaders.stream import ShardStream
from loaders.pool_decoder import DECODERS, Pending, ProcessDecoder, ThreadDecoder
from loaders.pool_schedule import Key as _Key
from loaders.pool_schedule import REGIONS_AHEAD, batch_pools, next_use, pick_region, upcoming_pools
from loaders.views.twins_regions import WORLDS

__all__ = ["TwinsContext", "batch_pools", "REGIONS_AHEAD"]


def _stream_of(source: Any) -> ShardStream:
    """The stream behind ``source``: itself, a :func:`loaders.make_loader` loader's ``stream``, or a DataLoader's
    (plain or torchdata's ``StatefulDataLoader``) ``dataset``."""
    for got in (source, getattr(source, "stream", None), getattr(source, "dataset", None)):
        if isinstance(got, ShardStream):
            return got
    raise TypeError(f"TwinsContext needs the ShardStream(view='twins', compact='pool') the batches come from (or a loader over it), got {type(source).__name__} {source!r:.80}")


def _device(device: str | torch.device) -> torch.device:
    """``device`` parsed, and usable here (one line otherwise, naming it)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"TwinsContext: device={device!r} is not a torch device ('cpu', 'cuda', 'cuda:1', ...)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"TwinsContext: device={device!r}, but this torch sees no CUDA device (torch.cuda.is_available() is False): use device='cpu'")
    return dev


def _pool_batch(batch: Mapping[str, Any]) -> Mapping[str, Any]:
    """``batch``, if it is one of ``compact="pool"`` (else one line saying what it is not)."""
    if not all(k in batch for k in ("plan", "pool", "pool_index")):
        raise ValueError(f"TwinsContext: not a compact='pool' twins batch (no 'plan', 'pool', 'pool_index'; its keys: {', '.join(list(batch)[:6])}, ...): make its stream with compact='pool'")
    return batch


class TwinsContext:
    """The decoded pools that ``compact="pool"`` batches of ``stream`` point into (see the module docstring).

    Args:
        stream: the :class:`loaders.ShardStream` (``view="twins", compact="pool"``, shuffled) whose batches
            are expanded, or a loader over it (:func:`loaders.make_loader`, a plain ``DataLoader`` or torchdata's
            ``StatefulDataLoader``); its plan says where the rows' graphs lie. Make one per consuming process
            (each DDP rank its own) and keep it across epochs and resumes.
        device: where the context lives and :meth:`expand` builds the keys (``"cuda"`` only where torch
            sees a GPU: a one-line ``ValueError`` otherwise, as for a name torch does not know).
        prefetch: decode the next pool in the background after each batch.
        threads: zstd threads of a pool's decode.
        decoder: ``"thread"`` (a thread of this process) or ``"process"`` (a process of its own, decoding
            into shared memory: no GIL shared with the trainer's loop), see :mod:`loaders.pool_decoder`.
        processes: with ``decoder="process"``, how many decode processes share each pool's decode (each its
            own part of the graphs): more finish a pool sooner where cores are idle (0 DataLoader workers).

    Use it as a context manager or :meth:`close` it; a dropped context's decode process stops by itself.
    A batch that is not ``compact="pool"`` is a ``ValueError``; one of another plan or batch size (another
    stream) a :class:`~cachebuild.errors.CacheMismatchError`.
    """

    def __init__(self, stream: Any, device: str | torch.device = "cpu", prefetch: bool = True, threads: int = 1, decoder: str = "thread", processes: int = 1):
        stream = _stream_of(stream)
        view = stream.view
        if getattr(view, "name", None) != "twins" or getattr(view, "compact", None) != "pool":
            raise ValueError(f"TwinsContext needs a ShardStream(view='twins', compact='pool'); this one is view={stream.config.view!r} with options {stream.config.view_options}")
        if not stream.config.shuffle:
            raise ValueError("TwinsContext: compact='pool' needs a mixed plan, and shuffle=False has no pools")
        self.stream: ShardStream = stream
        self.device = _device(device)
        self.prefetch = prefetch
        self.threads = int(threads)
        self._dims = self._view_dims()
        if decoder not in DECODERS:
            raise ValueError(f"TwinsContext: decoder must be one of {DECODERS}, got {decoder!r}")
        self.decoder = decoder
        if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= 64:
            raise ValueError(f"TwinsContext: processes must be a whole number from 1 to 64, got {processes!r}")
        if processes > 1 and decoder != "process":
            raise ValueError(f"TwinsContext: processes={processes} needs decoder='process' (the thread decoder is one thread)")
        self.processes = processes
        self._decoder: ThreadDecoder | ProcessDecoder | None = None
        self._rows = 0
        self._next: tuple[tuple[Any, int], EpochPlan] | None = None  # the next epoch's plan, for its first pool
        self._stride, self._last = 1, (0, 0)  # batches between this consumer's (a DDP rank: the world size); its last
        self._order: tuple[tuple[Any, ...], list[_Key]] = ((), [])  # the pools needed next, after a batch (cached)
        self._shards: ShardSet | None = None
        self._shards_of: tuple[int, ...] = ()
        self._regions: dict[str, torch.Tensor] = {}  # on the device
        self._host: dict[str, torch.Tensor] = {}  # where pools are decoded (the regions themselves on the CPU)
        self._copied: list[Any] = []  # per region: the CUDA event of its last copy to the device
        self._held: list[_Key | None] = []  # the pool in each region (decoded, or being decoded)
        self._size = 0
        self._lut = torch.zeros(0, dtype=torch.int64, device=self.device)  # pool -> its first row in the regions, -1: not held
        self._lut_plan = 0
        self._pending: tuple[_Key, int, Pending] | None = None  # the pool being decoded, its region
        self.loads = 0  # pools decoded by this object
        self.max_held = 0  # the most pools held at once (decoded, or being decoded ahead)

    def _view_dims(self) -> tuple[Any, ...]:
        v: Any = self.stream.view
        return (v.s, v.k_max, v.n_max, v.delta, tuple(v._decode))

    # ---- reading the batch
    @staticmethod
    def meta(batch: Mapping[str, Any]) -> tuple[int, int, int]:
        """``(plan fingerprint, epoch, global batch)`` of a ``compact="pool"`` batch (read on the host)."""
        _pool_batch(batch)
        fingerprint, epoch, b = (int(x) for x in batch["plan"].tolist())
        return fingerprint, epoch, b

    def load(self, batch: Mapping[str, Any] | None = None, meta: tuple[int, int, int] | None = None) -> torch.Tensor:
        """Hold every pool the batch touches (decoding those not held); returns the pool -> first row table on ``device``."""
        if meta is None:
            if batch is None:
                raise ValueError("TwinsContext.load needs a batch or its meta")
            meta = self.meta(batch)
        fingerprint, epoch, b = meta
        plan = self._plan(epoch, fingerprint)
        if batch is not None and len(_pool_batch(batch)["pool"]) != plan.batch_size:  # (same pools, other batch numbers: wrong pools held)
            raise CacheMismatchError(
                f"twins batch of {len(batch['pool'])} rows, but {self.stream.root} makes batches of {plan.batch_size} here: build the TwinsContext from the stream the batches came from"
            )
        need = batch_pools(plan, b)
        pools = len(plan.pool_items) - 1 if plan.pool_items is not None else 0
        if (plan.pool_size, plan.pool_span + REGIONS_AHEAD) != (self._size, len(self._held)):
            self._allocate(plan.pool_size, plan.pool_span + REGIONS_AHEAD)
        if self._lut_plan != fingerprint:  # a new epoch (or generation): its own pools (one may be decoded already)
            self._new_table(fingerprint, pools)
        if self._last[0] == fingerprint and b > self._last[1]:
            self._stride = b - self._last[1]
        self._last = (fingerprint, b)
        keys, order = {(fingerprint, int(q)) for q in need}, self._needed(plan, epoch, b, need)
        for q in need.tolist():
            if self._ready(fingerprint, q):
                continue
            if self.ahead != (fingerprint, q):
                self._submit(plan, q, keys, order)
            self._place()
        if self._pending is not None and self._pending[2].done() and self._pending[0] not in keys:
            self._drain()  # decoded ahead: placed now, so the next one can start
        if self.prefetch and self._pending is None:
            self._decode_ahead(plan, keys, order)
        self.max_held = max(self.max_held, sum(k is not None for k in self._held))
        return self._lut

    def _new_table(self, fingerprint: int, pools: int) -> None:
        """The pool -> row table of another plan, with the pools of that plan already decoded (ahead)."""
        self._lut = torch.full((pools,), -1, dtype=torch.int64, device=self.device)
        self._lut_plan = fingerprint
        for r, k in enumerate(self._held):
            if k is not None and k[0] == fingerprint and k != self.ahead:
                self._lut[k[1]] = r * self._size

    def _needed(self, plan: EpochPlan, epoch: int, b: int, need: np.ndarray) -> list[_Key]:
        """The pools needed after batch ``b`` (:mod:`loaders.pool_schedule`), soonest first: this epoch's that
        this consumer's next batches touch, then the next epoch's first one of its first batch, planned now
        as the stream will plan it (unused if it then reads another generation or epoch)."""
        s, limit = self._stride, len(self._held)
        key = (plan.fingerprint(), s, b % s, b >= plan.batches - 1, tuple(need.tolist()), self.stream.generations)
        if self._order[0] != key:
            order = [(key[0], q) for q in upcoming_pools(plan, b, s, limit)]
            nxt = self._next_plan(epoch) if len(order) < limit and self.prefetch else None
            if nxt is not None:
                order.append((nxt.fingerprint(), int(batch_pools(nxt, b % s)[0])))
            self._order = (key, order)
        return self._order[1]

    def _decode_ahead(self, plan: EpochPlan, keep: set[_Key], order: list[_Key]) -> None:
        """Decode the first pool of ``order`` not held, into a region whose pool is not needed sooner; a decode
        that cannot start is left to the batch that needs the pool (which raises its error)."""
        target = next((k for k in order if k not in self._held), None)
        src = plan if target is None or target[0] == plan.fingerprint() else self._next[1] if self._next is not None else None
        if target is None or src is None or src.fingerprint() != target[0]:
            return
        use = [next_use(k, order) for k in self._held]
        evicted = use[pick_region(self._held, keep, use)]
        if evicted < 0 or evicted > next_use(target, order):  # (never one needed sooner)
            try:
                self._submit(src, target[1], keep, order)
            except Exception:
                pass

    def _next_plan(self, epoch: int) -> EpochPlan | None:
        """The plan of ``epoch + 1``, without taking the place of the stream's one cached plan."""
        key = (self.stream.generations, epoch + 1)
        if self._next is None or self._next[0] != key:
            saved = self.stream._plan_cache
            try:
                plan = self.stream.plan(epoch + 1)
            except ValueError:  # (a schedule that ends, ...): that epoch's own pass will say so
                return None
            finally:
                self.stream._plan_cache = saved
            self._next = (key, plan)
        return self._next[1]

    def _plan(self, epoch: int, fingerprint: int) -> EpochPlan:
        plan = self.stream.plan(epoch)
        if plan.fingerprint() != fingerprint:
            raise CacheMismatchError(
                f"twins batch of epoch {epoch} was planned as {fingerprint:#x}, but {self.stream.root} plans epoch {epoch} as {plan.fingerprint():#x} "
                f"(another generation of the cache, seed or mixture?): build the TwinsContext from the stream the batches came from"
            )
        if self._view_dims() != self._dims:
            raise CacheMismatchError(f"{self.stream.root} now reads graphs of other shapes than when this TwinsContext was made (a grown cache?): make a new ShardStream and TwinsContext")
        return plan

    # ---- holding pools
    def _allocate(self, size: int, regions: int) -> None:
        """``regions`` regions of ``size`` graphs (the pools a batch can touch, and one decoded ahead); forgets what
        was held. The buffers (and a decode process) are kept when they are large enough."""
        self._drain()
        for event in self._copied:  # (copies out of the host regions end before their rows are decoded into again)
            if event is not None:
                event.synchronize()
        self._copied = [None] * regions
        self._held, self._size, self._lut_plan = [None] * regions, size, 0
        rows = regions * size
        if self._decoder is not None and self._rows >= rows:
            return
        self._release()
        cuda = self.device.type == "cuda"
        fields = {k: (f.shape, np.dtype(f.dtype).name) for k, f in self._fields().items()} | {"record_id": ((), "int64"), WORLDS: ((), "int64")}
        decode = list(self._dims[4])
        if self.decoder == "process":
            proc = ProcessDecoder(fields, rows, decode, self.threads, self.processes)
            self._decoder, self._host = proc, {k: torch.from_numpy(a) for k, a in proc.host.items()}
        else:
            self._host = {k: torch.zeros((rows,) + tuple(shape), dtype=torch_dtype(dtype), pin_memory=cuda) for k, (shape, dtype) in fields.items()}
            self._decoder = ThreadDecoder({k: t.numpy() for k, t in self._host.items()}, decode, self.threads)
        self._regions = {k: torch.zeros_like(t, device=self.device) for k, t in self._host.items()} if cuda else self._host
        self._rows = rows

    def _release(self) -> None:
        """Stop the decoder and free the regions (views of a decode process's shared memory go first)."""
        self._regions, self._host = {}, {}
        if self._decoder is not None:
            self._decoder.close()
            self._decoder, self._rows = None, 0

    def _ready(self, fingerprint: int, q: int) -> bool:
        """Pool ``q`` is decoded in a region (not being decoded)."""
        return (fingerprint, q) in self._held and self.ahead != (fingerprint, q)

    def _submit(self, plan: EpochPlan, q: int, keep: set[_Key], order: list[_Key]) -> None:
        """Decode pool ``q`` of ``plan`` in the background (after the decode under way, one at a time), into a
        region no pool of ``keep`` (the batch's) is in: ``pool_span + REGIONS_AHEAD`` regions always have one (a batch
        touches at most ``pool_span`` pools). The region holds ``q`` only once its decode is under way (a
        decode that could not start leaves it empty, never a pool that looks decoded)."""
        self._drain()
        r = pick_region(self._held, keep, [next_use(k, order) for k in self._held])
        old, self._held[r] = self._held[r], None
        if old is not None and old[0] == self._lut_plan:
            self._lut[old[1]] = -1
        ids, shards = plan.pool_records(q).copy(), self._shard_set()
        zero = [k for k, f in self._fields().items() if f.zero]
        assert self._decoder is not None, "_allocate comes first"
        done = self._decoder.submit(shards, ids, r * self._size, zero, self._copied[r])
        self._held[r], self._pending = (plan.fingerprint(), q), ((plan.fingerprint(), q), r, done)
        self.loads += 1

    def _place(self) -> None:
        """Wait for the pool being decoded; on a device, copy its region there."""
        assert self._pending is not None, "_place follows _submit"
        (fingerprint, q), r, done = self._pending
        self._pending = None
        try:
            done.result()
        except BaseException:
            self._held[r] = None  # not decoded: asked again, it is decoded again (and fails again, or not)
            raise
        lo, hi = r * self._size, (r + 1) * self._size
        if self._regions is not self._host:
            for name, region in self._regions.items():
                region[lo:hi].copy_(self._host[name][lo:hi], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._copied[r] = event  # the next decode into this host region waits for the copy
        if fingerprint == self._lut_plan:
            self._lut[q] = lo

    def _fields(self) -> dict[str, Any]:
        view: Any = self.stream.view
        return dict(view.fields)

    def _shard_set(self) -> ShardSet:
        """The shard set the decode thread reads (reopened when the stream reads other generations)."""
        if self._shards is None or self._shards_of != self.stream.generations:
            self._drain()
            if self._shards is not None:
                self._shards.close()
            self._shards, self._shards_of = self.stream._new_shard_set(), self.stream.generations
        return self._shards

    def _drain(self) -> None:
        """Finish the decode under way, and place its pool; a failed one is only forgotten (its region freed):
        no batch asked for it yet, so its error is raised when one does (it is decoded again then)."""
        if self._pending is not None:
            try:
                self._place()
            except Exception:
                pass

    @property
    def ahead(self) -> tuple[int, int] | None:
        """``(plan fingerprint, pool)`` of the pool being decoded ahead, if any."""
        return self._pending[0] if self._pending is not None else None

    def held(self) -> list[tuple[int, int]]:
        """``(plan fingerprint, pool)`` of every pool decoded in a region now (not the one being decoded)."""
        return [k for k in self._held if k is not None and k != self.ahead]

    # ---- the default keys
    def expand(self, batch: Mapping[str, Any], meta: tuple[int, int, int] | None = None) -> dict[str, torch.Tensor]:
        """The default ``twins`` keys of a ``compact="pool"`` batch, built on ``device`` by indexing the held pools."""
        lut = self.load(batch, meta)
        S, K, N = self._dims[:3]
        d, R = self.device, self._regions
        g = lut[batch["pool"].to(d).long()] + batch["pool_index"].to(d).long()  # each row's graph in the regions
        k, j = batch["int_index"].to(d).long(), batch["row_index"].to(d).long()
        world = g * K + k
        out = {"target_row": R["base"].view(-1, N)[g * S + j], "int_row": R["int"].view(-1, N)[world * S + j]}
        out["delta"] = R["delta"].view(-1, N)[world * S + j] if "delta" in R else out["int_row"] - out["target_row"]
        node = R["targets"].view(-1)[world]
        out["int_mask"] = torch.zeros((len(g), N), dtype=torch.float32, device=d).scatter_(1, node[:, None], 1.0)
        out.update(int_node_idx=node, value=R["values"].view(-1)[world], int_index=k, row_index=j)
        out.update(base_samples=R["base"][g], int_samples=R["int"].view(-1, S, N)[world], adj=R["adj"][g])
        n = R["n"][g]
        out.update(node_mask=torch.arange(N, device=d)[None, :] < n[:, None], n=n, graph_id=R["record_id"][g])
        out["is_pad"] = batch["is_pad"].to(d)
        return out

    # ---- lifetime
    def close(self) -> None:
        """Stop the decoder (and its process), free the pools, close the shard set. A later :meth:`expand`
        starts again from nothing (and must be closed again)."""
        try:
            self._drain()
        finally:
            self._release()
            if self._shards is not None:
                self._shards.close()
                self._shards = None
            self._held = []

    def __enter__(self) -> "TwinsContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
