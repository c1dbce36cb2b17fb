"""Peers and baselines for the loader benchmark, measured on the same cache.

Each ``*_rate`` function runs one reader for about ``limit_s`` seconds and
returns a dict of plain numbers; ``benchmarks/bench_load.py`` puts them next to
our loader's. All readers deliver what a training step needs: batches of torch
tensors, variable-n arrays zero-padded to the largest n in the batch (the
collation a user would write, :func:`pad_collate`).

* :func:`webdataset_rate`: ``webdataset.WebDataset`` over our shards with a
  small ``.zst`` member decoder, per-sample decode, ``.batched``
  (:mod:`loaders.bench.webdataset`, the reader ``cachebuild bench --compare`` uses too).
* :func:`litdata_prepare` / :func:`litdata_prepare_mel_segments` /
  :func:`litdata_rate`: the same records rewritten by ``litdata.optimize``
  and read with ``StreamingDataset`` + ``StreamingDataLoader``.
* :func:`decompression_limit`: the physical limit, zstd decompression of every
  member payload plus one memory copy (or the copy alone for raw caches).
* :func:`onthefly_vectorised_rate`: generating the records on the fly with our
  vectorised generator (linear SEM) inside an ``IterableDataset``.
* :func:`user_pipeline_rate`: the users' per-row pipeline
  (``benchmarks/user_pipeline.py``).

Timing: the clock for ``first_batch_s`` starts before the loader (and its
workers) are created; the rate is then measured after ``1 + 2 * num_workers``
warm-up batches (which drain what the workers prefetched), over whole batches,
for ``limit_s`` seconds. A finite dataset that runs out is started again
(persistent workers), as training does. Optional packages (webdataset, litdata)
are imported inside the functions that need them.

    python benchmarks/peers.py    # smoke run: 3,000-graph caches in /dev/shm, prints every peer
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).parent))
from cachebuild.format import Manifest, ShardSet, open_cache, read_manifest, read_record  # noqa: E402
from loaders.bench.webdataset import BYTES_KEY, COUNT_KEY, pad_collate, webdataset_pipeline  # noqa: E402
from loaders.loader import shutdown_workers  # noqa: E402

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # no PyPI request from litdata.optimize

__all__ = [
    "pad_collate",
    "webdataset_rate",
    "installed",
    "litdata_prepare",
    "litdata_prepare_mel_segments",
    "litdata_optimize",
    "litdata_rate",
    "decompression_limit",
    "onthefly_vectorised_rate",
    "user_pipeline_rate",
]


# --------------------------------------------------------------------------- shared


def installed(package: str) -> bool:
    """Whether a peer's package can be imported; prints a note when it cannot (the peer is skipped)."""
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        return True
    print(f"{package}: not installed; its peer is skipped (make bench-deps installs the peers)", flush=True)
    return False


def _collated_counts(batch: dict) -> tuple[int, int]:
    return int(batch[COUNT_KEY]), int(batch[BYTES_KEY])


