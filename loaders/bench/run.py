""":func:`run_bench`: drain a cache through the loader (and optionally the WebDataset reader) and measure it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from cachebuild.checks import finite, whole
from cachebuild.errors import ConfigError, OutputError
from cachebuild.format.manifest import Manifest, read_manifest
from loaders.bench.drain import drain, make_consumer, resolve_device
from loaders.bench.result import BenchResult
from loaders.bench.stages import decoded_bytes_per_record, payload_fields, stage_times
from loaders.bench.webdataset import BYTES_KEY, COUNT_KEY, webdataset_loader
from loaders.device import to_device
from loaders.loader import make_loader, shutdown_workers
from loaders.stream import ShardStream
from loaders.views import available_views

__all__ = ["run_bench", "default_view", "DEFAULT_VIEW", "DEFAULT_BATCH"]

DEFAULT_VIEW = {"causal": "graphs", "mel": "mel"}
"""Default view by manifest kind (anything else: ``records``)."""

DEFAULT_BATCH = {"graphs": 256, "twins": 4096, "mel": 8192, "mel_files": 64, "records": 256}
"""Default batch size by view (rows: graphs, twin rows, segments, files, records)."""


def default_view(kind: str) -> str:
    """The view ``cachebuild bench`` drains a cache of this kind with."""
    return DEFAULT_VIEW.get(kind, "records")


@dataclass
class _Limits:
    """When a drain stops, and what consumes its batches."""

    seconds: float | None
    batches: int | None
    consume: Callable[[Any], None] | None


def _check_numbers(workers: int, step_ms: float, seconds: float | None, batches: int | None, batch_size: int | None, sample: int) -> None:
    whole("--workers", workers, 0, 256)
    finite("--step-ms", step_ms, 0, 3.6e6)
    if seconds is not None:
        finite("--seconds", seconds, 0, 1e6, lo_open=True)
    if batches is not None:
        whole("--batches", batches, 2, 1 << 40)  # the first batch is warm-up
    if batch_size is not None:
        whole("--batch-size", batch_size, 1, 1 << 24)
    whole("--sample", sample, 1, 1 << 20)


def _check_plot(plot: str | Path | None) -> Path | None:
    """The ``--plot`` file, checked before any work: matplotlib installed, folder there."""
    if plot is None:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib (or pip install 'cachebuild[plot]')") from None
    plot = Path(plot)
    if not plot.parent.is_dir():
        raise OutputError(f"--plot {plot}: folder {plot.parent} does not exist")
    if not os.access(plot if plot.exists() else plot.parent, os.W_OK):  # checked before the run, not after it
        raise OutputError(f"--plot {plot}: {'the file' if plot.exists() else f'folder {plot.parent}'} is not writable")
    return plot


def _check_compare() -> None:
    try:
        import webdataset  # noqa: F401
    except ImportError:
        raise ConfigError("--compare needs the webdataset package: pip install webdataset") from None


def _check_consumer(consumer: str, dev: Any) -> None:
    if consumer not in ("none", "sleep", "model"):
        raise ConfigError(f"unknown consumer {consumer!r}; choose none, sleep or model")
    if consumer == "model" and dev.type != "cuda":
        raise ConfigError("--consumer model trains a small model on the GPU, and this run has no CUDA device (use --step-ms N to model a GPU step of N ms on a CPU-only machine)")


def _open_stream(cache: str | Path, view: str, batch_size: int, seed: int) -> ShardStream:
    names = available_views()
    if view not in names:
        raise ConfigError(f"unknown view {view!r}; choose one of: {', '.join(names)}")
    options: dict[str, Any] = {"compact": True} if view == "twins" else {}
    try:
        return ShardStream(cache, view=view, batch_size=batch_size, shuffle=True, seed=seed, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"view {view!r} on {cache}: {exc}") from None


def _drain_loader(stream: ShardStream, workers: int, dev: Any, limits: _Limits, plot: Path | None) -> tuple[Any, int, float]:
    """Drain the loader; ``(summary, batches, seconds to create the loader)``."""

    def count(batch: dict[str, Any]) -> int:
        return int((~batch["is_pad"]).sum())

    t_make = time.perf_counter()
    loader = make_loader(stream, num_workers=workers, pin_memory=dev.type == "cuda")
    created_s = time.perf_counter() - t_make  # the monitor's clock starts at the first next()

    def make(epoch: int) -> Iterable[Any]:
        loader.set_epoch(epoch)
        return to_device(loader, dev) if dev.type == "cuda" else loader

    try:
        summary, done = drain(make, count, limits.consume, limits.seconds, limits.batches, plot)
    finally:
        shutdown_workers(loader)
    return summary, done, created_s


def _compare(stream: ShardStream, batch_size: int, items_per_record: float, workers: int, limits: _Limits) -> dict[str, Any]:
    """The WebDataset reader on the same shards, batches of about as many records, measured the same way."""
    batch_records = max(1, round(batch_size / max(items_per_record, 1e-9)))
    loader = webdataset_loader(stream.root, batch_records, workers, shuffle=False)
    state = {"records": 0, "bytes": 0}

    def count(batch: dict[str, Any]) -> int:
        state["records"] += batch[COUNT_KEY]
        state["bytes"] += batch[BYTES_KEY]
        return int(batch[COUNT_KEY])

    try:
        summary, done = drain(lambda epoch: loader, count, limits.consume, limits.seconds, limits.batches)
    finally:
        shutdown_workers(loader)
    rps = summary.samples_per_s or 0.0
    per_record = state["bytes"] / max(1, state["records"])
    return {
        "reader": "webdataset",
        "batch_records": batch_records,
        "batches": done,
        "records_per_s": rps,
        "samples_per_s": rps * items_per_record,
        "payload_mb_per_s": rps * per_record / 1e6,
        "first_batch_s": summary.first_batch_s or 0.0,
        "wait_fraction": summary.wait_fraction,
        "wait_p95_ms": summary.wait_p95_ms,
        "wall_s": summary.wall_s,
    }


def _result(cache: str | Path, stream: ShardStream, manifest: Manifest, workers: int, step_ms: float, consumer: str, dev: Any, drained: tuple[Any, int, float], stages: dict[str, Any]) -> BenchResult:
    summary, done, created_s = drained
    records_per_item = manifest.records / max(1, stream.plan(0).total)
    samples_per_s = summary.samples_per_s or 0.0
    records_per_s = samples_per_s * records_per_item
    per_record = decoded_bytes_per_record(stream, payload_fields(stream))
    return BenchResult(
        cache=str(cache),
        view=stream.config.view,
        batch_size=stream.config.batch_size,
        workers=workers,
        step_ms=float(step_ms),
        consumer=consumer,
        device=str(dev),
        codec=manifest.codec.name,
        batches=done,
        records_per_s=records_per_s,
        samples_per_s=samples_per_s,
        payload_mb_per_s=records_per_s * per_record / 1e6,
        batch_mb_per_s=summary.batches_per_s * stream.layout.nbytes / 1e6,
        first_batch_s=(summary.first_batch_s or 0.0) + created_s,
        wait_fraction=summary.wait_fraction,
        wait_p95_ms=summary.wait_p95_ms,
        wall_s=summary.wall_s,
        stages_ms=stages,
    )


def run_bench(
    cache: str | Path,
    view: str | None = None,
    batch_size: int | None = None,
    workers: int = 1,
    seconds: float | None = None,
    batches: int | None = None,
    step_ms: float = 0.0,
    consumer: str | None = None,
    device: str | None = "auto",
    compare: bool = False,
    sample: int = 8,
    seed: int = 0,
    plot: str | Path | None = None,
) -> BenchResult:
    """Drain ``cache`` through the loader and measure it (see :mod:`loaders.bench`).

    Stops after ``batches`` batches or ``seconds`` seconds, whichever comes first
    (default: 10 s), going on into further epochs of a small cache. ``plot``: a
    PNG of the loader's wait per step and throughput (needs matplotlib).
    """
    _check_numbers(workers, step_ms, seconds, batches, batch_size, sample)
    if seconds is None and batches is None:
        seconds = 10.0
    plot_path = _check_plot(plot)
    if compare:
        _check_compare()
    manifest = read_manifest(cache)
    if manifest.records == 0:  # a stranger's manifest may list no shards (verify passes it): nothing to drain
        raise ConfigError(f"{cache} holds no records (its manifest lists {len(manifest.shards)} shards): nothing to bench")
    view = view or default_view(manifest.kind)
    stream = _open_stream(cache, view, DEFAULT_BATCH.get(view, 256) if batch_size is None else batch_size, seed)
    consumer = consumer or ("sleep" if step_ms > 0 else "none")
    dev = resolve_device(device)
    _check_consumer(consumer, dev)
    stages = stage_times(stream, sample=sample, device=dev if dev.type == "cuda" else None)
    limits = _Limits(seconds, batches, make_consumer(consumer, step_ms, dev))
    result = _result(cache, stream, manifest, workers, step_ms, consumer, dev, _drain_loader(stream, workers, dev, limits, plot_path), stages)
    if compare:
        items_per_record = stream.plan(0).total / max(1, manifest.records)
        result.compare = _compare(stream, stream.config.batch_size, items_per_record, workers, limits)
    return result
