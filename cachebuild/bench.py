"""``cachebuild bench``: how fast a cache reaches the trainer through the loader, and where the time goes.

:func:`run_bench` drains a cache through :class:`loaders.ShardStream` +
:func:`loaders.make_loader` (+ :func:`loaders.to_device` on a CUDA device), with
an optional consumer standing in for the training step, and measures with
:class:`loaders.monitor.StallMonitor`:

* ``records_per_s``: cache records drained per second (epoch records / epoch
  items x ``samples_per_s``, so a twin or mel row counts as a fraction of its record);
* ``samples_per_s``: items of the view (graphs, twin rows, mel segments, files,
  records) per second, padding rows not counted;
* ``payload_mb_per_s``: decoded array bytes per second of the fields the view
  reads (from the index: what zstd outputs, before padding and batching);
  ``batch_mb_per_s``: bytes of the packed batches handed over;
* ``first_batch_s``: from the loader's creation to the first batch (worker start-up included);
* ``wait_fraction``: time the consumer waited for its next batch / wall time
  (after one warm-up step);
* ``stages_ms``: per-batch stage times, measured in this process on a sample of
  batches (one zstd thread, like a DataLoader worker): ``read`` = gathering the
  batch's stored payload bytes from the shard mmaps (index lookups + one copy),
  ``decompress`` = zstd of those payloads (0 for a raw cache), ``assemble`` = the
  view's whole batch build minus read and decompress, ``pin`` = ``pin_memory`` of
  the packed batch and ``copy`` = its host-to-device copy (``None``, printed
  ``n/a``, without CUDA).

Consumers: ``step_ms`` sleeps that long per batch (a GPU step that leaves the
CPU free); ``consumer="model"`` trains a small MLP on the batch on the GPU
(refused without CUDA).

``compare=True`` adds the plain WebDataset reader on the same shards (tar
members read in order, per-sample ``.zst`` decode + ``np.load(allow_pickle=False)``,
batched by records with padding), measured the same way.

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

from __future__ import annotations

import io
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from cachebuild.errors import ConfigError, OutputError

__all__ = ["BenchResult", "run_bench", "default_view", "DEFAULT_BATCH", "stage_times", "webdataset_batches", "format_table"]

DEFAULT_VIEW = {"causal": "graphs", "mel": "mel"}
"""Default view by manifest kind (anything else: ``records``)."""

DEFAULT_BATCH = {"graphs": 256, "twins": 4096, "mel": 8192, "mel_files": 64, "records": 256}
"""Default batch size by view (rows: graphs, twin rows, segments, files, records)."""

STAGES = ("read", "decompress", "assemble", "pin", "copy")


def default_view(kind: str) -> str:
    """The view ``cachebuild bench`` drains a cache of this kind with."""
    return DEFAULT_VIEW.get(kind, "records")


@dataclass
class BenchResult:
    """What :func:`run_bench` measured (see the module docstring for the meaning of each field)."""

    cache: str
    view: str
    batch_size: int
    workers: int
    step_ms: float
    consumer: str
    device: str
    codec: str
    batches: int
    records_per_s: float
    samples_per_s: float
    payload_mb_per_s: float
    batch_mb_per_s: float
    first_batch_s: float
    wait_fraction: float
    wait_p95_ms: float
    wall_s: float
    stages_ms: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


# --------------------------------------------------------------------------- consumers
class _ModelConsumer:
    """A small MLP trained on the batch's main float tensor (GPU only)."""

    def __init__(self, device: Any):
        import torch

        self.torch, self.device = torch, device
        self.model = None
        self.opt = None

    @staticmethod
    def _main(batch: dict) -> Any:
        for key in ("mel", "target_row", "base"):
            if key in batch:
                return batch[key]
        for v in batch.values():
            if v.is_floating_point():
                return v
        return next(iter(batch.values()))

    def __call__(self, batch: dict) -> None:
        torch = self.torch
        x = self._main(batch).to(self.device, non_blocking=True)
        x = x.reshape(x.shape[0], -1).float()
        if self.model is None:
            self.model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 1)).to(self.device)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize(self.device)


def _consumer(kind: str, step_ms: float, device: Any) -> Callable[[Any], None] | None:
    if kind == "model":
        return _ModelConsumer(device)
    if step_ms > 0:
        seconds = step_ms / 1e3
        return lambda batch: time.sleep(seconds)
    return None


