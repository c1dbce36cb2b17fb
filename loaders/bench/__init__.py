"""How fast a cache reaches the trainer through the loader, and where the time goes (``cachebuild bench``).

:func:`run_bench` drains a cache through :class:`loaders.ShardStream` +
:func:`loaders.make_loader` (+ :func:`loaders.to_device` on a CUDA device), with
an optional consumer standing in for the training step, and measures with
:class:`loaders.monitor.StallMonitor`:

* ``records_per_s``: cache records drained per second (epoch records / epoch
  items x ``samples_per_s``, so a twin or mel row counts as a fraction of its record);
* ``samples_per_s``: items of the view (graphs, twin rows, mel segments, files,
  records) per second, padding rows not counted;
* ``payload_mb_per_s``: decoded array bytes per second of the fields the view
  reads (:meth:`loaders.views.View.decoded_fields`, sizes from the index: what
  zstd outputs, before padding and batching); ``batch_mb_per_s``: bytes of the
  packed batches handed over;
* ``first_batch_s``: from the loader's creation to the first batch (worker start-up included);
* ``wait_fraction``: time the consumer waited for its next batch / wall time
  (after one warm-up step);
* ``stages_ms``: per-batch stage times, measured in this process on a sample of
  batches (:mod:`loaders.bench.stages`): ``read``, ``decompress``,
  ``assemble``, ``pin`` and ``copy`` (``None``, printed ``n/a``, without CUDA).

Consumers (:mod:`loaders.bench.drain`): ``step_ms`` sleeps that long per batch;
``consumer="model"`` trains a small MLP on the batch on the GPU (refused
without CUDA). ``compare=True`` adds the plain WebDataset reader
(:mod:`loaders.bench.webdataset`) on the same shards, measured the same way.

JSON schema of :meth:`BenchResult.to_dict` (``cachebuild bench --json``)::

    {"cache": str, "view": str, "batch_size": int, "workers": int, "step_ms": float,
     "consumer": "none" | "sleep" | "model", "device": str, "codec": str,
     "batches": int,                # batches consumed (warm-up included)
     "records_per_s": float, "samples_per_s": float, "payload_mb_per_s": float,
     "batch_mb_per_s": float, "first_batch_s": float, "wait_fraction": float,
     "wait_p95_ms": float, "wall_s": float,
     "stages_ms": {"read": float, "decompress": float, "assemble": float,
                   "pin": float | null, "copy": float | null, "sampled_batches": int},
     "compare": null | {"reader": "webdataset", "batch_records": int, "batches": int,
                        "records_per_s": float, "samples_per_s": float,
                        "payload_mb_per_s": float, "first_batch_s": float,
                        "wait_fraction": float, "wait_p95_ms": float, "wall_s": float}}
"""

from loaders.bench.drain import drain, make_consumer, resolve_device
from loaders.bench.result import STAGES, BenchResult, format_table
from loaders.bench.run import DEFAULT_BATCH, DEFAULT_VIEW, default_view, run_bench
from loaders.bench.stages import stage_times

__all__ = ["BenchResult", "run_bench", "default_view", "DEFAULT_BATCH", "DEFAULT_VIEW", "STAGES", "stage_times", "format_table", "drain", "make_consumer", "resolve_device"]
