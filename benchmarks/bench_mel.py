"""Mel caches end to end: training reads, file-level evaluation, build from WAV, codecs.

On the same data (``--files`` synthetic files written in the users' HDF5
layout, and caches built from that file with ``run_mel_build``), in one run:

  (a) segments/s through our ``mel`` view (``ShardStream`` + ``make_loader``,
      0 and 2 workers) vs. a faithful re-implementation of the users' HDF5
      per-item Dataset (h5py opened lazily per worker with a chunk cache, one
      segment per ``__getitem__``, default collate, ``shuffle=True``), same
      batch size, 0 and 2 workers; target >= 20x;
  (b) LitData storing one segment per sample (``benchmarks/peers.py``); target >= 10x;
  (c) file-level evaluation, files/s: ``mel_files`` batches through a small CNN
      in one call + vectorised votes (``cachebuild.mel.voting``) vs. the users' loop
      (per file: read its segments, run the model, vote), with the segments read
      either through their training Dataset (80 ``__getitem__``) or, kinder to
      them, as one HDF5 slice; plus the CNN's own throughput (the bound on a
      CPU, where compute, not the loop, dominates) and the pipeline with a
      near-free model; target >= 10x;
  (d) build rate from WAV (``--wav-files`` 16-bit, 4096 Hz, 10 s files in LEAK/NOLEAK) with 2
      workers vs. the limit of decoding + STFT alone, per core x cores;
  (e) codecs: zstd vs ``build.codec = "none"``: sizes (shards on disk, which
      include 512-byte tar headers and padding per member, and the ``mel``
      payloads alone) and ``mel`` segments/s.

Data: mel-like float16 (a smooth per-file spectrum in dB plus per-window and
per-segment variation, leak files with a resonance bump), shaped as the users'
``segments_mel`` [F, 40, 2, 64, 1], chunked 8 files per chunk (80 KB,
uncompressed: no gzip cost charged to them); ``segments_waveform`` exists with
the users' shape but is left unallocated (their training Dataset never reads
it; writing 0.8 GB of noise would only cost time). Everything lives in
``--work`` (default a fresh folder in /dev/shm), so both sides read from RAM.

Timing: each reader's clock for ``first_batch_s`` starts before its loader is
made; the rate is measured after ``1 + 2 * workers`` warm-up batches, over
whole batches, for ``--limit-s`` seconds; a finite dataset that runs out is
started again. Appends to benchmarks/RESULTS.md.

    python benchmarks/bench_mel.py                       # ~4-5 minutes on 2 cores
    python benchmarks/bench_mel.py --files 1000 --limit-s 2 --wav-files 200 --no-record   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _results import append, quick_defaults  # noqa: E402

import loaders.views.mel  # noqa: E402,F401  (registers the mel views)
from cachebuild.jobs import run_mel_build  # noqa: E402
from cachebuild.mel import MelConfig  # noqa: E402
from loaders import ShardStream, make_loader  # noqa: E402
from loaders.loader import shutdown_workers  # noqa: E402
from cachebuild.mel.voting import file_votes  # noqa: E402

L, S, M, T = 40, 2, 64, 1
SEGMENTS = L * S


def log(msg: str) -> None:
    print(f"[bench_mel {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data
def mel_like(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` files of mel-like float16 ``[n, L, S, M, T]`` (dB) and labels (0 = LEAK, 1 = NOLEAK)."""
    labels = rng.integers(0, 2, n).astype(np.int16)
    bins = np.arange(M, dtype=np.float32) / M
    base = -30.0 - rng.uniform(20, 50, (n, 1)) * bins**0.7 + rng.normal(0, 5, (n, 1))  # [n, M]
    centre = rng.uniform(0.2, 0.8, (n, 1))
    bump = 12.0 * np.exp(-(((bins - centre) / 0.05) ** 2)) * (labels == 0)[:, None]
    spec = (base + bump)[:, None, None, :]
    spec = spec + rng.normal(0, 2, (n, L, 1, 1)) + rng.normal(0, 3, (n, L, S, M))
    return spec[..., None].astype(np.float16), labels


