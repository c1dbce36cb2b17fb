"""Record sources for the mel cache: the user's HDF5 file, a folder of WAVs, synthetic clips.

A source is an indexed list of audio files. ``len(source)`` is fixed when the
source is constructed; ``source.records(start, stop)`` returns the records of
files ``[start, stop)`` in order, computing the mel of the whole block in one
vectorised call; the same range always gives the same bytes, however the
builder splits the work (see :mod:`cachebuild.mel.spectrogram` for why the mel
is block-independent). Sources are picklable (they hold paths and small
metadata, never open handles), so a builder can ship them to joblib workers.

The record layout (shared by all sources) is in :mod:`cachebuild.mel.records`,
the HDF5 source in :mod:`cachebuild.mel.h5`; both are re-exported here.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cachebuild.builder.markers import holds_cache
from cachebuild.errors import ConfigError, SourceError
from cachebuild.mel.config import MelConfig
from cachebuild.mel.h5 import H5Source, StoredMelWarning
from cachebuild.mel.records import (
    MEL_FIELDS,
    BadFileWarning,
    MelSource,
    build_records,
    check_range,
    estimated_record_bytes,
    mel_of_waves,
    record_fields,
)
from cachebuild.mel.other_audio import AUDIO_SUFFIXES, SoundFileInfo, soundfile_version
from cachebuild.mel.wav import check_audio, load_clip

__all__ = [
    "MEL_FIELDS",
    "record_fields",
    "estimated_record_bytes",
    "BadFileWarning",
    "MelSource",
    "H5Source",
    "StoredMelWarning",
    "WavFolderSource",
    "SyntheticSource",
    "synthesize_clip",
]


# ------------------------------------------------------------------ WAV folder
class WavFolderSource:
    """``root/<LABEL>/*.wav``: label subfolders sorted by name, files sorted by name.

    The label mapping is ``cfg.labels`` if given (every folder must be in it),
    else the folder names in sorted order -> 0, 1, ... . Every file's header is
    checked at construction (format, completeness, sample rate unless
    resampling, length unless padding): with ``on_bad_file = "warn"`` a bad file
    is excluded with a :class:`BadFileWarning` naming it (so ``len()`` and the
    record numbering are fixed from then on), with ``"error"`` a SourceError
    names it. A file that passes the scan but cannot be decoded later (changed
    on disk) is a SourceError whatever the policy, since skipping it then would
    shift record numbers. ``*.wav`` files (any case) are read by our RIFF
    reader; other audio files (``.flac``, ``.ogg``, ``.mp3``, ...) through
    ``soundfile`` when it is installed and can open them, else they are bad
    files ("unsupported format; convert it to WAV or install soundfile") and so
    appear in the skipped list; hidden files and non-audio files are ignored, and so
    is a folder holding a cachebuild cache (an ``--out`` inside ROOT is no label).
    Audio files the walk does not read (at the top level, or in folders inside
    a label folder) are named in one warning and listed as ``not_read`` in
    :meth:`describe` (they used to be dropped silently).
    """

    kind = "wav"

    def __init__(self, root: str | os.PathLike[str], cfg: MelConfig) -> None:
        self.root = Path(root)
        self.cfg = cfg
        if not self.root.is_dir():
            raise SourceError(f"{self.root}: " + ("not a directory" if self.root.exists() else "no such folder"))
        folders = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".") and not holds_cache(d))
        if not folders:
            raise SourceError(f"{self.root}: no label subfolders")
        self.label2id = cfg.label2id or {name: i for i, name in enumerate(folders)}
        stray = [name for name in folders if name not in self.label2id]
        if stray:
            raise SourceError(f"{self.root}: folders {stray} have no id in the config's labels {self.label2id}")
        self._files: list[tuple[str, str, Any]] = []  # (relative path, label name, WavInfo)
        self.skipped: list[dict[str, str]] = []
        for name in folders:
            for path in sorted((p for p in (self.root / name).iterdir() if _is_audio(p)), key=lambda p: p.name):
                self._scan(path, name)
        self.not_read = _audio_outside_label_folders(self.root, folders)
        if self.not_read:
            example = ", ".join(self.not_read[:3]) + (", ..." if len(self.not_read) > 3 else "")
            warnings.warn(
                f"{self.root}: {len(self.not_read)} audio file(s) not read: only ROOT/<LABEL>/<file> is read, not the top level or deeper folders ({example}); move them into their label folder",
                BadFileWarning,
                stacklevel=2,
            )

    def _scan(self, path: Path, label_name: str) -> None:
        try:
            info = check_audio(path, self.cfg)
        except SourceError as exc:
            if self.cfg.on_bad_file == "error":
                raise
            warnings.warn(f"skipping bad audio file: {exc}", BadFileWarning, stacklevel=3)
            self.skipped.append({"path": path.relative_to(self.root).as_posix(), "reason": str(exc)})
            return
        self._files.append((path.relative_to(self.root).as_posix(), label_name, info))

    def __len__(self) -> int:
        return len(self._files)

    def __getstate__(self) -> dict[str, Any]:
        """What a worker gets: ``root`` and each file's header path absolute (a running Dask or Ray cluster's
        workers have their own working folders; records name files relative to ``root``, so they do not change)."""
        state = self.__dict__.copy()
        state["root"] = self.root.absolute()
        state["_files"] = [(rel, name, replace(info, path=os.path.abspath(info.path))) for rel, name, info in self._files]
        return state

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Decode files ``[start, stop)`` one by one, then one mel call for the block."""
        check_range(start, stop, len(self._files))
        block = self._files[start:stop]
        waves = np.empty((len(block), self.cfg.clip_samples), dtype=np.float32)
        for j, (rel, _, info) in enumerate(block):
            waves[j] = load_clip(self.root / rel, self.cfg, info)
        mel, seg = mel_of_waves(waves, self.cfg)
        names = [name for _, name, _ in block]
        labels = np.array([self.label2id[n] for n in names], dtype=np.int16)
        return build_records(self.cfg, start, mel, labels, [rel for rel, _, _ in block], names, seg)

    def input_files(self) -> list[str]:
        """The audio files read (for the builder's changed-input note)."""
        return [str(self.root / rel) for rel, _, _ in self._files]

    def describe(self) -> dict[str, Any]:
        counts = {name: 0 for name in self.label2id}
        for _, name, _ in self._files:
            counts[name] += 1
        rates = sorted({info.sample_rate for _, _, info in self._files})
        return {
            "kind": self.kind,
            "path": str(self.root),
            "n_files": len(self._files),
            "label2id": self.label2id,
            "label_counts": counts,
            "sample_rates": rates,
            "n_skipped": len(self.skipped),
            "skipped": self.skipped,
            **({"not_read": self.not_read} if self.not_read else {}),  # absent when empty: older caches' descriptions unchanged
            **self._decoders(),
        }

    def _decoders(self) -> dict[str, Any]:
        """libsndfile's version when some files were read through soundfile (lossy decoders may change)."""
        if any(isinstance(info, SoundFileInfo) for _, _, info in self._files):
            return {"libsndfile": soundfile_version()}
        return {}


def _is_audio(path: Path) -> bool:
    """A visible file with an audio suffix (any case)."""
    return path.suffix.lower() in AUDIO_SUFFIXES and not path.name.startswith(".") and path.is_file()


def _audio_outside_label_folders(root: Path, folders: list[str]) -> list[str]:
    """Audio files under ``root`` that the label-folder walk does not read: at the top level, or
    in a folder inside a label folder (relative paths, sorted). Hidden folders are not searched."""
    stray = [p for p in root.iterdir() if _is_audio(p)]
    for name in folders:
        for sub in (d for d in (root / name).iterdir() if d.is_dir() and not d.name.startswith(".")):
            stray += [p for p in sub.rglob("*") if _is_audio(p) and not any(part.startswith(".") for part in p.relative_to(sub).parts)]
    return sorted(p.relative_to(root).as_posix() for p in stray)


# ------------------------------------------------------------------ synthetic
class SyntheticSource:
    """``n_files`` synthetic leak / no-leak clips; file i depends only on ``(seed, i)``.

    Audio comes from :func:`synthesize_clip` with ``np.random.default_rng([seed,
    i])``, so any range gives the same records however it is split. Labels are
    drawn per file (about half each) and mapped through ``cfg.labels`` (which
    must then name ``LEAK`` and ``NOLEAK``) or ``{"LEAK": 0, "NOLEAK": 1}``.
    """

    kind = "synthetic"
    NAMES = ("LEAK", "NOLEAK")

    def __init__(self, n_files: int, cfg: MelConfig, seed: int = 0) -> None:
        if isinstance(n_files, bool) or not isinstance(n_files, int) or n_files < 0:
            raise ConfigError.bad_value("n_files", n_files, "a non-negative integer")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError.bad_value("seed", seed, "a non-negative integer")
        self.n_files, self.cfg, self.seed = n_files, cfg, seed
        self.label2id = cfg.label2id or {name: i for i, name in enumerate(self.NAMES)}
        if any(name not in self.label2id for name in self.NAMES):
            raise ConfigError.bad_value("labels", self.label2id, "synthetic data needs ids for LEAK and NOLEAK")

    def __len__(self) -> int:
        return self.n_files

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        check_range(start, stop, self.n_files)
        waves = np.empty((stop - start, self.cfg.clip_samples), dtype=np.float32)
        names = []
        for j, i in enumerate(range(start, stop)):
            rng = np.random.default_rng([self.seed, i])
            leak, waves[j] = synthesize_clip(rng, self.cfg.clip_samples, self.cfg.sample_rate)
            names.append(self.NAMES[0] if leak else self.NAMES[1])
        mel, seg = mel_of_waves(waves, self.cfg)
        labels = np.array([self.label2id[n] for n in names], dtype=np.int16)
        paths = [f"synthetic://{self.seed}/{i}" for i in range(start, stop)]
        return build_records(self.cfg, start, mel, labels, paths, names, seg)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": f"synthetic://{self.seed}", "n_files": self.n_files, "seed": self.seed, "label2id": self.label2id}


def synthesize_clip(rng: np.random.Generator, n: int, sr: int) -> tuple[bool, np.ndarray]:
    """One synthetic clip of ``n`` samples at ``sr`` Hz: (is_leak, float32 audio in [-1, 1]).

    Leak: broadband turbulent hiss (band-passed Gaussian noise, lower edge
    80-200 Hz, upper roll-off 0.9-1.8 kHz) with 2-5 resonances (narrow
    Lorentzian peaks, Q 15-60) plus 1-3 sinusoids whose frequency wanders
    slowly (+-0.3 %, random walk). No leak: ambient 1/f^a noise (a in [1, 2],
    pink to brown), mains hum (50/60 Hz + 2 harmonics) in 30 % of clips, and a
    Poisson(1.5) number of decaying clicks. Levels are log-uniform (leaks
    louder on average but overlapping), then clipped to [-1, 1] like a recorder.
    Every draw comes from ``rng`` in a fixed order: the clip is a pure function
    of the generator's state.
    """
    leak = bool(rng.integers(2) == 0)
    freqs = np.fft.rfftfreq(n, 1.0 / sr)
    white = rng.standard_normal(freqs.size) + 1j * rng.standard_normal(freqs.size)
    nyq = sr / 2
    if leak:
        f_lo, f_hi = rng.uniform(80, 200), rng.uniform(0.45, 0.9) * nyq
        ratio = (freqs / f_lo) ** 2
        env = ratio / (1 + ratio) / np.sqrt(1 + (freqs / f_hi) ** 4)
        k = int(rng.integers(2, 6))
        centre = rng.uniform(0.12, 0.88, k) * nyq
        width = centre / rng.uniform(15, 60, k)
        gain = rng.uniform(1, 6, k)
        env = env + (gain[:, None] / (1 + ((freqs - centre[:, None]) / width[:, None]) ** 2)).sum(0)
        x = _unit_rms(np.fft.irfft(white * env, n))
        m = int(rng.integers(1, 4))
        tone_f = rng.uniform(0.12, 0.88, m) * nyq
        amps = rng.uniform(0.1, 0.5, m)
        phase0 = rng.uniform(0, 2 * np.pi, m)
        walk = np.cumsum(rng.normal(0, 1, (m, 33)), axis=1) * 0.001
        grid = np.linspace(0, n - 1, 33)
        for f0, a, p0, w in zip(tone_f, amps, phase0, walk):
            inst = f0 * (1 + np.interp(np.arange(n), grid, w))
            x += a * np.sin(p0 + 2 * np.pi * np.cumsum(inst) / sr)
        level = np.exp(rng.uniform(np.log(0.02), np.log(0.25)))
    else:
        alpha = rng.uniform(1.0, 2.0)
        env = np.maximum(freqs, 5.0) ** (-alpha / 2)
        env[0] = 0.0
        x = _unit_rms(np.fft.irfft(white * env, n))
        if rng.random() < 0.3:
            hum_f = 50.0 if rng.random() < 0.5 else 60.0
            amps, phases = rng.uniform(0.05, 0.3, 3), rng.uniform(0, 2 * np.pi, 3)
            t = np.arange(n) / sr
            for h in range(3):
                x += amps[h] * np.sin(phases[h] + 2 * np.pi * hum_f * (h + 1) * t)
        for _ in range(int(rng.poisson(1.5))):
            t0, amp = int(rng.integers(0, n)), rng.uniform(2, 8)
            tau = rng.uniform(0.002, 0.02) * sr
            length = min(int(5 * tau) + 1, n - t0)
            burst = rng.standard_normal(length) * np.exp(-np.arange(length) / tau)
            x[t0 : t0 + length] += amp * burst
        level = np.exp(rng.uniform(np.log(0.005), np.log(0.1)))
    x = _unit_rms(x) * level
    return leak, np.clip(x, -1.0, 1.0).astype(np.float32)


def _unit_rms(x: np.ndarray) -> np.ndarray:
    return x / max(float(np.sqrt(np.mean(x * x))), 1e-12)
