"""Small-record datasets for ``bench_small.py``, as a cachebuild source, and the same records for LitData.

Three datasets of small records (issue 15, item 2: storage without per-member overhead):

* ``mel``: one record = one log-mel segment ``mel`` [n_mels, frames] float16
  (2 KB at 32 x 32) + ``label`` int16. The segments are real log-mel
  spectrograms of synthetic audio: a harmonic tone (random f0, 1/k harmonics,
  a decaying envelope; 70% of records) over low-pass filtered noise at a random
  level, framed with a Hann window, mel filterbank (``cachebuild.mel``), natural
  log. They compress like real mels (smooth in time and frequency), not like
  uniform noise.
* ``mel_meta``: the same plus ``meta``, a tiny JSON dict (file name, offset,
  speaker, split) per record.
* ``tokens``: ``tokens`` int32 of 50..500 (``min_tokens``..``max_tokens``) ids
  drawn from a Zipf-like distribution over a 32k vocabulary (ragged).

Generation is vectorised per block (``FunctionSource.per_block``): one FFT over
the whole block, one ``choice`` for all tokens of a block. Block ``b`` of shard
``i`` is seeded from ``block_rng(seed, i, b)`` (the builder's contract), so
:func:`records_of_block` remakes exactly the records of a built cache: LitData
gets the same records without reading our format, and :func:`payload_bytes`
counts them the same way for every system (array ``nbytes`` plus the compact,
key-sorted JSON text; no headers).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cachebuild import FunctionSource
from cachebuild.builder.plan import block_rng
from cachebuild.mel.filterbank import mel_filterbank

__all__ = ["DATASETS", "make", "recipe", "records_of_block", "block_tasks", "litdata_samples", "payload_bytes"]

DATASETS = ("mel", "mel_meta", "tokens")
SR, N_FFT, HOP = 16_000, 400, 160  # 25 ms windows, 10 ms hop
BLOCK_RECORDS = 256
SPLITS = ("train", "train", "train", "valid", "test")
DEFAULTS: dict[str, Any] = {"dataset": "mel", "n_mels": 32, "frames": 32, "min_tokens": 50, "max_tokens": 500, "vocab": 32_000}


def _fields(dataset: str) -> dict[str, str]:
    if dataset == "tokens":
        return {"tokens": "int32"}
    fields = {"mel": "float16", "label": "int16"}
    return {**fields, "meta": "json"} if dataset == "mel_meta" else fields


@lru_cache(maxsize=4)
def _filterbank(n_mels: int) -> np.ndarray:
    return mel_filterbank(SR, N_FFT, n_mels, fmin=20.0).T.astype(np.float32)  # [bins, n_mels]


def _audio(rng: np.random.Generator, n: int, samples: int) -> np.ndarray:
    """``n`` clips ``[n, samples]`` float32: harmonic tones with decaying envelopes over low-passed noise."""
    f32 = np.float32
    t = np.arange(samples, dtype=f32) / f32(SR)
    f0 = np.exp(rng.uniform(np.log(90.0), np.log(500.0), (n, 1))).astype(f32)
    onset = rng.uniform(0.0, 0.3, (n, 1)).astype(f32)
    decay = rng.uniform(0.1, 1.0, (n, 1)).astype(f32)
    theta = f32(2 * np.pi) * f0 * t + rng.uniform(0, 2 * np.pi, (n, 1)).astype(f32)
    s1, c2 = np.sin(theta), 2 * np.cos(theta)
    tone, prev, cur = s1.copy(), np.zeros_like(s1), s1
    for k in range(2, 7):  # sin(k theta) by the Chebyshev recurrence: 5 block operations, no more sines
        prev, cur = cur, c2 * cur - prev
        tone += cur / f32(k)
    on = rng.random((n, 1)) < 0.7
    tone *= np.exp(-np.maximum(t - onset, 0) / decay) * ((t >= onset) & on)
    bins = samples // 2 + 1  # white noise, made in the frequency domain (its spectrum is complex Gaussian)
    spec = np.empty((n, bins), np.complex64)
    spec.real, spec.imag = rng.standard_normal((2, n, bins), dtype=f32) * f32(np.sqrt(samples / 2))
    cutoff = np.exp(rng.uniform(np.log(300.0), np.log(6000.0), (n, 1))).astype(f32)
    spec *= 1 / np.sqrt(1 + (np.fft.rfftfreq(samples, 1 / SR).astype(f32) / cutoff) ** 4)  # 2nd-order low-pass
    noise = np.fft.irfft(spec, samples, axis=1)
    return tone + noise * (10 ** rng.uniform(-2.5, -0.5, (n, 1))).astype(f32)


def log_mels(rng: np.random.Generator, n: int, n_mels: int = 32, frames: int = 32) -> np.ndarray:
    """``n`` log-mel segments ``[n, n_mels, frames]`` float16 of :func:`_audio` clips."""
    x = _audio(rng, n, N_FFT + HOP * (frames - 1))
    windows = np.lib.stride_tricks.sliding_window_view(x, N_FFT, axis=1)[:, ::HOP]  # [n, frames, N_FFT]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    z = np.fft.rfft(windows * window, axis=2)  # [n, frames, bins] complex64
    power = z.real**2 + z.imag**2
    mel = power @ _filterbank(n_mels)  # [n, frames, n_mels]
    return np.log(mel + 1e-6).transpose(0, 2, 1).astype(np.float16)


@lru_cache(maxsize=4)
def _zipf(vocab: int) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    return p / p.sum()


def _tokens(rng: np.random.Generator, n: int, min_tokens: int, max_tokens: int, vocab: int) -> list[np.ndarray]:
    """``n`` sequences of ``min_tokens..max_tokens`` Zipf-distributed ids: one draw for the whole block, then split."""
    lengths = rng.integers(min_tokens, max_tokens + 1, n)
    flat = rng.choice(vocab, size=int(lengths.sum()), p=_zipf(vocab)).astype(np.int32)
    return np.split(flat, np.cumsum(lengths)[:-1])


def _meta(rng: np.random.Generator, start: int, n: int) -> list[dict[str, Any]]:
    """Per-record JSON metadata (the only per-record Python of the generator: JSON is per record)."""
    speaker = rng.integers(0, 500, n).tolist()
    offset = (rng.integers(0, 600, n) * 0.5).tolist()
    split = rng.integers(0, len(SPLITS), n).tolist()
    return [{"file": f"clip-{(start + i) // 20:07d}.wav", "offset_s": offset[i], "speaker": speaker[i], "split": SPLITS[split[i]]} for i in range(n)]


def small_block(rng: np.random.Generator, start: int, stop: int, **params: Any) -> dict[str, Any]:
    """Records ``[start, stop)`` of ``params["dataset"]`` as columns (``FunctionSource.per_block``)."""
    return _columns(rng, start, stop, {**DEFAULTS, **params})


def _columns(rng: np.random.Generator, start: int, stop: int, p: dict[str, Any], mels: bool = True) -> dict[str, Any]:
    """The block's columns; ``mels=False`` leaves out ``mel`` (the costly field, of fixed size) for counting.

    The mel segments come from their own child generator, so the other fields
    are the same with or without them.
    """
    n = stop - start
    if p["dataset"] == "tokens":
        return {"tokens": _tokens(rng, n, p["min_tokens"], p["max_tokens"], p["vocab"])}
    mel_rng, side_rng = rng.spawn(2)
    cols: dict[str, Any] = {"mel": log_mels(mel_rng, n, p["n_mels"], p["frames"])} if mels else {}
    cols["label"] = side_rng.integers(0, 50, n).astype(np.int16)
    if p["dataset"] == "mel_meta":
        cols["meta"] = _meta(side_rng, start, n)
    return cols


def make(**params: Any) -> FunctionSource:
    """The recipe's factory (``kind = "small_data:make"``): ``[params]`` (see :data:`DEFAULTS`) arrive here."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown param {unknown[0]!r} (allowed: {', '.join(DEFAULTS)})")
    p = {**DEFAULTS, **params}
    if p["dataset"] not in DATASETS:
        raise ValueError(f"params.dataset = {p['dataset']!r}: must be one of {', '.join(DATASETS)}")
    return FunctionSource.per_block(small_block, _fields(p["dataset"]), kind=f"small-{p['dataset']}", block_records=BLOCK_RECORDS, params=params, version="1")