def _resolve_device(device: str | None) -> Any:
    import torch

    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"--device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    return dev


# --------------------------------------------------------------------------- draining
def _drain(
    make_batches: Callable[[int], Iterable[Any]],
    count: Callable[[Any], int],
    consume: Callable[[Any], None] | None,
    seconds: float | None,
    max_batches: int | None,
    plot: Path | None = None,
) -> tuple[Any, int]:
    """Run ``consume`` over batches (epoch after epoch) under a StallMonitor until a limit; ``(summary, batches)``.

    ``plot``: also draw the monitor's wait and throughput over steps to this PNG."""
    from loaders.monitor import StallMonitor

    monitor = StallMonitor(batch_size=count, warmup=1, sample_every_s=None, warn=None)
    done = 0
    t0 = time.perf_counter()
    epoch = 0

    def batches() -> Iterator[Any]:
        nonlocal epoch
        while True:
            got = False
            for b in make_batches(epoch):
                got = True
                yield b
            if not got:
                return
            epoch += 1

    it = monitor.wrap(batches())
    try:
        for batch in it:
            if consume is not None:
                consume(batch)
            done += 1
            if max_batches is not None and done >= max_batches:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
    finally:
        it.close()
    summary = monitor.summary()
    monitor.close()
    if plot is not None:
        monitor.plot(plot, title=f"cachebuild bench: {done} batches")
    return summary, done


def _decoded_bytes_per_record(stream: Any, fields: list[str]) -> float:
    """Mean decoded array bytes per record of ``fields`` (from the indexes)."""
    from cachebuild.format.reader import ShardSet

    shards = ShardSet(stream.manifest, stream.root)
    try:
        total = 0
        for s in range(len(stream.manifest.shards)):
            idx = shards.shard(s).index
            for name in fields:
                total += int(idx[:, shards.field_pos[name]]["nbytes"].sum())
    finally:
        shards.close()
    return total / max(1, stream.manifest.records)


# --------------------------------------------------------------------------- stages
class _Recorder:
    """Stands in for ``read_block`` in a view's module: records (ids, fields) and calls the real one."""

    def __init__(self, real: Callable[..., Any]):
        self.real, self.calls = real, []

    def __call__(self, shards: Any, ids: Any, fields: Any, threads: int = 1) -> Any:
        self.calls.append((np.asarray(ids, dtype=np.int64).copy(), list(fields)))
        return self.real(shards, ids, fields, threads)


def _read_and_decompress(shards: Any, ids: np.ndarray, fields: list[str]) -> tuple[float, float]:
    """Seconds to gather the stored payloads of ``fields`` of ``ids`` from the mmaps, and to zstd-decode them."""
    import zstandard

    from cachebuild.format.decode import _gather_entries, _payloads, _plan_frames
    from cachebuild.format.names import JSON_DTYPE

    names = [n for n in fields if shards.manifest.fields[shards.field_pos[n]].dtype != JSON_DTYPE]
    names.sort(key=lambda n: -np.dtype(shards.manifest.schema(n).dtype).itemsize)
    if not names or not len(ids):
        return 0.0, 0.0
    t = time.perf_counter()
    s, local = shards.locate(ids)
    entries = _gather_entries(shards, s, local, [shards.field_pos[n] for n in names])
    frames, _ = _plan_frames(shards, ids, s, local, names, entries)
    payloads = _payloads(shards, frames)
    stored = [bytes(p) for p in payloads]  # the one copy out of the page cache
    read = time.perf_counter() - t
    if shards.codec != "zstd":
        return read, 0.0
    t = time.perf_counter()
    zstandard.ZstdDecompressor().multi_decompress_to_buffer(stored, threads=1)
    return read, time.perf_counter() - t


