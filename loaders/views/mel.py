"""The ``mel`` and ``mel_files`` views of a mel cache (one record per audio file).

A mel record holds ``mel`` ``[L, S, M, T]`` (``L`` long windows of ``S``
short windows, each an ``M`` mel bins x ``T`` frames image; the users'
defaults are 40 x 2 x 64 x 1, float16) and ``label`` (int16, 0-d).

``mel``: one batch row per *segment* (short window), for training.
    The plan works on files (each yields ``L*S`` items, known from the index
    shapes without decoding) and mixes segments across files the way an
    i.i.d. sampler does: the epoch's file order is cut into pools of ``mix``
    files whose segments are permuted together (:mod:`loaders.pools`). The
    default ``mix="auto"`` holds 64 MB of decoded files per pool, at least
    1,024 (:func:`loaders.pools.auto_mix`: 6,553 files at the users' 10 KB
    layout, so a cache of their size is one pool and a batch of 8,192
    segments spans ~5,800 files, as their sampler's do); ``mix=1024``: a
    batch of 1,024 segments spans about 650 files (``mix=None``: consecutive
    segments, ~13 files). Each process keeps the files of the current pool
    decoded (:mod:`loaders.views.store`: up to 64 MB at the default, x2 at a
    pool boundary) and decodes each file once per epoch; rows are
    filled by index arithmetic (one ``np.take`` per key, no per-segment
    Python). ``chunk`` keeps that many consecutive segments of a file
    together (default 1). ``oversample={"LEAK": 2}`` reads each file of
    that label twice per epoch (the users' ``leak_oversample_factor``;
    :mod:`loaders.oversample`). Epoch plan, DDP split, exact resume, pinned
    prefetch: the stream's, unchanged.

    ================  =======================  ===========================================
    key               shape, dtype             meaning
    ================  =======================  ===========================================
    ``mel``           ``[B, 1, M, T]`` f16/f32 the segment (channel axis for a CNN);
                                               ``dtype="float32"`` casts while gathering
    ``label``         ``[B]`` int64            its file's label id
    ``file_id``       ``[B]`` int64            its file's record id (= the source's file index)
    ``long_index``    ``[B]`` int64            long window ``l`` in ``[0, L)``
    ``short_index``   ``[B]`` int64            short window ``s`` in ``[0, S)``
    ``is_pad``        ``[B]`` bool             a repeat that fills the epoch's last batches
    ``waveform``      ``[B, W]`` f32           the segment's samples (``waveform=True``;
                                               caches built with ``store_waveform``)
    ================  =======================  ===========================================

``mel_files``: one batch row per *file*, for batched file-level evaluation.
    A batch of ``F`` files is one dense tensor, so the model sees all their
    segments in a single call and the votes are one vectorised reduction::

        x = batch["mel"].reshape(-1, 1, M, T)              # [F*L*S, 1, M, T]
        logits = model(x).reshape(F, L, S)                  # one call
        frac, leak = file_votes(logits, long_mask=batch["long_mask"])   # cachebuild.mel.voting

    (Why dense rather than flattened segments plus offsets: every file of a
    mel cache has the same ``L`` and ``S``, so the flat model input is a free
    ``reshape`` of the dense tensor, and the vote needs no offsets; a cache
    with varying ``L`` is zero-padded and ``long_mask`` says which windows
    exist. ``offsets`` is there for code written for the flat form.)

    =============  ==========================  ===========================================
    key            shape, dtype                meaning
    =============  ==========================  ===========================================
    ``mel``        ``[F, L, S, M, T]`` f16/f32  the whole file
    ``label``      ``[F]`` int64               label id
    ``file_id``    ``[F]`` int64               record id
    ``long_mask``  ``[F, L]`` bool             long window ``l`` exists in the file
    ``offsets``    ``[F + 1]`` int64           file ``f``'s segments are rows ``offsets[f]:offsets[f+1]``
                                               of ``mel.reshape(-1, 1, M, T)`` (and of the model's
                                               flat output): ``f * L * S``
    ``is_pad``     ``[F]`` bool                a repeat that fills the epoch's last batch:
                                               drop these rows from metrics
    ``waveform``   ``[F, L, S, W]`` f32        samples (``waveform=True``)
    =============  ==========================  ===========================================

    For evaluation use ``shuffle=False`` (files in cache order); with several
    ranks every file is still seen exactly once, repeats flagged ``is_pad``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from cachebuild.format.manifest import Manifest
from loaders.batch import Field, Layout
from cachebuild.format.decode import read_block
from loaders.plan import BatchItems
from cachebuild.format.reader import ShardSet
from loaders.oversample import block_labels, parse_oversample, record_repeats
from loaders.pools import auto_mix, max_records_per_batch
from loaders.views.base import ShapesFn, View, check_mixing, copy_repeats, pad_mask, require_fields
from loaders.views.store import Dense, RecordStore

__all__ = ["MelView", "MelFilesView", "MEL_DTYPES"]

MEL_DTYPES = ("float16", "float32")
"""Batch dtypes of ``mel``: as stored (the builder's default float16), or float32 (cast while gathering)."""


class _MelBase(View):
    """What both mel views share: option checks, the cache's max shape, the fields to decode."""

    def __init__(self, manifest: Manifest, batch_size: int, dtype: str | None = None, waveform: bool = False):
        super().__init__(manifest, batch_size)
        require_fields(manifest, ["mel", "label"] + (["waveform"] if waveform else []), self.name)
        schema = manifest.schema("mel")
        if schema.ndim != 4:
            raise ValueError(f"view {self.name!r}: field 'mel' must be [num_long, num_short, n_mels, t], cache has {schema.ndim} axes")
        stored = np.dtype(schema.dtype).name
        self.dtype = stored if dtype is None else np.dtype(dtype).name
        if self.dtype not in MEL_DTYPES:
            raise ValueError(f"view {self.name!r}: dtype must be one of {MEL_DTYPES} (or None: as stored, {stored}), got {dtype!r}")
        self.waveform = bool(waveform)
        self.max_shape: tuple[int, int, int, int] = tuple(int(n) for n in schema.max_shape)  # type: ignore[assignment]
        self.varying = bool(schema.varying_axes)
        self.wave_len = int(manifest.schema("waveform").max_shape[-1]) if waveform else 0
        self._decode = ["mel", "label"] + (["waveform"] if waveform else [])

    def decoded_fields(self) -> list[str]:
        return list(self._decode)

    def options(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "waveform": self.waveform}


class MelView(_MelBase):
    """One row per segment ``(file, long, short)``; segments of a pool of files mixed across batches."""

    name = "mel"

    def __init__(
        self,
        manifest: Manifest,
        batch_size: int,
        dtype: str | None = None,
        waveform: bool = False,
        mix: int | str | None = "auto",
        chunk: int = 1,
        oversample: Mapping[Any, int] | None = None,
    ):
        super().__init__(manifest, batch_size, dtype, waveform)
        if isinstance(mix, str) and mix != "auto":
            raise ValueError(f"view {self.name!r}: mix must be >= 1 files per pool, None (file after file) or 'auto', got {mix!r}")
        if isinstance(mix, str):  # "auto": pools of POOL_BYTES of decoded files (at least DEFAULT_MIX files)
            per_file = int(np.prod(self.max_shape)) * np.dtype(self.dtype).itemsize + (int(np.prod(self.max_shape[:2])) * self.wave_len * 4 if waveform else 0)
            mix = auto_mix(per_file)
        self.mix, self.chunk = check_mixing(self.name, mix, chunk)
        self.oversample = parse_oversample(oversample, manifest, self.name)  # (label id, reads per epoch); see loaders.oversample
        self._repeats: tuple[int, np.ndarray] | None = None
        self.g_max: int | None = None
        L, S, M, T = self.max_shape
        pad = self.varying  # every file of the cache the same shape: each decode overwrites its whole row
        dense = {"mel": Dense((L, S, M, T), self.dtype, pad), "label": Dense((), "int64", False), "n_short": Dense((), "int64", False)}
        if self.waveform:
            dense["waveform"] = Dense((L, S, self.wave_len), "float32", pad or bool(manifest.schema("waveform").varying_axes))
        self.store = RecordStore(dense, self._decode_into)

    def options(self) -> dict[str, Any]:
        opts = {**super().options(), "mix": self.mix, "chunk": self.chunk}
        if self.oversample:  # (absent when not asked: states saved before the option still load)
            opts["oversample"] = [list(p) for p in self.oversample]
        return opts

    def record_repeats(self, shards: Callable[[], ShardSet], records: int) -> np.ndarray | None:
        """Reads per epoch of each record (``None``: once each), read once per process and cache size."""
        if not self.oversample:
            return None
        if self._repeats is None or self._repeats[0] != records:
            self._repeats = (records, record_repeats(shards(), records, self.oversample))
        return self._repeats[1]

    def bind(self, shapes: ShapesFn) -> np.ndarray:
        mel = shapes("mel")
        items = mel[:, 0] * mel[:, 1] if len(mel) else np.zeros(0, np.int64)
        if self.waveform:
            wav = shapes("waveform")
            if len(wav) and (wav[:, :2] != mel[:, :2]).any():
                bad = int(np.flatnonzero((wav[:, :2] != mel[:, :2]).any(axis=1))[0])
                raise ValueError(f"view 'mel': record {bad} has waveform windows {tuple(wav[bad, :2])} but mel windows {tuple(mel[bad, :2])}")
        most = max((f for _, f in self.oversample), default=1)  # an oversampled file is that many places in the order
        self.g_max = max_records_per_batch(np.repeat(items, most) if most > 1 else items, self.batch_size, self.chunk)
        return items

    def layout(self) -> Layout:
        if self.g_max is None:
            raise RuntimeError("MelView.layout() needs bind() first (the stream calls it)")
        B = self.batch_size
        _, _, M, T = self.max_shape
        keys = {
            "mel": Field((B, 1, M, T), self.dtype),
            "label": Field((B,), "int64"),
            "file_id": Field((B,), "int64"),
            "long_index": Field((B,), "int64"),
            "short_index": Field((B,), "int64"),
            "is_pad": Field((B,), "bool"),
        }
        if self.waveform:
            keys["waveform"] = Field((B, self.wave_len), "float32")
        return Layout(keys)

    def _decode_into(self, shards: ShardSet, ids: np.ndarray, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        blocks = read_block(shards, ids, self._decode, self.decode_threads)
        blocks["mel"].scatter(arrays["mel"], dest)  # cast to the batch dtype on the way
        if self.waveform:
            blocks["waveform"].scatter(arrays["waveform"], dest)
        arrays["label"][dest] = block_labels(blocks["label"])
        arrays["n_short"][dest] = blocks["mel"].shapes[:, 1]

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        G = len(items.unique)
        if self.g_max is not None and G > self.g_max:
            raise RuntimeError(f"batch {items.index} spans {G} files, more than the planned {self.g_max}")
        files, where = self.store.rows(shards, items)
        try:
            self._gather(files, where, items, out)
        finally:
            self.store.finish_batch()  # shared pools this batch read may be reused

    def _gather(self, files: dict[str, np.ndarray], where: np.ndarray, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        """Fill the batch's keys from the decoded files (``where[g]``: the row of ``items.unique[g]``)."""
        L, S, M, T = self.max_shape
        B = self.batch_size
        row = where[items.slot]  # each batch row's file in the decoded arrays
        # Segment k of a file is (long k // S_f, short k % S_f).
        per_short = files["n_short"][row]
        long = items.items // per_short
        short = items.items - long * per_short
        flat = (row * L + long) * S + short
        np.take(files["mel"].reshape(-1, M, T), flat, axis=0, out=out["mel"].reshape(B, M, T), mode="clip")
        if self.waveform:
            np.take(files["waveform"].reshape(-1, self.wave_len), flat, axis=0, out=out["waveform"], mode="clip")
        out["label"][...] = files["label"][row]
        out["file_id"][...] = items.records
        out["long_index"][...] = long
        out["short_index"][...] = short
        out["is_pad"][...] = items.is_pad


class MelFilesView(_MelBase):
    """One row per file: the whole ``[L, S, M, T]`` mel, for one-call batched evaluation and voting."""

    name = "mel_files"

    def layout(self) -> Layout:
        F = self.batch_size
        L, S, M, T = self.max_shape
        keys = {
            "mel": Field((F, L, S, M, T), self.dtype, 0 if self.varying else None),
            "label": Field((F,), "int64"),
            "file_id": Field((F,), "int64"),
            "long_mask": Field((F, L), "bool"),
            "offsets": Field((F + 1,), "int64"),
            "is_pad": Field((F,), "bool"),
        }
        if self.waveform:
            keys["waveform"] = Field((F, L, S, self.wave_len), "float32", 0)
        return Layout(keys)

    def assemble(self, shards: ShardSet, items: BatchItems, out: dict[str, np.ndarray]) -> None:
        first, slot = items.first, items.slot
        blocks = read_block(shards, items.unique, self._decode, self.decode_threads)
        dense = ["mel"] + (["waveform"] if self.waveform else [])
        for name in dense:
            blocks[name].scatter(out[name], first)  # each file once, at its first row
        copy_repeats(out, first, slot, dense)  # rows repeating a file (padding) copy it
        out["label"][...] = block_labels(blocks["label"])[slot]
        out["file_id"][...] = items.records
        pad_mask(blocks["mel"].shapes[:, 0][slot], self.max_shape[0], out["long_mask"])
        L, S = self.max_shape[:2]
        out["offsets"][...] = np.arange(len(out["offsets"]), dtype=np.int64) * (L * S)
        out["is_pad"][...] = items.is_pad


def _register() -> None:
    """Add both views to the registry (idempotent; ``loaders.views`` imports this module at its end)."""
    from loaders.views import register_view

    register_view(MelView.name, MelView)
    register_view(MelFilesView.name, MelFilesView)


_register()