def recipe(dataset: str, records: int, codec: str, shard_mb: float = 64, seed: int = 0) -> dict[str, Any]:
    """The recipe dict ``cachebuild.build`` takes (``--set`` overrides apply to it)."""
    return {"kind": "small_data:make", "seed": seed, "records": records, "params": {"dataset": dataset}, "build": {"codec": codec, "shard_mb": shard_mb}}


def records_of_block(params: dict[str, Any], seed: int, shard: int, block: int, start: int, stop: int, mels: bool = True) -> dict[str, Any]:
    """The columns of block ``block`` of shard ``shard`` (records ``[start, stop)``), as the builder made them."""
    return _columns(block_rng(seed, shard, block), start, stop, {**DEFAULTS, **params}, mels)


def block_tasks(cache_dir: str | Path, block_records: int = BLOCK_RECORDS) -> list[tuple[dict[str, Any], int, int, int, int, int]]:
    """One task per generator block of a built cache: ``(params, seed, shard, block, start, stop)`` from its manifest."""
    from cachebuild.format import read_manifest

    m = read_manifest(cache_dir)
    params, seed = m.config["params"], m.seed
    tasks = []
    for i, s in enumerate(m.shards):
        a0, z = s.first_record, s.first_record + s.records
        tasks += [(params, seed, i, b, a, min(a + block_records, z)) for b, a in enumerate(range(a0, z, block_records))]
    return tasks


def _rows(cols: dict[str, Any]) -> Iterator[dict[str, Any]]:
    n = len(next(iter(cols.values())))
    for j in range(n):
        yield {k: v[j] for k, v in cols.items()}


def litdata_samples(task: tuple[dict[str, Any], int, int, int, int, int]) -> Iterator[dict[str, Any]]:
    """litdata.optimize fn: the records of one block; arrays as numpy arrays, ``meta`` as its JSON text."""
    for rec in _rows(records_of_block(*task)):
        out = {k: np.asarray(v) for k, v in rec.items() if k != "meta"}
        if "meta" in rec:
            out["meta"] = json.dumps(rec["meta"], sort_keys=True, separators=(",", ":"))
        yield out


def payload_bytes(cache_dir: str | Path) -> tuple[int, int]:
    """(records, payload bytes) of a built cache: array ``nbytes`` + compact JSON text of its remade records.

    ``mel`` is of fixed size (``n_mels * frames`` float16), so it is counted, not remade.
    """
    total = records = 0
    for task in block_tasks(cache_dir):
        params = {**DEFAULTS, **task[0]}
        n = task[5] - task[4]
        cols = records_of_block(*task, mels=False)
        total += n * params["n_mels"] * params["frames"] * 2 if params["dataset"] != "tokens" else 0
        for name, col in cols.items():
            if name == "meta":
                total += sum(len(json.dumps(m, sort_keys=True, separators=(",", ":")).encode()) for m in col)
            else:
                total += sum(a.nbytes for a in col) if isinstance(col, list) else col.nbytes
        records += n
    return records, total