def write_user_h5(path: Path, files: int, seed: int = 0, block: int = 500) -> None:
    """The users' layout: ``labels`` [F] int16, ``segments_waveform`` [F,40,2,512] f32, ``segments_mel`` [F,40,2,64,1] f16, attrs."""
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        lab = f.create_dataset("labels", (files,), np.int16)
        mel = f.create_dataset("segments_mel", (files, L, S, M, T), np.float16, chunks=(8, L, S, M, T))
        f.create_dataset("segments_waveform", (files, L, S, 512), np.float32, chunks=(1, L, S, 512))  # unallocated
        for a in range(0, files, block):
            b = min(a + block, files)
            mel[a:b], lab[a:b] = mel_like(rng, b - a)
        f.attrs["config_json"] = json.dumps({"sr": 4096, "n_fft": 512, "hop_length": 128, "n_mels": 64, "fmin": 0.0})
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})


def build(h5: Path, out: Path, codec: str) -> Any:
    return run_mel_build(None, [], {"build.codec": codec}, out, from_h5=h5, workers=2, progress=False)


# --------------------------------------------------------------------------- measuring
class _Restarting:
    """Next batch of ``iterable``, started again when it runs out."""

    def __init__(self, iterable: Iterable):
        self.iterable, self.it = iterable, iter(iterable)

    def next(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.iterable)
            return next(self.it)


def measure(make: Callable[[], Iterable], count: Callable[[Any], int], limit_s: float, warmup: int) -> dict[str, float]:
    """``{items_per_s, first_batch_s, batches}``: first batch from loader creation, then the rate after warm-up."""
    t0 = time.perf_counter()
    loader = make()
    try:
        batches = _Restarting(loader)
        batches.next()
        first = time.perf_counter() - t0
        for _ in range(warmup - 1):
            batches.next()
        items = steps = 0
        t1 = time.perf_counter()
        while time.perf_counter() - t1 < limit_s:
            items += count(batches.next())
            steps += 1
        return {"items_per_s": items / (time.perf_counter() - t1), "first_batch_s": first, "batches": steps}
    finally:
        shutdown_workers(loader)


def ours_rate(cache: Path, workers: int, batch: int, limit_s: float) -> dict[str, float]:
    """Segments/s of the ``mel`` view (float16 as stored, shuffled)."""

    def make():
        stream = ShardStream(cache, view="mel", batch_size=batch, shuffle=True, seed=0)
        return make_loader(stream, num_workers=workers, pin_memory=False)

    return measure(make, lambda b: int((~b["is_pad"]).sum()), limit_s, 1 + 2 * workers)