def stage_times(stream: Any, sample: int = 8, device: Any = None) -> dict[str, Any]:
    """Mean per-batch ms of each stage over ``sample`` batches of epoch 0 (see the module docstring)."""
    import torch

    from loaders.batch import PackedBatch
    from cachebuild.format.reader import ShardSet

    view = stream.view
    module = sys.modules[type(view).__module__]
    plan = stream.plan(0)
    picks = np.unique(np.linspace(0, plan.batches - 1, num=min(sample, plan.batches)).astype(np.int64)).tolist()
    shards = ShardSet(stream.manifest, stream.root, stream.verify)
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    dev = torch.device(device) if cuda and device is not None else (torch.device("cuda") if cuda else None)
    sums = dict.fromkeys(STAGES, 0.0)
    real = getattr(module, "read_block", None)
    view.decode_threads = 1
    try:
        # One untimed batch first: opens the shards, fills caches (not a stage of a running loader).
        buf, arrays = stream.layout.allocate(False)
        view.assemble(shards, plan.batch(picks[0]), arrays)
        for b in picks:
            items = plan.batch(b)
            rec = _Recorder(real) if real is not None else None
            if rec is not None:
                module.read_block = rec
            try:
                buf, arrays = stream.layout.allocate(False)
                t = time.perf_counter()
                view.assemble(shards, items, arrays)
                whole = time.perf_counter() - t
            finally:
                if rec is not None:
                    module.read_block = real
            read = dec = 0.0
            for ids, fields in rec.calls if rec is not None else ():
                r, d = _read_and_decompress(shards, ids, fields)
                read, dec = read + r, dec + d
            sums["read"] += read
            sums["decompress"] += dec
            sums["assemble"] += max(0.0, whole - read - dec)
            if cuda:
                packed = PackedBatch(buf, stream._spec)
                t = time.perf_counter()
                pinned = packed.pin_memory()
                sums["pin"] += time.perf_counter() - t
                torch.cuda.synchronize(dev)
                t = time.perf_counter()
                pinned.buffer.to(dev, non_blocking=True)
                torch.cuda.synchronize(dev)
                sums["copy"] += time.perf_counter() - t
    finally:
        shards.close()
    n = len(picks)
    out: dict[str, Any] = {k: (sums[k] / n * 1e3 if (cuda or k not in ("pin", "copy")) else None) for k in STAGES}
    out["sampled_batches"] = n
    return out


# --------------------------------------------------------------------------- the WebDataset reader
def _decode_sample(sample: dict) -> dict:
    """One WebDataset sample: ``.zst`` members decompressed, ``.npy`` loaded without pickle, ``.json`` parsed."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    out = {"__key__": sample["__key__"]}
    for key, value in sample.items():
        if key.startswith("__"):
            continue
        name = key
        if name.endswith(".zst"):
            value, name = dctx.decompress(value), name[:-4]
        if name.endswith(".npy"):
            out[name[:-4]] = np.load(io.BytesIO(value), allow_pickle=False)
        elif name.endswith(".json"):
            out[name[:-5] or "json"] = json.loads(value)
    return out


def _collate(samples: list[dict]) -> dict:
    """Stack each array field, zero-padded to the batch's largest shape; ``nbytes`` = decoded bytes."""
    out: dict[str, Any] = {"records": len(samples)}
    nbytes = 0
    for key, first in samples[0].items():
        if not isinstance(first, np.ndarray):
            continue
        arrays = [s[key] for s in samples]
        nbytes += sum(a.nbytes for a in arrays)
        shape = np.max([a.shape for a in arrays], axis=0) if first.ndim else ()
        batch = np.zeros((len(arrays),) + tuple(int(n) for n in shape), first.dtype)
        for i, a in enumerate(arrays):
            batch[(i,) + tuple(slice(0, n) for n in a.shape)] = a
        out[key] = batch
    out["nbytes"] = nbytes
    return out


def webdataset_batches(root: str | Path, shard_names: list[str], batch_records: int, workers: int) -> Iterable[dict]:
    """The plain WebDataset reader over a cache's shards: per-sample decode, batches of ``batch_records``."""
    try:
        import webdataset as wds
    except ImportError:
        raise ConfigError("--compare needs the webdataset package: pip install webdataset") from None
    import torch

    urls = [str(Path(root) / n) for n in shard_names]
    ds = (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=None, workersplitter=wds.split_by_worker, empty_check=False)
        .map(_decode_sample)
        .batched(batch_records, collation_fn=_collate, partial=True)
    )
    kw: dict[str, Any] = {"num_workers": workers}
    if workers > 0:
        kw.update(persistent_workers=False, prefetch_factor=4)
    return torch.utils.data.DataLoader(ds, batch_size=None, **kw)