@dataclass
class _Restarting:
    """An iterator over ``iterable`` that starts it again when it runs out (counting epochs)."""

    iterable: Iterable
    epochs: int = 0

    def __post_init__(self) -> None:
        self._it = iter(self.iterable)

    def next(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self.epochs += 1
            self._it = iter(self.iterable)
            return next(self._it)


def _measure(
    make_loader: Callable[[], Iterable],
    count: Callable[[Any], tuple[int, int]],
    limit_s: float,
    warmup_batches: int = 1,
) -> dict[str, float]:
    """Time to the first batch, then items/s and bytes/s over ``limit_s`` after warm-up."""
    t0 = time.perf_counter()
    loader = make_loader()
    try:
        return _measure_loader(loader, count, limit_s, warmup_batches, t0)
    finally:
        shutdown_workers(loader)


def _measure_loader(loader: Iterable, count: Callable, limit_s: float, warmup_batches: int, t0: float) -> dict[str, float]:
    batches = _Restarting(loader)
    batches.next()
    first_batch_s = time.perf_counter() - t0
    for _ in range(warmup_batches - 1):
        batches.next()
    items = nbytes = steps = 0
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < limit_s:
        n, b = count(batches.next())
        items, nbytes, steps = items + n, nbytes + b, steps + 1
    wall = time.perf_counter() - t1
    return {
        "items_per_s": items / wall,
        "mb_per_s": nbytes / wall / 1e6,
        "first_batch_s": first_batch_s,
        "batches": steps,
        "epochs_restarted": batches.epochs,
    }


def _warmup(num_workers: int) -> int:
    return 1 + 2 * num_workers


def _graph_result(m: dict[str, float], unit: str = "graphs") -> dict[str, float]:
    """Rename ``_measure``'s generic keys for a reader of ``unit``."""
    return {
        f"{unit}_per_s": m["items_per_s"],
        "payload_mb_per_s": m["mb_per_s"],
        "first_batch_s": m["first_batch_s"],
        "batches": m["batches"],
        "epochs_restarted": m["epochs_restarted"],
    }


def _loader_kwargs(num_workers: int) -> dict[str, Any]:
    return {"num_workers": num_workers, "persistent_workers": num_workers > 0}


def _unit(cache_dir: str | Path) -> str:
    """What one record of a cache is: a graph, or (mel caches) an audio file."""
    return "files" if read_manifest(cache_dir).kind == "mel" else "graphs"


# --------------------------------------------------------------------------- WebDataset


def webdataset_rate(cache_dir: str | Path, num_workers: int, batch_size: int, limit_s: float, shuffle: bool = True) -> dict:
    """Graphs/s, decoded payload MB/s and time to the first batch of WebDataset over our shards.

    Batches are made in the workers (``.batched``), the DataLoader only
    forwards them (``batch_size=None``). Returns ``graphs_per_s``,
    ``payload_mb_per_s``, ``first_batch_s`` (and ``batches``, ``epochs_restarted``).
    """

    def make():
        ds = webdataset_pipeline(cache_dir, batch_size, shuffle)
        return torch.utils.data.DataLoader(ds, batch_size=None, **_loader_kwargs(num_workers))

    return _graph_result(_measure(make, _collated_counts, limit_s, _warmup(num_workers)), _unit(cache_dir))


# --------------------------------------------------------------------------- LitData


def _open_shard(cache_dir: str, shard: int) -> tuple[ShardSet, int]:
    """The cache's shards (the format's one reader) and the first record id of ``shard``."""
    shards = open_cache(cache_dir)
    return shards, shards.manifest.shards[shard].first_record


def _array_fields(manifest: Manifest) -> list[str]:
    return [f.name for f in manifest.fields if f.dtype != "json"]


def _causal_samples(task: tuple[str, int, int, int]) -> Iterator[dict[str, np.ndarray]]:
    """litdata.optimize fn: one sample per graph (its array fields) for records [a, b) of a shard."""
    cache_dir, shard, a, b = task
    shards, first = _open_shard(cache_dir, shard)
    with shards:
        names = _array_fields(shards.manifest)
        for r in range(a, b):
            rec = read_record(shards, first + r)
            yield {k: rec[k] for k in names}


def _mel_segment_samples(task: tuple[str, int, int, int]) -> Iterator[dict[str, np.ndarray]]:
    """litdata.optimize fn: one sample per mel segment ``[n_mels, t]`` float16 plus the file's label."""
    cache_dir, shard, a, b = task
    shards, first = _open_shard(cache_dir, shard)
    with shards:
        for r in range(a, b):
            rec = read_record(shards, first + r)
            mel = rec["mel"]  # [num_long, num_short, n_mels, t]
            label = np.array(rec["label"], dtype=np.int16)
            for seg in mel.reshape(-1, *mel.shape[-2:]):
                yield {"mel": np.ascontiguousarray(seg), "label": label}


def _tasks(cache_dir: str | Path, records_per_task: int = 256) -> list[tuple[str, int, int, int]]:
    """(cache, shard, first, stop) work items of at most ``records_per_task`` records."""
    manifest = read_manifest(cache_dir)
    return [(str(cache_dir), i, a, min(a + records_per_task, s.records)) for i, s in enumerate(manifest.shards) for a in range(0, s.records, records_per_task)]


def _optimize(fn: Callable, cache_dir: str | Path, out_dir: str | Path, compression: str | None, level: str | None) -> Path:
    """``litdata.optimize`` of ``fn`` over the cache's record ranges (:func:`_tasks`)."""
    return litdata_optimize(fn, _tasks(cache_dir), out_dir, compression, level)


def litdata_optimize(fn: Callable, inputs: list, out_dir: str | Path, compression: str | None, compression_level: str | None = None) -> Path:
    """Run ``litdata.optimize(fn, inputs)`` in a fresh (spawned) process and return ``out_dir``.

    ``fn`` (importable: module level) yields the samples of one input; chunks of
    ~64 MB, 2 workers. After ``litdata.optimize`` has run in a process,
    DataLoader workers later forked from it abort at exit ("terminate called
    without an active exception"), so the benchmark process itself never calls it.
    """
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(target=_optimize_here, args=(fn, inputs, str(out_dir), compression, compression_level))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"litdata.optimize into {out_dir} failed (exit code {proc.exitcode})")
    return Path(out_dir)