class UserSegmentDataset(torch.utils.data.Dataset):
    """The users' Dataset: one segment per item, h5py opened lazily in each worker with a chunk cache."""

    def __init__(self, path: str | Path, rdcc_nbytes: int = 64 * 2**20):
        import h5py

        self.path, self.rdcc_nbytes = str(path), rdcc_nbytes
        with h5py.File(self.path, "r") as f:
            self.labels = f["labels"][...].astype(np.int64)
        self._file, self._pid = None, None

    def __len__(self) -> int:
        return len(self.labels) * SEGMENTS

    def _mel(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            import h5py

            self._file = h5py.File(self.path, "r", rdcc_nbytes=self.rdcc_nbytes, rdcc_nslots=100_003)
            self._pid = os.getpid()
        return self._file["segments_mel"]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        f, k = divmod(int(idx), SEGMENTS)
        l, s = divmod(k, S)
        x = self._mel()[f, l, s]  # [M, T] float16
        return torch.from_numpy(x).unsqueeze(0), int(self.labels[f])


def user_rate(h5: Path, workers: int, batch: int, limit_s: float) -> dict[str, float]:
    def make():
        return torch.utils.data.DataLoader(UserSegmentDataset(h5), batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)

    return measure(make, lambda b: len(b[1]), limit_s, 1 + 2 * workers)


def litdata_rates(cache: Path, work: Path, batch: int, limit_s: float) -> tuple[dict[str, dict], str]:
    """LitData, one segment per sample (``peers.py``), 0 and 2 workers; or why not."""
    try:
        import litdata  # noqa: F401

        from peers import litdata_prepare_mel_segments, litdata_rate
    except ImportError as exc:
        return {}, f"litdata not installed ({exc})"
    t = time.perf_counter()
    out = litdata_prepare_mel_segments(cache, work / "litdata-mel", "zstd")
    note = f"litdata.optimize of {cache.name}: {time.perf_counter() - t:.1f} s"
    return {w: litdata_rate(out, w, batch, limit_s) for w in (0, 2)}, note


# --------------------------------------------------------------------------- file-level evaluation
def SmallCNN() -> nn.Module:
    """The example trainer's leak detector (examples/train_mel.py), narrow: two 1-D convolutions along mel bins."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from train_mel import MelCNN

    return MelCNN(width=16)


def eval_batched(cache: Path, model: nn.Module, files_per_batch: int, workers: int, limit_s: float) -> dict[str, float]:
    """Files/s: ``mel_files`` batches -> one model call on all their segments -> ``file_votes``."""

    def make():
        stream = ShardStream(cache, view="mel_files", batch_size=files_per_batch, shuffle=False)
        return make_loader(stream, num_workers=workers, pin_memory=False)

    def step(batch: dict) -> int:
        F = batch["mel"].shape[0]
        with torch.inference_mode():
            logits = model(batch["mel"].reshape(-1, 1, M, T)).reshape(F, L, S)
            _, decision = file_votes(logits, long_mask=batch["long_mask"])
        decision.sum().item()  # the decisions exist (a sync point on a GPU)
        return int((~batch["is_pad"]).sum())

    return measure(make, step, limit_s, 1 + 2 * workers)


def eval_per_file(h5: Path, model: nn.Module, limit_s: float, rdcc_nbytes: int = 64 * 2**20) -> dict[str, float]:
    """The users' loop: per file, read its segments (one HDF5 slice), run the model, vote in Python."""
    import h5py

    with h5py.File(h5, "r", rdcc_nbytes=rdcc_nbytes, rdcc_nslots=100_003) as f:
        mel = f["segments_mel"]
        n = mel.shape[0]
        done = 0
        decisions = []
        t = time.perf_counter()
        with torch.inference_mode():
            while time.perf_counter() - t < limit_s:
                x = torch.from_numpy(mel[done % n])  # [L, S, M, T] float16
                p = torch.sigmoid(model(x.reshape(SEGMENTS, 1, M, T))).reshape(L, S)
                votes = sum(1 for q in p.mean(dim=1).tolist() if q > 0.5)
                decisions.append(votes / L >= 0.5)
                done += 1
        return {"items_per_s": done / (time.perf_counter() - t)}


def eval_per_file_items(h5: Path, model: nn.Module, limit_s: float) -> dict[str, float]:
    """The users' loop through their training Dataset: per file, its 80 segments by ``__getitem__``, collate, model, vote."""
    from torch.utils.data import default_collate

    ds = UserSegmentDataset(h5)
    n = len(ds.labels)
    done = 0
    t = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t < limit_s:
            f = done % n
            x, _ = default_collate([ds[f * SEGMENTS + k] for k in range(SEGMENTS)])
            p = torch.sigmoid(model(x)).reshape(L, S)
            votes = sum(1 for q in p.mean(dim=1).tolist() if q > 0.5)
            _ = votes / L >= 0.5
            done += 1
    return {"items_per_s": done / (time.perf_counter() - t)}


# --------------------------------------------------------------------------- build from WAV
def write_wavs(root: Path, files: int, seconds: float = 10.0, rate: int = 4096, seed: int = 1) -> None:
    """``files`` 16-bit mono WAVs in LEAK/ and NOLEAK/ (coloured noise; content does not change the cost)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    for i in range(files):
        folder = root / ("LEAK" if i % 2 == 0 else "NOLEAK")
        folder.mkdir(parents=True, exist_ok=True)
        x = np.cumsum(rng.standard_normal(n)) * 0.002 + rng.standard_normal(n) * 0.05
        q = np.clip(np.round((x - x.mean()) * 32767), -32768, 32767).astype("<i2")
        with wave.open(str(folder / f"clip{i:05d}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(q.tobytes())


def decode_stft_cpu_s(root: Path, block: int = 64) -> float:
    """CPU seconds per file of WAV decoding + segmentation + log-mel alone, one thread (BLAS limited to 1).

    CPU time, not wall time: on a shared machine another process's load would
    otherwise move the limit by 2-3x between runs.
    """
    from threadpoolctl import threadpool_limits

    from cachebuild.mel import log_mel, segment
    from cachebuild.mel.wav import load_clip

    cfg = MelConfig()
    paths = sorted(root.glob("*/*.wav"))
    with threadpool_limits(1):
        t = time.process_time()
        for a in range(0, len(paths), block):
            part = paths[a : a + block]
            waves = np.stack([load_clip(p, cfg) for p in part])
            log_mel(segment(waves, cfg), cfg).astype(np.float16)
        return (time.process_time() - t) / len(paths)


def _tree_cpu() -> dict[tuple[int, float], float]:
    """CPU seconds (user + system) of this process and its descendants, keyed by (pid, start time)."""
    import psutil

    out = {}
    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    for p in procs:
        try:
            c = p.cpu_times()
            out[p.pid, p.create_time()] = c.user + c.system
        except psutil.Error:
            pass
    return out


def cpu_used(before: dict[tuple[int, float], float], after: dict[tuple[int, float], float]) -> float:
    """CPU seconds spent between two :func:`_tree_cpu` snapshots (processes started since count from 0)."""
    return sum(v - before.get(k, 0.0) for k, v in after.items())


def payload_ratio(cache: Path, field: str = "mel") -> float:
    """Array bytes / stored payload bytes of one field over the whole cache (from the shard indexes)."""
    from cachebuild.format import load_index, read_manifest

    m = read_manifest(cache)
    j = m.field_names.index(field)
    nbytes = size = 0
    for e in m.shards:
        idx = load_index(cache / e.index, len(m.fields))
        nbytes += int(idx[:, j]["nbytes"].sum())
        size += int(idx[np.unique(idx[:, j]["offset"], return_index=True)[1], j]["size"].sum())  # (entries sharing a zstd frame, format v4: its size once)
    return nbytes / size


# --------------------------------------------------------------------------- report
def _r(x: float) -> str:
    return f"{x:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=5000, help="files in the HDF5 (80 segments each)")
    ap.add_argument("--batch", type=int, default=8192, help="segments per training batch")
    ap.add_argument("--eval-files", type=int, default=100, help="files per mel_files batch (100 x 80 = 8,000 segments)")
    ap.add_argument("--limit-s", type=float, default=6.0, help="seconds measured per reader")
    ap.add_argument("--wav-files", type=int, default=2000, help="synthetic WAV files for the build-rate measurement")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a new one in /dev/shm)")
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    ap.add_argument("--no-litdata", action="store_true")
    ap.add_argument("--no-record", action="store_true", help="print the table, do not append it to RESULTS.md")
    quick_defaults(ap, files=40, batch=1024, eval_files=8, limit_s=0.3, wav_files=20, no_litdata=True)
    args = ap.parse_args()
    shm = Path("/dev/shm")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-mel-", dir=shm if shm.is_dir() else None))
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    rows: list[tuple[str, str]] = []
    notes: list[str] = [
        f"work folder {work}; {args.files:,} files x {SEGMENTS} segments = {args.files * SEGMENTS:,} segments; "
        f"batch {args.batch:,} segments; {args.limit_s:g} s per measurement; torch threads {torch.get_num_threads()} (1 in (c))"
    ]
    t_all = time.perf_counter()
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    try:
        h5 = work / "leaks.h5"
        t = time.perf_counter()
        write_user_h5(h5, args.files)
        log(f"HDF5 written in {time.perf_counter() - t:.1f} s ({h5.stat().st_size / 1e6:.0f} MB)")
        caches: dict[str, Path] = {}
        summaries = {}
        for codec in ("zstd", "none"):
            caches[codec] = work / f"mel-{codec}"
            summaries[codec] = build(h5, caches[codec], codec)
            summ = summaries[codec]
            log(f"cache {codec}: {summ.records} files, {summ.shards} shards, ratio {summ.ratio:.3f}, {summ.seconds:.1f} s")
        rows.append(
            (
                "build from HDF5 (stored mel), zstd / none, 2 workers",
                f"{summaries['zstd'].records / summaries['zstd'].seconds:,.0f} / {summaries['none'].records / summaries['none'].seconds:,.0f} files/s",
            )
        )

        # (a) + (e): our mel view on both codecs; the users' Dataset
        ours: dict[tuple[str, int], dict] = {}
        for codec in ("zstd", "none"):
            for w in (0, 2):
                ours[codec, w] = ours_rate(caches[codec], w, args.batch, args.limit_s)
                log(f"ours mel view [{codec}, {w} workers]: {ours[codec, w]}")
        user: dict[int, dict] = {}
        for w in (0, 2):
            user[w] = user_rate(h5, w, args.batch, args.limit_s)
            log(f"users' HDF5 Dataset [{w} workers]: {user[w]}")
        best_ours = max(ours["zstd", 0]["items_per_s"], ours["zstd", 2]["items_per_s"])
        best_user = max(user[0]["items_per_s"], user[2]["items_per_s"])
        for w in (0, 2):
            rows.append((f"(a) ours `mel` view, zstd cache, {w} workers", f"{_r(ours['zstd', w]['items_per_s'])} segments/s (first batch {ours['zstd', w]['first_batch_s']:.2f} s)"))
        for w in (0, 2):
            rows.append(
                (f"(a) users' HDF5 per-item Dataset, {w} workers", f"{_r(user[w]['items_per_s'])} segments/s (first batch {user[w]['first_batch_s']:.2f} s, {user[w]['batches']} batches measured)")
            )
        for w in (0, 2):
            rows.append((f"(a) speed-up, {w} workers (ours zstd / theirs)", f"{ours['zstd', w]['items_per_s'] / user[w]['items_per_s']:.0f}x"))
        rows.append(("(a) speed-up, best vs best (target >= 20x)", f"{best_ours / best_user:.0f}x"))

        # (b) LitData
        if args.no_litdata:
            notes.append("LitData skipped (--no-litdata)")
        else:
            lit, note = litdata_rates(caches["zstd"], work, args.batch, args.limit_s)
            notes.append(note)
            if lit:
                for w, m in lit.items():
                    log(f"litdata [{w} workers]: {m}")
                    rows.append(
                        (f"(b) LitData, one segment per sample, zstd, {w} workers", f"{_r(m['samples_per_s'])} segments/s (first batch {m['first_batch_s']:.2f} s, {m['batches']} batches measured)")
                    )
                best_lit = max(m["samples_per_s"] for m in lit.values())
                rows.append(("(b) speed-up vs LitData, best vs best (target >= 10x)", f"{best_ours / best_lit:.0f}x"))
            else:
                rows.append(("(b) LitData", note))

        # (c) file-level evaluation, model compute on one thread for both sides (on 2 shared cores,
        # torch's spinning OpenMP threads slow small per-file calls 10x whenever another process runs)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = SmallCNN().eval()
        per_file = eval_per_file(h5, model, args.limit_s)
        log(f"users' per-file evaluation (one HDF5 slice per file): {per_file}")
        per_item = eval_per_file_items(h5, model, args.limit_s)
        log(f"users' per-file evaluation (their segment Dataset): {per_item}")
        batched = eval_batched(caches["zstd"], model, args.eval_files, 0, args.limit_s)
        log(f"batched evaluation: {batched}")
        null = _Squeeze(nn.Sequential(nn.Flatten(), nn.Linear(M * T, 1))).eval()  # ~no compute: the pipeline alone
        per_file_null = eval_per_file(h5, null, args.limit_s / 2)
        batched_null = eval_batched(caches["zstd"], null, args.eval_files, 0, args.limit_s / 2)
        cnn_alone = _model_rate(model, args.eval_files * SEGMENTS)
        torch.set_num_threads(threads)
        b = batched["items_per_s"]
        rows.append(("(c) users' per-file loop, small CNN, segments read through their Dataset (80 `__getitem__`)", f"{per_item['items_per_s']:,.1f} files/s"))
        rows.append(("(c) users' per-file loop, small CNN, one HDF5 slice per file", f"{_r(per_file['items_per_s'])} files/s"))
        rows.append((f"(c) ours: `mel_files` x {args.eval_files} files, one model call + `file_votes`, 0 workers", f"{_r(b)} files/s"))
        rows.append(("(c) speed-up vs their Dataset loop / vs the one-slice loop (target >= 10x)", f"{b / per_item['items_per_s']:.0f}x / {b / per_file['items_per_s']:.1f}x"))
        rows.append((f"(c) the small CNN alone on {args.eval_files * SEGMENTS:,}-segment batches, 1 thread (compute bound of (c))", f"{_r(cnn_alone)} files/s; ours reaches {b / cnn_alone:.0%} of it"))
        rows.append(("(c) pipeline alone (1-layer linear model): one-slice loop / ours", f"{_r(per_file_null['items_per_s'])} / {_r(batched_null['items_per_s'])} files/s"))

        # (d) build from WAV
        wav_root = work / "wav"
        write_wavs(wav_root, args.wav_files)
        cpu0 = _tree_cpu()
        t = time.perf_counter()
        wav_sum = run_mel_build(None, [], {}, work / "mel-wav", from_wav=wav_root, workers=2, progress=False)
        wall = time.perf_counter() - t
        build_cpu = cpu_used(cpu0, _tree_cpu()) / args.wav_files
        limit_cpu = decode_stft_cpu_s(wav_root)
        workers = min(cores, 2)
        rows.append(
            (f"(d) build from {args.wav_files:,} WAVs (16-bit, 4096 Hz, 10 s), 2 workers, wall", f"{args.wav_files / wall:,.0f} files/s ({wall:.2f} s incl. worker start; {wav_sum.shards} shards)")
        )
        rows.append((f"(d) limit: WAV decode + STFT + log-mel alone, {limit_cpu * 1e3:.2f} CPU-ms per file, x {workers} cores", f"{workers / limit_cpu:,.0f} files/s"))
        rows.append(("(d) build wall rate / limit", f"{args.wav_files / wall * limit_cpu / workers:.0%}"))
        rows.append(
            ("(d) build CPU per file (all processes) / decode + STFT alone", f"{build_cpu * 1e3:.2f} / {limit_cpu * 1e3:.2f} CPU-ms ({limit_cpu / build_cpu:.0%} of the build's CPU is decode + STFT)")
        )

        # (e) codecs
        for codec in ("zstd", "none"):
            summ = summaries[codec]
            rows.append((f"(e) codec {codec}: array bytes -> shard bytes on disk (incl. tar framing)", f"{summ.raw_bytes / 1e6:.1f} MB -> {summ.stored_bytes / 1e6:.1f} MB ({summ.ratio:.3f}x)"))
            rows.append((f"(e) codec {codec}: `mel` view, 0 / 2 workers", f"{_r(ours[codec, 0]['items_per_s'])} / {_r(ours[codec, 2]['items_per_s'])} segments/s"))
        raw_b, z_b = summaries["none"].stored_bytes, summaries["zstd"].stored_bytes
        rows.append(("(e) `mel` payloads alone, zstd: array bytes / compressed", f"{payload_ratio(caches['zstd']):.3f}x"))
        rows.append(("(e) zstd cache / raw cache size; raw / zstd segments/s (0 workers)", f"{z_b / raw_b:.2f}; {ours['none', 0]['items_per_s'] / ours['zstd', 0]['items_per_s']:.2f}x"))

        notes.append(
            f"total benchmark time {time.perf_counter() - t_all:.0f} s; load average at start {load0}, at end "
            f"{tuple(round(x, 2) for x in os.getloadavg())} (on {cores} cores: other processes share the machine)"
        )
        title = "Mel cache: training reads, file-level evaluation, WAV build, codecs"
        if args.no_record:
            print("\n".join([title] + [f"| {k} | {v} |" for k, v in rows] + notes))
        else:
            append(title, rows, notes)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)


class _Squeeze(nn.Module):
    """``[N, 1, M, T]`` -> model -> ``[N]`` (for the pipeline-only comparison)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.float()).reshape(-1)


def _model_rate(model: nn.Module, segments: int, repeats: int = 5) -> float:
    """Files/s of the model alone on batches of ``segments`` float16 segments (best of ``repeats``)."""
    x = torch.randn(segments, 1, M, T).half()
    best = float("inf")
    with torch.inference_mode():
        model(x)
        for _ in range(repeats):
            t = time.perf_counter()
            model(x)
            best = min(best, time.perf_counter() - t)
    return segments / SEGMENTS / best


if __name__ == "__main__":
    main()
