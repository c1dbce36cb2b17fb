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
plan, pure functions), :mod:`~loaders.shards` (memory-mapped shards and their
indexes, opened lazily), :mod:`~loaders.blockread` (many records' fields
decoded at once), :mod:`~loaders.views` (records -> batches;
``records``, ``graphs``, ``twins``, and a registry for more),
:mod:`~loaders.batch` (packed fixed layouts), :mod:`~loaders.slots` (reused
shared-memory buffers between workers and the main process), :mod:`~loaders.stream`
(``ShardStream``), :mod:`~loaders.state` (resume state), :mod:`~loaders.loader`
(``make_loader``, ``loader_state``), :mod:`~loaders.passes` (which epoch each
pass runs: the next one, unless ``set_epoch``/``load_state_dict`` said
otherwise), :mod:`~loaders.device` (``to_device``), :mod:`~loaders.monitor`
and :mod:`~loaders.monitor_out` (the stall monitor and its outputs),
:mod:`~loaders.lightning` (a Lightning datamodule; imports Lightning),
:mod:`~loaders.mixture`, :mod:`~loaders.schedule` and :mod:`~loaders.mixplan`
(several caches in one stream: weights, schedules). Only
``cachebuild.format`` and ``cachebuild.errors`` are imported from cachebuild.
"""

from loaders.batch import Batch, Field, Layout, PackedBatch
from loaders.device import to_device
from loaders.loader import StreamLoader, loader_state, make_loader
from loaders.mixture import Mixture, Stage
from loaders.plan import BatchItems, EpochPlan, epoch_order
from loaders.state import PlanConfig
from loaders.stream import ShardStream
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
    "EpochPlan",
    "BatchItems",
    "epoch_order",
    "World",
    "PlanConfig",
    "Batch",
    "PackedBatch",
    "Layout",
    "Field",
    "View",
    "VIEWS",
    "register_view",
    "expand_compact",
]