def _optimize_here(fn: Callable, inputs: list, out_dir: str, compression: str | None, level: str | None) -> None:
    import litdata

    litdata.optimize(
        fn=fn,
        inputs=inputs,
        output_dir=out_dir,
        chunk_bytes="64MB",
        num_workers=2,
        compression=compression,
        compression_level=level if compression else None,
        mode="overwrite",
        verbose=False,
    )


def litdata_prepare(cache_dir: str | Path, out_dir: str | Path, compression: str | None = "zstd", compression_level: str | None = None) -> Path:
    """Rewrite a causal cache with ``litdata.optimize``: one sample per graph, a dict of its arrays.

    Records are read from our shards with :func:`cachebuild.format.read_record`; chunks of
    ~64 MB, 2 workers, ``compression`` ``"zstd"`` or ``None``.
    ``compression_level`` is LitData's framing: ``None`` = its default
    (``"batch"``: zstd frames of 256 samples inside each chunk), ``"chunk"``
    (whole-chunk zstd, inflated once into the reader's cache dir) or
    ``"sample"``. Returns ``out_dir``.
    """
    return _optimize(_causal_samples, cache_dir, out_dir, compression, compression_level)


def litdata_prepare_mel_segments(mel_cache_dir: str | Path, out_dir: str | Path, compression: str | None = "zstd", compression_level: str | None = None) -> Path:
    """Rewrite a mel cache with ``litdata.optimize``: one sample per segment (``mel`` [n_mels, t] float16, ``label``)."""
    return _optimize(_mel_segment_samples, mel_cache_dir, out_dir, compression, compression_level)


