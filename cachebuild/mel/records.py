"""What every mel source shares: the record layout, its size, and the per-record JSON.

One record = one audio file::

    {"mel":      cfg.dtype  [num_long, num_short, n_mels, t],
     "label":    int16      []                      (0-d array)
     "waveform": float32    [num_long, num_short, short_window]   (only with store_waveform)
     "json":     {"file_id", "path", "label_name", "mel_from", and the parameters that
                  made the mel: "sample_rate", "short_window", "n_fft", "hop", "center",
                  "pad_mode", "n_mels", "fmin", "fmax", "mel_scale", "norm", "power",
                  "log", "log_floor", "top_db"}}

``mel_from`` is ``"computed"`` (by cachebuild, from audio) or ``"stored"``
(copied from an HDF5 file, whose own parameters the JSON then states).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from cachebuild.mel.config import MEL_PARAM_KEYS, MelConfig
from cachebuild.mel.segment import segment
from cachebuild.mel.spectrogram import log_mel

__all__ = [
    "MEL_FIELDS",
    "record_fields",
    "estimated_record_bytes",
    "record_meta",
    "build_records",
    "check_range",
    "mel_of_waves",
    "BadFileWarning",
    "MelSource",
]

#: Array fields of a mel record and their dtypes with the default config
#: (``mel`` follows ``cfg.dtype``; ``waveform`` exists only with ``store_waveform``).
MEL_FIELDS: dict[str, str] = {"mel": "float16", "label": "int16", "waveform": "float32"}


def record_fields(cfg: MelConfig) -> list[tuple[str, str]]:
    """(field, dtype) of every member of a record for ``cfg``, ``"json"`` for the JSON one."""
    return [*cfg.record_dtypes().items(), ("json", "json")]


def estimated_record_bytes(cfg: MelConfig) -> int:
    """Uncompressed bytes of one record (arrays plus ~500 bytes of JSON)."""
    total = 500
    for name, shape in cfg.record_shapes().items():
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(cfg.record_dtypes()[name]).itemsize
    return total


class BadFileWarning(UserWarning):
    """An input file was skipped (``on_bad_file = "warn"``); the message names it."""


@runtime_checkable
class MelSource(Protocol):
    """What the builder needs from a source of mel records."""

    def __len__(self) -> int:
        """Number of files (records)."""
        ...

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Records of files ``[start, stop)``, in order, deterministic."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able summary: source kind, path, label mapping, counts."""
        ...


def record_meta(cfg: MelConfig, mel_from: str = "computed") -> dict[str, Any]:
    """The parameters that made a record's mel (every key of :data:`MEL_PARAM_KEYS`).

    ``fmax`` is stated in Hz (never None); ``mel_from`` says who computed the mel.
    """
    meta: dict[str, Any] = {"mel_from": mel_from}
    for key in MEL_PARAM_KEYS:
        meta[key] = getattr(cfg, key)
    meta["fmin"] = float(cfg.fmin)
    meta["fmax"] = cfg.fmax_hz
    meta["power"] = float(cfg.power)
    return meta


def build_records(
    cfg: MelConfig,
    start: int,
    mel: np.ndarray,
    labels: np.ndarray,
    paths: list[str],
    names: list[str],
    waveform: np.ndarray | None,
    mel_from: str = "computed",
) -> list[dict[str, Any]]:
    """Split block arrays into per-file record dicts (views into the block arrays)."""
    meta = record_meta(cfg, mel_from)
    mel = mel.astype(cfg.dtype, copy=False)
    labels = np.asarray(labels, dtype=np.int16)
    out = []
    for j in range(mel.shape[0]):
        rec: dict[str, Any] = {
            "mel": mel[j],
            "label": labels[j].copy().reshape(()),
            "json": {"file_id": start + j, "path": paths[j], "label_name": names[j], **meta},
        }
        if cfg.store_waveform and waveform is not None:
            rec["waveform"] = waveform[j]
        out.append(rec)
    return out


def check_range(start: int, stop: int, n: int) -> None:
    """IndexError unless ``[start, stop)`` lies in ``[0, n)``."""
    if not (0 <= start <= stop <= n):
        raise IndexError(f"record range [{start}, {stop}) outside [0, {n})")


def mel_of_waves(waves: np.ndarray, cfg: MelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Clips ``[B, clip_samples]`` -> (mel in cfg.dtype, segments float32)."""
    seg = segment(np.ascontiguousarray(waves, dtype=np.float32), cfg)
    return log_mel(seg, cfg).astype(cfg.dtype, copy=False), seg