# --------------------------------------------------------------------------- the run
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
    return plot


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
    """Drain ``cache`` through the loader and measure it (see the module docstring).

    Stops after ``batches`` batches or ``seconds`` seconds, whichever comes first
    (default: 10 s), going on into further epochs of a small cache. ``plot``: a
    PNG of the loader's wait per step and throughput (needs matplotlib).
    """

    from cachebuild.checks import finite, whole
    from cachebuild.format.manifest import read_manifest
    from loaders import ShardStream, make_loader, to_device
    from loaders.loader import shutdown_workers

    whole("--workers", workers, 0, 256)
    finite("--step-ms", step_ms, 0, 3.6e6)
    if seconds is not None:
        finite("--seconds", seconds, 0, 1e6, lo_open=True)
    if batches is not None:
        whole("--batches", batches, 2, 1 << 40)  # the first batch is warm-up
    if batch_size is not None:
        whole("--batch-size", batch_size, 1, 1 << 24)
    whole("--sample", sample, 1, 1 << 20)
    if seconds is None and batches is None:
        seconds = 10.0
    plot = _check_plot(plot)
    manifest = read_manifest(cache)
    view = view or default_view(manifest.kind)
    import loaders.views as views_mod

    try:  # views defined in modules that register themselves (mel, mel_files)
        if view not in views_mod.VIEWS and view in views_mod._LAZY_MODULES:
            __import__(views_mod._LAZY_MODULES[view])
    except ImportError:
        pass
    if view not in views_mod.VIEWS:
        for module in set(views_mod._LAZY_MODULES.values()):  # list every view there is
            try:
                __import__(module)
            except ImportError:
                pass
        raise ConfigError(f"unknown view {view!r}; choose one of: {', '.join(sorted(views_mod.VIEWS))}")
    batch_size = DEFAULT_BATCH.get(view, 256) if batch_size is None else batch_size
    consumer = consumer or ("sleep" if step_ms > 0 else "none")
    if consumer not in ("none", "sleep", "model"):
        raise ConfigError(f"unknown consumer {consumer!r}; choose none, sleep or model")
    dev = _resolve_device(device)
    if consumer == "model" and dev.type != "cuda":
        raise ConfigError("--consumer model trains a small model on the GPU, and this run has no CUDA device "
                          "(use --step-ms N to model a GPU step of N ms on a CPU-only machine)")
    options: dict[str, Any] = {"compact": True} if view == "twins" else {}
    try:
        stream = ShardStream(cache, view=view, batch_size=batch_size, shuffle=True, seed=seed, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"view {view!r} on {cache}: {exc}") from None

    # Which fields the view decodes (for the payload rate), from one recorded batch.
    stages = stage_times(stream, sample=sample, device=dev if dev.type == "cuda" else None)
    fields = _view_fields(stream)
    per_record = _decoded_bytes_per_record(stream, fields)
    plan = stream.plan(0)
    records_per_item = manifest.records / max(1, plan.total)

    def count(batch: dict) -> int:
        return int((~batch["is_pad"]).sum())

    consume = _consumer(consumer, step_ms, dev)
    t_make = time.perf_counter()
    loader = make_loader(stream, num_workers=workers, pin_memory=dev.type == "cuda")
    created_s = time.perf_counter() - t_make  # the monitor's clock starts at the first next()

    def make(epoch: int) -> Iterable[Any]:
        loader.set_epoch(epoch)
        return to_device(loader, dev) if dev.type == "cuda" else loader

    try:
        summary, done = _drain(make, count, consume, seconds, batches, plot)
    finally:
        shutdown_workers(loader)
    first_total = (summary.first_batch_s or 0.0) + created_s
    samples_per_s = summary.samples_per_s or 0.0
    records_per_s = samples_per_s * records_per_item
    result = BenchResult(
        cache=str(cache), view=view, batch_size=batch_size, workers=workers, step_ms=float(step_ms), consumer=consumer,
        device=str(dev), codec=manifest.codec.name, batches=done, records_per_s=records_per_s, samples_per_s=samples_per_s,
        payload_mb_per_s=records_per_s * per_record / 1e6,
        batch_mb_per_s=summary.batches_per_s * stream.layout.nbytes / 1e6,
        first_batch_s=first_total, wait_fraction=summary.wait_fraction, wait_p95_ms=summary.wait_p95_ms, wall_s=summary.wall_s,
        stages_ms=stages,
    )
    if compare:
        items_per_record = plan.total / max(1, manifest.records)
        result.compare = _compare(stream, manifest, batch_size, items_per_record, workers, consume, seconds, batches)
    return result