def litdata_rate(
    optimized_dir: str | Path,
    num_workers: int,
    batch_size: int,
    limit_s: float,
    shuffle: bool = True,
    batch_decode: bool | str = "auto",
) -> dict:
    """Samples/s, decoded payload MB/s and time to the first batch of StreamingDataset + StreamingDataLoader.

    ``batch_decode`` is passed to ``StreamingDataset`` (LitData's default
    ``"auto"`` decodes windows of rows at once; with ``shuffle`` and workers
    it re-decodes windows, ``False`` decodes one sample at a time). Returns
    ``graphs_per_s`` (causal) or ``samples_per_s`` (mel segments),
    ``payload_mb_per_s``, ``first_batch_s``.
    """
    from litdata import StreamingDataLoader, StreamingDataset

    cache = tempfile.mkdtemp(prefix="litdata-cache-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)

    def make():
        ds = StreamingDataset(str(optimized_dir), cache_dir=cache, shuffle=shuffle, seed=0, batch_decode=batch_decode)
        return StreamingDataLoader(ds, batch_size=batch_size, collate_fn=pad_collate, **_loader_kwargs(num_workers))

    try:
        m = _measure(make, _collated_counts, limit_s, _warmup(num_workers))
        return _graph_result(m, _litdata_unit(optimized_dir))
    finally:
        _rmtree(cache)


def _litdata_unit(optimized_dir: str | Path) -> str:
    """``samples`` for a mel-segment dataset (its samples hold ``mel``), else ``graphs``."""
    spec = json.loads((Path(optimized_dir) / "index.json").read_text())["config"]["data_spec"]
    return "samples" if '\\"mel\\"' in spec else "graphs"


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- physical limit


def _payloads(cache_dir: str | Path, sample_graphs: int) -> tuple[list[bytes], int, int]:
    """Stored payloads of every member of the first ``sample_graphs`` records, their count, decoded array bytes.
    A zstd frame that consecutive records share (format v4) is taken once, as the loader decodes it."""
    manifest = read_manifest(cache_dir)
    arrays = set(_array_fields(manifest))
    frames: list[bytes] = []
    records = array_bytes = 0
    with open_cache(cache_dir) as shards:
        for shard in range(len(manifest.shards)):
            sh = shards.shard(shard)
            last = [-1] * len(manifest.fields)  # per field: the offset of the frame taken last
            for r in range(min(len(sh.index), sample_graphs - records)):
                for j, f in enumerate(manifest.fields):
                    e = sh.index[r, j]
                    if int(e["offset"]) != last[j]:
                        frames.append(bytes(sh.view[int(e["offset"]) : int(e["offset"]) + int(e["size"])]))
                        last[j] = int(e["offset"])
                    array_bytes += int(e["nbytes"]) if f.name in arrays else 0
                records += 1
            shards.release([shard])
            if records >= sample_graphs:
                break
    return frames, records, array_bytes


def _decode_into(frames: list[bytes], out: np.ndarray, offset: int, zstd: bool) -> int:
    """Decompress (or not) each frame and copy it into ``out`` from ``offset``; returns the end offset."""
    dctx = zstandard.ZstdDecompressor() if zstd else None
    for f in frames:
        data = dctx.decompress(f) if dctx else f
        n = len(data)
        out[offset : offset + n] = np.frombuffer(data, np.uint8)
        offset += n
    return offset


def _decoded_sizes(frames: list[bytes], zstd: bool) -> list[int]:
    if not zstd:
        return [len(f) for f in frames]
    return [zstandard.frame_content_size(f) for f in frames]


def _time_threads(frames: list[bytes], threads: int, zstd: bool, repeats: int) -> float:
    """Best wall time of decoding all frames into one buffer with ``threads`` threads (contiguous parts)."""
    sizes = _decoded_sizes(frames, zstd)
    out = np.empty(sum(sizes), np.uint8)
    out[:] = 0  # fault the pages in once, outside the timing
    bounds = np.linspace(0, len(frames), threads + 1).astype(int)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = [(frames[a:b], int(starts[a])) for a, b in zip(bounds[:-1], bounds[1:])]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(lambda p: _decode_into(p[0], out, p[1], zstd), parts))
            best = min(best, time.perf_counter() - t)
    return best


def _time_multi(frames: list[bytes], threads: int, repeats: int) -> float:
    """Best wall time of zstandard's C-threaded ``multi_decompress_to_buffer`` plus one copy of its output."""
    dctx = zstandard.ZstdDecompressor()
    out = np.zeros(sum(_decoded_sizes(frames, True)), np.uint8)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        result = dctx.multi_decompress_to_buffer(frames, threads=threads)
        offset = 0
        for i in range(len(result)):
            data = np.frombuffer(result[i], np.uint8)
            out[offset : offset + len(data)] = data
            offset += len(data)
        best = min(best, time.perf_counter() - t)
    return best


