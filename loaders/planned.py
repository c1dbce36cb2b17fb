"""Which passes of a :class:`loaders.StreamLoader` with workers are planned in the trainer's process.

Some views do their real work once per *pool* (thousands of records), not per
batch, and keep it in the trainer's process anyway; a batch is then a cheap read
of decoded memory, and a DataLoader worker adds only its round trip (the batch
copied into a shared slot, a reference pickled through torch's queues and
unpickled, torch's iterator and our hand-over thread: ~0.35 ms a batch in the
main process) and a second copy of the pool work. For those views a pass with
workers is iterated like a 0-worker pass, on the loader's hand-over thread
(:class:`loaders.handover.Handover` with ``shared=True``: a trainer that finds no
batch ready builds the next one itself), ``num_workers x prefetch_factor``
batches ahead; no worker process and no shared-memory slots are made. The
batches, their order and the resume state are those of any worker count (the
plan is a function of the cache, seed and epoch).

* ``twins`` with ``compact="pool"``: a batch is a few index arrays whose graphs the
  consumer's :class:`loaders.TwinsContext` decodes in this process
  (docs/DECISIONS.md, "`compact="pool"` batches are planned in the trainer's process").
* ``records`` with ``mix=`` (pools, on a shuffled stream): a pool is decoded once,
  each shared frame once, ahead of the batches that read it (:mod:`loaders.views.pool_ahead`);
  a batch is a gather from it. Workers shared each pool's decode and did not decode
  ahead: 2 workers read 0.65-0.7x the samples/s of 0. Planned here, the pools are
  decoded by a process of the store's own (:mod:`loaders.views.pool_process`: no
  decode under the trainer's GIL), and the hand-over thread builds batches only while
  the trainer stays away longer than :data:`PATIENCE_S` (a loop that is back at once
  builds each batch in its own ``next()``, with no hand-off; docs/DECISIONS.md,
  "Pooled records reads with workers: planned in the trainer's process").

Not with a ``collate_fn`` or a ``worker_init_fn`` of the caller's: those ask for the
workers. A plain torch ``DataLoader`` over the stream still runs its workers (they
share pools: :mod:`loaders.shared_pools`).
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data._utils.collate import default_convert

from loaders.views.pool_process import PoolProcess

__all__ = ["planned_here", "pool_work_here", "decode_where", "close_pool_process", "handover_patience", "PATIENCE_S"]

PATIENCE_S = 0.25e-3
"""How long a trainer is away before the hand-over thread builds pooled ``records`` batches ahead
(:class:`loaders.handover.Handover`'s ``patience_s``): a loop back sooner builds each batch itself."""


def pool_work_here(stream: Any) -> bool:
    """Whether ``stream``'s view does its work per pool in the trainer's process (module docstring)."""
    view = stream.view
    if getattr(view, "compact", None) == "pool":
        return True
    pooled = getattr(view, "name", None) == "records" and getattr(view, "store", None) is not None
    return pooled and bool(getattr(stream.config, "shuffle", False))  # (no shuffle: no pools, a decode per batch)


def planned_here(loader: Any) -> bool:
    """Whether ``loader`` (a :class:`loaders.StreamLoader`) plans its passes on its hand-over thread
    rather than in worker processes (module docstring)."""
    custom = loader.collate_fn is not default_convert or loader.worker_init_fn is not None
    return loader.num_workers > 0 and loader.handover > 0 and not custom and pool_work_here(loader.stream)


def handover_patience(loader: Any) -> float:
    """``patience_s`` of ``loader``'s hand-over thread: :data:`PATIENCE_S` for a planned pooled ``records`` pass, else 0."""
    view = loader.stream.view
    pooled = planned_here(loader) and getattr(view, "name", None) == "records"
    return getattr(loader, "patience_s", PATIENCE_S) if pooled else 0.0


def decode_where(loader: Any) -> None:
    """Before a pass of ``loader``: a pooled ``records`` store decodes its pools in a process of its own
    (:mod:`loaders.views.pool_process`, started once) when the pass is planned here, in a thread otherwise."""
    view = loader.stream.view
    store = getattr(view, "store", None)
    if store is None or getattr(view, "name", None) != "records":
        return
    # (not for a remote cache: this process's shard set fetches, and evicts from the local cache, in the
    # order of the pass's batches, which a copy in another process would not follow)
    here = planned_here(loader) and getattr(loader, "decode_process", True) and getattr(loader.stream, "remote", None) is None
    p = store.process
    if here and (p is None or p.dead or p.owner != os.getpid()):
        store.drop_private()  # (before the fork: else the process keeps a copy of them once this one lets go)
        store.process = PoolProcess(store.decode)
    store.use_process = here


def close_pool_process(loader: Any) -> None:
    """End the decode process of ``loader``'s store, if any (the next planned pass starts another)."""
    store = getattr(getattr(loader, "stream", None) and loader.stream.view, "store", None)
    if store is not None and store.process is not None:
        store.process.close()