def _view_fields(stream: Any) -> list[str]:
    """The stored fields the view decodes for one batch (recorded from its ``read_block`` call)."""
    from cachebuild.format.reader import ShardSet

    view = stream.view
    module = sys.modules[type(view).__module__]
    real = getattr(module, "read_block", None)
    if real is None:
        return [f.name for f in stream.manifest.fields]
    rec = _Recorder(real)
    shards = ShardSet(stream.manifest, stream.root, stream.verify)
    module.read_block = rec
    try:
        _, arrays = stream.layout.allocate(False)
        view.reset()  # records already decoded by an earlier batch would not be read again
        view.assemble(shards, stream.plan(0).batch(0), arrays)
    finally:
        module.read_block = real
        shards.close()
    from cachebuild.format.names import JSON_DTYPE

    names = list(dict.fromkeys(n for _, fields in rec.calls for n in fields))
    return [n for n in names if stream.manifest.schema(n).dtype != JSON_DTYPE]


def _compare(stream: Any, manifest: Any, batch_size: int, items_per_record: float, workers: int,
             consume: Callable[[Any], None] | None, seconds: float | None, batches: int | None) -> dict[str, Any]:
    from loaders.loader import shutdown_workers

    batch_records = max(1, round(batch_size / max(items_per_record, 1e-9)))
    names = [s.name for s in manifest.shards]
    loader = webdataset_batches(stream.root, names, batch_records, workers)
    state = {"records": 0, "bytes": 0}

    def count(batch: dict) -> int:
        state["records"] += batch["records"]
        state["bytes"] += batch["nbytes"]
        return batch["records"]

    try:
        summary, done = _drain(lambda epoch: loader, count, consume, seconds, batches)
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


# --------------------------------------------------------------------------- output
def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}{unit}"
        return f"{v:.3g}{unit}" if abs(v) < 10 else f"{v:.1f}{unit}"
    return f"{v}{unit}"


def format_table(r: BenchResult) -> list[str]:
    """The result as aligned lines (one column per reader when ``compare`` ran)."""
    head = [f"cache {r.cache}: view {r.view}, batch {r.batch_size}, {r.workers} worker(s), codec {r.codec}, "
            f"device {r.device}, consumer {r.consumer}" + (f" ({r.step_ms:g} ms/step)" if r.consumer == "sleep" else "")]
    c = r.compare
    rows: list[tuple[str, str, str]] = [
        ("batches", _fmt(r.batches), _fmt(c["batches"]) if c else ""),
        ("records/s", _fmt(r.records_per_s), _fmt(c["records_per_s"]) if c else ""),
        ("samples/s", _fmt(r.samples_per_s), _fmt(c["samples_per_s"]) if c else ""),
        ("payload MB/s", _fmt(r.payload_mb_per_s), _fmt(c["payload_mb_per_s"]) if c else ""),
        ("time to first batch", _fmt(r.first_batch_s, " s"), _fmt(c["first_batch_s"], " s") if c else ""),
        ("wait fraction" + (" (no consumer: all of it)" if r.consumer == "none" else ""), f"{r.wait_fraction:.1%}", f"{c['wait_fraction']:.1%}" if c else ""),
        ("wait p95", _fmt(r.wait_p95_ms, " ms"), _fmt(c["wait_p95_ms"], " ms") if c else ""),
    ]
    w0 = max(len(k) for k, _, _ in rows + [("stage (ms/batch)", "", "")])
    w1 = max(len("cachebuild"), *(len(v) for _, v, _ in rows))
    lines = head + [f"  {'':<{w0}}  {'cachebuild':>{w1}}" + ("  webdataset" if c else "")]
    for k, a, b in rows:
        lines.append(f"  {k:<{w0}}  {a:>{w1}}" + (f"  {b:>10}" if c else ""))
    sm = r.stages_ms
    lines.append(f"  stage ms/batch (mean of {sm.get('sampled_batches', 0)} batches, 1 thread, in-process):")
    for k in STAGES:
        lines.append(f"    {k:<{w0 - 2}}  {_fmt(sm.get(k), ''):>{w1}}")
    return lines