def decompression_limit(cache_dir: str | Path, cores: int, sample_graphs: int = 3000, repeats: int = 3) -> dict:
    """The physical limit of a loader on this cache: per-member zstd decompression + one memory copy.

    All member payloads of the first ``sample_graphs`` records are held in
    memory, then decoded into one buffer: single-threaded, and with ``cores``
    threads (a thread pool over contiguous parts, and zstandard's
    ``multi_decompress_to_buffer``; the better one counts). For a raw cache
    (``--codec none``) the limit is the memory copy alone. MB/s are decoded
    array bytes (the measure of the loaders' ``payload_mb_per_s``). Returns
    ``mb_per_s_1core``, ``mb_per_s_all``, ``graphs_per_s_all``,
    ``memcpy_mb_per_s_1core`` (the copy alone), ``codec`` and ``all_method``.
    """
    frames, records, array_bytes = _payloads(cache_dir, sample_graphs)
    zstd = read_manifest(cache_dir).codec.name == "zstd"
    one = _time_threads(frames, 1, zstd, repeats)
    memcpy = one if not zstd else _time_threads(frames, 1, False, repeats)
    alls = {"threadpool": _time_threads(frames, cores, zstd, repeats)}
    if zstd:
        alls["multi_decompress_to_buffer"] = _time_multi(frames, cores, repeats)
    method, best = min(alls.items(), key=lambda kv: kv[1])
    mb = array_bytes / 1e6
    return {
        "mb_per_s_1core": mb / one,
        "mb_per_s_all": mb / best,
        "graphs_per_s_all": records / best,
        "memcpy_mb_per_s_1core": array_bytes / 1e6 / memcpy,
        "codec": "zstd" if zstd else "none",
        "all_method": method,
        "sample_records": records,
    }


# --------------------------------------------------------------------------- on-the-fly baselines


class OnTheFlyCausal(torch.utils.data.IterableDataset):
    """Generates padded batches of ``batch_graphs`` linear-SEM graphs per step with our vectorised generator."""

    def __init__(self, batch_graphs: int, seed: int = 0):
        self.batch_graphs, self.seed = batch_graphs, seed

    def __iter__(self) -> Iterator[dict]:
        from cachebuild.causal import generate_graphs, parse_causal_config

        info = torch.utils.data.get_worker_info()
        rng = np.random.default_rng([self.seed, info.id if info else 0])
        cfg = parse_causal_config({"mechanism": {"kind": "linear"}})
        while True:
            yield pad_collate(generate_graphs(cfg, rng, self.batch_graphs))


def onthefly_vectorised_rate(num_workers: int, batch_graphs: int, limit_s: float) -> dict:
    """Graphs/s of generating linear-SEM records on the fly (vectorised over each batch) in DataLoader workers.

    Returns ``graphs_per_s``, ``payload_mb_per_s``, ``first_batch_s``.
    """

    def make():
        return torch.utils.data.DataLoader(OnTheFlyCausal(batch_graphs), batch_size=None, **_loader_kwargs(num_workers))

    return _graph_result(_measure(make, _collated_counts, limit_s, _warmup(num_workers)))


def _user_rows_per_graph(n_range: tuple[int, int] = (5, 10), rows: int = 64, coeffs: int = 4, prob: float = 0.5) -> float:
    """Mean twin rows one graph yields in the users' pipeline (n uniform in n_range)."""
    ns = np.arange(n_range[0], n_range[1] + 1)
    return float(np.mean([max(1, int(n * prob)) for n in ns]) * coeffs * rows)


def user_pipeline_rate(num_workers: int, batch_size: int, limit_s: float) -> dict:
    """Twin rows/s of the users' ``UserStyleCausalDataset`` + ``collate_fn_pad`` (``batch_size`` rows).

    ``graphs_per_s`` divides by the pipeline's mean rows per graph (896 for
    n in 5..10). ``batch_mb_per_s`` counts every tensor of the batches,
    including the per-row copies of each graph's context.
    """
    from user_pipeline import UserStyleCausalDataset, collate_fn_pad

    def make():
        ds = UserStyleCausalDataset(seed=0)
        return torch.utils.data.DataLoader(ds, batch_size=batch_size, collate_fn=collate_fn_pad, **_loader_kwargs(num_workers))

    def count(batch: dict) -> tuple[int, int]:
        return len(batch["delta"]), sum(v.nbytes for v in batch.values())

    m = _measure(make, count, limit_s, _warmup(num_workers))
    return {
        "rows_per_s": m["items_per_s"],
        "graphs_per_s": m["items_per_s"] / _user_rows_per_graph(),
        "batch_mb_per_s": m["mb_per_s"],
        "first_batch_s": m["first_batch_s"],
        "batches": m["batches"],
    }


