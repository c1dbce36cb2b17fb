"""Stream a cachebuild cache to the trainer: fixed-shape batches, exact resume, no DDP hangs.

```python
from loaders import ShardStream, make_loader, to_device
stream = ShardStream("/dev/shm/cachebuild/causal", view="twins", batch_size=4096, shuffle=True, seed=0)
loader = make_loader(stream, num_workers=2)
for epoch in range(epochs):
    loader.set_epoch(epoch)
    for batch in to_device(loader, "cuda"):
        ...
state = loader.state_dict()          # after any batch
loader2.load_state_dict(state)       # fresh process: the same remaining batches
```

Modules: :mod:`~loaders.world` (rank/worker), :mod:`~loaders.plan` (the epoch
plan, pure functions), :mod:`cachebuild.format.reader` (memory-mapped shards and their
indexes, opened lazily and checked; :mod:`~loaders.shards` fetches remote ones),
:mod:`cachebuild.format.decode` (many records' fields decoded at once), :mod:`~loaders.views` (records -> batches;
``records``, ``graphs``, ``twins``, and a registry for more), :mod:`~loaders.twins_context`
(``TwinsContext``: the graph context of ``twins`` batches made with ``compact="pool"``;
:mod:`~loaders.pool_decoder` decodes its pools on a thread or in a process),
:mod:`~loaders.batch` (packed fixed layouts), :mod:`~loaders.slots` (reused
shared-memory buffers between workers and the main process), :mod:`~loaders.stream`
(``ShardStream``), :mod:`~loaders.state` (resume state), :mod:`~loaders.loader`
(``make_loader``, ``loader_state``), :mod:`~loaders.passes` (which epoch each
pass runs: the next one, unless ``set_epoch``/``load_state_dict`` said
otherwise), :mod:`~loaders.device` (``to_device``), :mod:`~loaders.monitor`
and :mod:`~loaders.monitor_out` (the stall monitor and its outputs),
:mod:`~loaders.lightning` (a Lightning datamodule; imports Lightning),
:mod:`~loaders.stateful` (torchdata's ``StatefulDataLoader``, checking a loaded state; imports torchdata),
:mod:`~loaders.mixture`, :mod:`~loaders.schedule` and :mod:`~loaders.mixplan`
(several caches in one stream: weights, schedules). Only
``cachebuild.format``, ``cachebuild.errors`` and ``cachebuild.checks`` are
imported from cachebuild (and nothing in cachebuild imports loaders but the
``cachebuild bench`` command, lazily). :mod:`~loaders.bench` is the loader's
benchmark (``cachebuild bench``).

Public names are those of ``__all__``; the plan and batch-layout internals
(``EpochPlan``, ``BatchItems``, ``epoch_order``, ``Layout``, ``Field``) live in
:mod:`loaders.plan` and :mod:`loaders.batch` (importing them from ``loaders``
still works and warns).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from loaders.batch import Batch, PackedBatch
from loaders.device import to_device
from loaders.loader import StreamLoader, loader_state, make_loader
from loaders.mixture import Mixture, Stage
from loaders.state import PlanConfig
from loaders.stream import ShardStream
from loaders.twins_context import TwinsContext
from loaders.views import VIEWS, View, expand_compact, register_view
from loaders.world import World

__all__ = [
    "ShardStream",
    "Mixture",
    "Stage",
    "make_loader",
    "loader_state",
    "to_device",
    "StreamLoader",
    "World",
    "PlanConfig",
    "Batch",
    "PackedBatch",
    "View",
    "VIEWS",
    "register_view",
    "expand_compact",
    "TwinsContext",
]

_MOVED = {
    "EpochPlan": "loaders.plan",
    "BatchItems": "loaders.plan",
    "epoch_order": "loaders.plan",
    "Layout": "loaders.batch",
    "Field": "loaders.batch",
}
"""Internals this package exported before: still importable from here, with a DeprecationWarning."""


def __getattr__(name: str) -> Any:
    """``from loaders import EpochPlan`` (and the other names of :data:`_MOVED`): warn, then return it."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'loaders' has no attribute {name!r}")
    warnings.warn(f"loaders.{name} is internal and no longer exported from loaders; import it from {module}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)
