"""Fixtures and helpers of the loader tests: small causal caches, reference reads, a DDP rank body.

Imported by the ``test_loader_*`` modules (pytest registers the fixtures they import).
The DDP body lives here so that ``torch.multiprocessing.spawn`` children can import it.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from cachebuild.format import read_manifest
from gloo_rank import gloo_rank
from rank_stacks import collect, kill_tree
from ports import free_port  # noqa: F401  (re-exported for the test modules)

CAUSAL_GRAPHS = 200


def build_causal(out: Path, graphs: int = CAUSAL_GRAPHS, codec: str = "zstd", shard_mb: float = 0.5, seed: int = 0, pack: int | None = None) -> Path:
    """A small causal cache built by the real generator (several shards of a few graphs); one
    member per record and field unless ``pack`` is given (the default for records this size)."""
    from cachebuild.jobs import run_causal_build

    overrides = [] if codec == "zstd" else [f'build.codec="{codec}"']
    overrides += [] if pack is None else [f"build.pack={pack}"]
    run_causal_build(None, overrides, {"graphs": graphs, "build.shard_mb": shard_mb, "seed": seed}, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def causal_cache(tmp_path_factory) -> Path:
    return build_causal(tmp_path_factory.mktemp("lcausal") / "cache")


@pytest.fixture(scope="session")
def causal_cache_raw(tmp_path_factory) -> Path:
    return build_causal(tmp_path_factory.mktemp("lcausalraw") / "cache", codec="none")


@pytest.fixture(scope="session")
def causal_cache_packed(tmp_path_factory) -> Path:
    """Groups of 7 graphs per member (so groups are short and the last one uneven), zstd."""
    return build_causal(tmp_path_factory.mktemp("lcausalpacked") / "cache", pack=7)


class Reference:
    """Records read one by one with nothing of ours but the manifest: Python's ``tarfile``, ``zstd``
    and ``np.load`` on the members (the format's promise to WebDataset users), so a fault in the
    index or in the loader's decoder cannot hide in the ground truth."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.manifest = read_manifest(root)
        self.starts = self.manifest.shard_starts()
        self._members: dict[int, dict[str, bytes]] = {}

    def _shard(self, s: int) -> dict[str, bytes]:
        if s not in self._members:
            with tarfile.open(self.root / self.manifest.shards[s].name) as tf:
                self._members[s] = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        return self._members[s]

    def record(self, rid: int) -> dict[str, Any]:
        """Record ``rid`` from its members: in a packed shard, the group's member (all its zstd
        frames, as ``zstd -d`` reads them), one line of JSON Lines, one row of a stacked array,
        or a ragged record's slice of the flat array (the shapes from the ``.idx.npy``, read with ``np.load``)."""
        s = self.shard_of(rid)
        members, entry = self._shard(s), self.manifest.shards[s]
        zst = self.manifest.codec.name == "zstd"
        local = rid - entry.first_record
        key, i = entry.first_record + local // entry.pack * entry.pack, local % entry.pack
        raw_index = (self.root / entry.index).read_bytes()  # .idx.npy, or one zstd frame (.idx.npy.zst)
        if entry.index.endswith(".zst"):
            raw_index = zstandard.ZstdDecompressor().decompress(raw_index)
        rows = np.load(io.BytesIO(raw_index))[key - entry.first_record :][: entry.pack]
        out: dict[str, Any] = {}
        for j, f in enumerate(self.manifest.fields):
            packed_json = ".jsonl" if entry.pack > 1 else ""
            name = f"{key:010d}.{f.name}" + (packed_json if f.dtype == "json" else ".npy") + (".zst" if zst else "")
            data = zstandard.ZstdDecompressor().stream_reader(members[name], read_across_frames=True).read() if zst else members[name]
            if f.dtype == "json":
                out[f.name] = json.loads(data.split(b"\n")[i])
                continue
            arr = np.load(io.BytesIO(data), allow_pickle=False)
            if entry.pack == 1:
                out[f.name] = arr
                continue
            shapes = rows["shape"][:, j, : f.ndim]
            if arr.shape == (len(rows), *shapes[i]):
                out[f.name] = arr[i]
            else:
                sizes = np.prod(shapes, axis=1)
                out[f.name] = arr[int(sizes[:i].sum()) : int(sizes[: i + 1].sum())].reshape(shapes[i])
        return out

    def shard_of(self, rid: int) -> int:
        return int(np.searchsorted(self.starts, rid, side="right") - 1)


def padded(arr: np.ndarray, shape: tuple[int, ...], fill: float = 0, dtype: Any = None) -> np.ndarray:
    """``arr`` zero-padded (or ``fill``-padded) to ``shape``."""
    out = np.full(shape, fill, dtype=dtype or arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def real_record_ids(batches) -> list[int]:
    """Record ids of the real (not padding) rows of ``batches``, in order."""
    return [r for b in batches for r in b["record_id"][~b["is_pad"]].tolist()]


def all_batches_equal(a: list, b: list) -> bool:
    """Two batch sequences equal bit for bit (same length, each pair :func:`batches_equal`)."""
    return len(a) == len(b) and all(batches_equal(x, y) for x, y in zip(a, b))


def batches_equal(a: dict, b: dict) -> bool:
    """Bit-for-bit equality of two batches (same keys, dtypes, shapes, bytes)."""
    if list(a) != list(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not np.array_equal(x.numpy().view(np.uint8), y.numpy().view(np.uint8)):
            return False
    return True


def spawn_ranks(main: Any, args: tuple, world: int, out_dir: Path, deadline_s: float) -> list[dict]:
    """Run ``main(rank, *args)`` on ``world`` spawned ranks, killing them all (and failing the test with the
    stacks of every rank and worker, :mod:`rank_stacks`) past ``deadline_s``; each rank writes ``out_dir/rank{r}.json``, read back here and checked for an ``error``."""
    import torch.multiprocessing as tmp

    ctx = tmp.start_processes(main, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            stacks = collect([p.pid for p in ctx.processes], out_dir)  # of the ranks and their workers, before they go
            kill_tree([p.pid for p in ctx.processes])
            pytest.fail(f"DDP ranks did not finish within {deadline_s} s (hang?); their stacks:\n{stacks}")
    results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}:\n{res['error']}"
    return results


def ddp_rank_main(rank: int, world: int, port: int, root: str, out_dir: str, runs: list[tuple[str, int, int, dict]]) -> None:
    """One DDP rank (gloo on loopback): per run ``(view, batch_size, num_workers, options)``,
    a training-style loop with an all_reduce per step.

    Writes ``out_dir/rank{r}.json``: per run, the ids and pad flags of every batch, steps, len, state.
    """

    import torch
    import torch.distributed as dist

    from loaders import ShardStream, make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        for i, (view, batch_size, nw, options) in enumerate(runs):
            t0 = time.perf_counter()
            stream = ShardStream(root, view=view, batch_size=batch_size, shuffle=True, seed=3, **options)
            # fork: a spawned rank's default start method is spawn, which re-imports torch per worker
            loader = make_loader(stream, num_workers=nw, prefetch_factor=2, multiprocessing_context="fork" if nw else None)
            loader.set_epoch(1)
            seen = []
            steps = 0
            for batch in loader:
                if view == "twins":
                    graph = batch["ctx_record_id"][batch["graph_index"]] if "graph_index" in batch else batch["graph_id"]
                    ids = torch.stack([graph, batch["int_index"], batch["row_index"]], 1)
                else:
                    ids = batch["record_id"]
                seen.append((ids.tolist(), batch["is_pad"].tolist()))
                t = torch.tensor([float(batch["is_pad"].logical_not().sum())])
                dist.all_reduce(t)  # a rank with fewer steps would hang here
                steps += 1
            total = torch.tensor([float(sum(len(p) - sum(p) for _, p in seen))])
            dist.all_reduce(total)
            result[str(i)] = {"batches": seen, "steps": steps, "len": len(loader), "state": loader.state_dict(), "total": total.item(), "seconds": time.perf_counter() - t0}


def batch_digest(batch: dict) -> str:
    """sha256 over a batch's keys, dtypes, shapes and bytes (compares batches across processes)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in batch.items():
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def resume_digests(root: str, state: dict, view: str, batch_size: int, num_workers: int, options: dict) -> list[str]:
    """In a fresh process: load ``state`` into a new loader and digest the batches that remain."""
    from loaders import ShardStream, make_loader

    stream = ShardStream(root, view=view, batch_size=batch_size, seed=state["seed"], **options)
    loader = make_loader(stream, num_workers=num_workers, prefetch_factor=2)
    loader.load_state_dict(state)
    loader.set_epoch(state["epoch"])
    return [batch_digest(b) for b in loader]


def resume_digests_to_queue(queue: Any, *args: Any) -> None:
    """:func:`resume_digests` for a (non-daemonic) child process; the result or the error goes to ``queue``."""
    try:
        queue.put(resume_digests(*args))
    except Exception:
        queue.put(traceback.format_exc())


def build_mel_from_arrays(out: Path, files: int, seed: int = 0, codec: str = "none", shard_mb: float = 4.0) -> Path:
    """A mel cache of ``files`` files at the users' shape ([40, 2, 64, 1] float16), built by the real
    builder from a file in the users' HDF5 layout (stored mels copied through: fast even for thousands of files)."""
    import h5py

    from cachebuild.jobs import run_mel_build

    rng = np.random.default_rng(seed)
    h5 = Path(out).parent / f"{Path(out).name}-src.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("labels", data=rng.integers(0, 2, files).astype(np.int16))
        f.create_dataset("segments_mel", data=rng.uniform(-90, 10, (files, 40, 2, 64, 1)).astype(np.float16))
        f.attrs["config_json"] = json.dumps({"sr": 4096, "n_fft": 512, "hop_length": 128, "n_mels": 64, "fmin": 0.0})
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    run_mel_build(None, [], {"build.shard_mb": shard_mb, "build.codec": codec}, out, from_h5=h5, workers=1, progress=False)
    return out