# --------------------------------------------------------------------------- smoke run


def _fmt(d: dict) -> str:
    return ", ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())


def _print_litdata(name: str, optimized: Path, batch_size: int, limit_s: float) -> None:
    for w, bd in ((0, "auto"), (2, "auto"), (2, False)):
        print(f"{name}, workers={w}, batch_decode={bd}", _fmt(litdata_rate(optimized, w, batch_size, limit_s, batch_decode=bd)))


def _build_smoke_caches(root: Path, graphs: int, mel_files: int) -> tuple[Path, Path, Path]:
    """zstd and raw causal caches and a synthetic mel cache under ``root``; stops the builder's pool after."""
    from joblib.externals.loky import get_reusable_executor

    from cachebuild.jobs import run_causal_build, run_mel_build

    zst, raw, mel = root / "causal-zstd", root / "causal-raw", root / "mel"
    run_causal_build(None, [], {"graphs": graphs}, zst, progress=False)
    run_causal_build(None, [], {"graphs": graphs, "build.codec": "none"}, raw, progress=False)
    run_mel_build(None, [], {}, mel, synthetic=mel_files, progress=False)
    get_reusable_executor().shutdown(wait=True)  # no pool threads left when DataLoader workers fork
    return zst, raw, mel


def _smoke_litdata(root: Path, zst: Path, mel: Path, limit_s: float) -> None:
    if not (installed("litdata") and installed("zstd")):  # LitData's zstd compression needs the zstd package
        return
    for comp in ("zstd", None):
        out = litdata_prepare(zst, root / f"lit-{comp}", comp)
        _print_litdata(f"litdata[{comp}]", out, 256, limit_s)
    seg = litdata_prepare_mel_segments(mel, root / "lit-mel", "zstd")
    _print_litdata("litdata mel segments[zstd]", seg, 4096, limit_s)


def _smoke(graphs: int, mel_files: int, limit_s: float, user_batch: int = 4096) -> None:
    """Build small caches in /dev/shm and print every peer's numbers (a few minutes on 2 cores)."""
    root = Path(tempfile.mkdtemp(prefix="peers-smoke-", dir="/dev/shm"))
    try:
        zst, raw, mel = _build_smoke_caches(root, graphs, mel_files)
        for name, cache in (("zstd", zst), ("raw", raw)):
            print(f"decompression_limit[{name}]", _fmt(decompression_limit(cache, 2)))
            for w in (0, 2) if installed("webdataset") else ():
                print(f"webdataset[{name}, workers={w}]", _fmt(webdataset_rate(cache, w, 256, limit_s)))
        _smoke_litdata(root, zst, mel, limit_s)
        for w in (0, 2):
            print(f"onthefly_vectorised[workers={w}]", _fmt(onthefly_vectorised_rate(w, 256, limit_s)))
            print(f"user_pipeline[workers={w}, batch={user_batch}]", _fmt(user_pipeline_rate(w, user_batch, limit_s)))
    finally:
        _rmtree(str(root))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Smoke run of every peer on small caches built in /dev/shm.")
    ap.add_argument("--graphs", type=int, default=3000)
    ap.add_argument("--mel-files", type=int, default=1000, help="synthetic mel files (80 segments each)")
    ap.add_argument("--limit-s", type=float, default=5.0, help="seconds measured per reader")
    ap.add_argument("--user-batch", type=int, default=4096, help="twin rows per batch of the users' per-row pipeline")
    from _results import quick_defaults

    # quick: the users' pipeline makes every row in Python (~5,000 rows/s a core): 512-row batches keep its warm-up short
    quick_defaults(ap, graphs=300, mel_files=20, limit_s=0.3, user_batch=512)
    args = ap.parse_args()
    _smoke(args.graphs, args.mel_files, args.limit_s, args.user_batch)
