"""Record sources for the mel cache: the user's HDF5 file, a folder of WAVs, synthetic clips.

A source is an indexed list of audio files. ``len(source)`` is fixed when the
source is constructed; ``source.records(start, stop)`` returns the records of
files ``[start, stop)`` in order, computing the mel of the whole block in one
vectorised call; the same range always gives the same bytes, however the
builder splits the work (see :mod:`cachebuild.mel.spectrogram` for why the mel
is block-independent). Sources are picklable (they hold paths and small
metadata, never open handles), so a builder can ship them to joblib workers.

One record = one file::

    {"mel":      cfg.dtype  [num_long, num_short, n_mels, t],
     "label":    int16      []                      (0-d array)
     "waveform": float32    [num_long, num_short, short_window]   (only with store_waveform)
     "json":     {"file_id", "path", "label_name", "sample_rate", "n_fft", "hop",
                  "n_mels", "fmin", "fmax", "mel_scale", "norm", "log", "power"}}
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cachebuild.errors import ConfigError, SourceError
from cachebuild.mel.config import MelConfig
from cachebuild.mel.segment import segment
from cachebuild.mel.spectrogram import log_mel
from cachebuild.mel.wav import check_wav, load_clip

__all__ = [
    "MEL_FIELDS",
    "record_fields",
    "estimated_record_bytes",
    "BadFileWarning",
    "MelSource",
    "H5Source",
    "WavFolderSource",
    "SyntheticSource",
    "synthesize_clip",
]

#: Array fields of a mel record and their dtypes with the default config
#: (``mel`` follows ``cfg.dtype``; ``waveform`` exists only with ``store_waveform``).
MEL_FIELDS: dict[str, str] = {"mel": "float16", "label": "int16", "waveform": "float32"}


def record_fields(cfg: MelConfig) -> list[tuple[str, str]]:
    """(field, dtype) of every member of a record for ``cfg``, ``"json"`` for the JSON one."""
    return [*cfg.record_dtypes().items(), ("json", "json")]


def estimated_record_bytes(cfg: MelConfig) -> int:
    """Uncompressed bytes of one record (arrays plus ~400 bytes of JSON)."""
    total = 400
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


# ------------------------------------------------------------------ helpers
def _record_meta(cfg: MelConfig) -> dict[str, Any]:
    """The parameters that made a record's mel (same for every record of a source)."""
    return {
        "sample_rate": cfg.sample_rate,
        "n_fft": cfg.n_fft,
        "hop": cfg.hop,
        "n_mels": cfg.n_mels,
        "fmin": float(cfg.fmin),
        "fmax": cfg.fmax_hz,
        "mel_scale": cfg.mel_scale,
        "norm": cfg.norm,
        "log": cfg.log,
        "power": cfg.power,
    }


def _build_records(
    cfg: MelConfig,
    start: int,
    mel: np.ndarray,
    labels: np.ndarray,
    paths: list[str],
    names: list[str],
    waveform: np.ndarray | None,
) -> list[dict[str, Any]]:
    """Split block arrays into per-file record dicts (views into the block arrays)."""
    meta = _record_meta(cfg)
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


def _check_range(start: int, stop: int, n: int) -> None:
    if not (0 <= start <= stop <= n):
        raise IndexError(f"record range [{start}, {stop}) outside [0, {n})")


def _mel_of_waves(waves: np.ndarray, cfg: MelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Clips ``[B, clip_samples]`` -> (mel in cfg.dtype, segments float32)."""
    seg = segment(np.ascontiguousarray(waves, dtype=np.float32), cfg)
    return log_mel(seg, cfg).astype(cfg.dtype, copy=False), seg


# ------------------------------------------------------------------ HDF5
_H5_DEFAULTS = {"labels": "labels", "mel": "segments_mel", "waveform": "segments_waveform"}
# keys of the file's config_json compared with ours (aliases in the user's naming)
_H5_WAVE_KEYS = {"sample_rate": ("sample_rate", "sr"), "short_window": ("short_window",),
                 "long_window": ("long_window",)}
_H5_MEL_KEYS = {"n_fft": ("n_fft",), "hop": ("hop", "hop_length"), "n_mels": ("n_mels",),
                "fmin": ("fmin",), "fmax": ("fmax",)}


class H5Source:
    """Files stored in the user's HDF5 layout (one row of each dataset per file).

    Datasets (names overridable with ``datasets``; map a role to None to ignore
    it): ``labels`` [F] int, ``segments_mel`` [F, num_long, num_short, n_mels, t]
    (used as is when present, cast to ``cfg.dtype``), ``segments_waveform``
    [F, num_long, num_short, short_window] (mel computed from it when there is
    no stored mel; read when ``store_waveform``). Label names come from the
    ``label2id_json`` attribute (else ``labels_json`` if it is a mapping or a
    list of names, else the ids as strings); with ``cfg.labels`` ids are
    remapped by name to the configured mapping. The file's ``config_json``
    attribute, where it names sample rate, windows or mel parameters, must agree
    with ``cfg`` (else SourceError).

    Reads are one slice per dataset per ``records()`` call. The file is opened
    on first use in each process (the handle is never pickled) with a 64 MiB
    chunk cache that evicts fully read chunks first.
    """

    kind = "h5"
    RDCC_NBYTES = 64 * 2**20
    RDCC_NSLOTS = 100_003  # prime, ~ 100x the chunks that fit

    def __init__(self, path: str | os.PathLike[str], cfg: MelConfig,
                 datasets: dict[str, str | None] | None = None) -> None:
        self.path = str(path)
        self.cfg = cfg
        self.datasets = {**_H5_DEFAULTS, **(datasets or {})}
        self._file: Any = None
        self._pid: int | None = None
        try:
            self._inspect(self._h5())
        except BaseException:
            self.close()
            raise

    def _inspect(self, f: Any) -> None:
        """Read labels and attributes, check shapes and parameters against the config."""
        self._mel_ds = self._dataset(f, "mel")
        self._wave_ds = self._dataset(f, "waveform")
        labels_name = self.datasets["labels"]
        if labels_name is None or labels_name not in f:
            raise SourceError(f"{self.path}: no labels dataset '{labels_name}'")
        raw_labels = np.asarray(f[labels_name][...]).reshape(-1)
        self._n = int(raw_labels.shape[0])
        self._check_shapes(f)
        self.file_config = _json_attr(f, "config_json", self.path)
        self._check_config(self.file_config)
        self.label2id, self._labels, self._names = self._resolve_labels(f, raw_labels)

    # -- pickling and lazy opening
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"], state["_pid"] = None, None
        return state

    def _h5(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            import h5py  # imported here: only this source needs it

            try:
                self._file = h5py.File(self.path, "r", rdcc_nbytes=self.RDCC_NBYTES,
                                       rdcc_nslots=self.RDCC_NSLOTS, rdcc_w0=1.0)
            except OSError as exc:
                raise SourceError(f"{self.path}: cannot open HDF5 file: {exc}") from exc
            self._pid = os.getpid()
        return self._file

    def close(self) -> None:
        """Close this process's handle (it is reopened on the next read)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file, self._pid = None, None

    def _dataset(self, f: Any, role: str) -> str | None:
        name = self.datasets.get(role)
        return name if name is not None and name in f else None

    def _check_shapes(self, f: Any) -> None:
        cfg, shapes = self.cfg, self.cfg.record_shapes()
        wave_shape = (cfg.num_long, cfg.num_short, cfg.short_window)
        if self._mel_ds is None and self._wave_ds is None:
            raise SourceError(f"{self.path}: neither '{self.datasets['mel']}' nor "
                              f"'{self.datasets['waveform']}' dataset found")
        if cfg.store_waveform and self._wave_ds is None:
            raise SourceError(f"{self.path}: store_waveform is set but the file has no "
                              f"'{self.datasets['waveform']}' dataset")
        for name, want in ((self._mel_ds, shapes["mel"]), (self._wave_ds, wave_shape)):
            if name is not None and tuple(f[name].shape) != (self._n, *want):
                raise SourceError(f"{self.path}: dataset '{name}' has shape {f[name].shape}, "
                                  f"config expects {(self._n, *want)}")

    def _check_config(self, file_cfg: Any) -> None:
        if not isinstance(file_cfg, dict):
            return
        keys = dict(_H5_WAVE_KEYS)
        if self._mel_ds is not None:  # stored mel is used as is: its parameters must be ours
            keys.update(_H5_MEL_KEYS)
        ours = {**self.cfg.to_dict(), "fmax": self.cfg.fmax_hz}
        for key, aliases in keys.items():
            for alias in aliases:
                theirs = file_cfg.get(alias)
                if isinstance(theirs, (int, float)) and not isinstance(theirs, bool) \
                        and float(theirs) != float(ours[key]):
                    raise SourceError(f"{self.path}: config_json has {alias}={theirs}, "
                                      f"config has {key}={ours[key]}")

    def _resolve_labels(
        self, f: Any, raw: np.ndarray
    ) -> tuple[dict[str, int], np.ndarray, list[str]]:
        file_map = _json_attr(f, "label2id_json", self.path)
        if not isinstance(file_map, dict):
            alt = _json_attr(f, "labels_json", self.path)
            if isinstance(alt, dict):
                file_map = alt
            elif isinstance(alt, list) and alt and all(isinstance(s, str) for s in alt) \
                    and len(set(alt)) == len(alt):
                file_map = {name: i for i, name in enumerate(alt)}
            else:
                file_map = {str(int(v)): int(v) for v in np.unique(raw)}
        id2name = {int(v): str(k) for k, v in file_map.items()}
        unknown = sorted(set(np.unique(raw).tolist()) - set(id2name))
        if unknown:
            first = int(np.flatnonzero(raw == unknown[0])[0])
            raise SourceError(f"{self.path}: label {unknown[0]} of file {first} is not in the "
                              f"file's label mapping {file_map}")
        target = self.cfg.label2id or {name: idx for idx, name in sorted(id2name.items())}
        missing = sorted(set(id2name.values()) - set(target))
        if missing:
            raise SourceError(f"{self.path}: label names {missing} are not in the config's "
                              f"labels {target}")
        lut = {old: target[name] for old, name in id2name.items()}
        labels = np.array([lut[int(v)] for v in raw], dtype=np.int16)
        names = [id2name[int(v)] for v in raw]
        return dict(target), labels, names

    # -- MelSource
    def __len__(self) -> int:
        return self._n

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Records of files ``[start, stop)``: one slice read per dataset."""
        _check_range(start, stop, self._n)
        f = self._h5()
        wave = None
        try:
            if self._wave_ds is not None and (self.cfg.store_waveform or self._mel_ds is None):
                wave = np.asarray(f[self._wave_ds][start:stop], dtype=np.float32)
            if self._mel_ds is not None:
                mel = np.asarray(f[self._mel_ds][start:stop]).astype(self.cfg.dtype, copy=False)
            else:
                assert wave is not None
                mel = log_mel(wave, self.cfg).astype(self.cfg.dtype, copy=False)
        except OSError as exc:
            raise SourceError(f"{self.path}: cannot read files [{start}, {stop}): {exc}") from exc
        name = os.path.basename(self.path)  # records must not depend on where the file lives
        paths = [f"{name}#{i}" for i in range(start, stop)]
        return _build_records(self.cfg, start, mel, self._labels[start:stop], paths,
                              self._names[start:stop], wave)

    def describe(self) -> dict[str, Any]:
        counts = {name: int(np.sum(self._labels == idx)) for name, idx in self.label2id.items()}
        return {"kind": self.kind, "path": self.path, "n_files": self._n,
                "label2id": self.label2id, "label_counts": counts,
                "mel_from": "stored" if self._mel_ds else "waveform",
                "datasets": self.datasets, "file_config": self.file_config}


def _json_attr(f: Any, name: str, path: str) -> Any:
    """A JSON string attribute of the file, parsed; None when absent."""
    if name not in f.attrs:
        return None
    raw = f.attrs[name]
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    try:
        return json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: attribute {name} is not valid JSON: {exc}") from exc


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
    shift record numbers. Only ``*.wav`` files (any case) are considered;
    hidden files and folders are ignored.
    """

    kind = "wav"

    def __init__(self, root: str | os.PathLike[str], cfg: MelConfig) -> None:
        self.root = Path(root)
        self.cfg = cfg
        if not self.root.is_dir():
            raise SourceError(f"{self.root}: not a directory")
        folders = sorted(d.name for d in self.root.iterdir()
                         if d.is_dir() and not d.name.startswith("."))
        if not folders:
            raise SourceError(f"{self.root}: no label subfolders")
        self.label2id = cfg.label2id or {name: i for i, name in enumerate(folders)}
        stray = [name for name in folders if name not in self.label2id]
        if stray:
            raise SourceError(f"{self.root}: folders {stray} have no id in the config's "
                              f"labels {self.label2id}")
        self._files: list[tuple[str, str, Any]] = []  # (relative path, label name, WavInfo)
        self.skipped: list[dict[str, str]] = []
        for name in folders:
            for path in sorted((p for p in (self.root / name).iterdir()
                                if p.suffix.lower() == ".wav" and not p.name.startswith(".")
                                and p.is_file()), key=lambda p: p.name):
                self._scan(path, name)

    def _scan(self, path: Path, label_name: str) -> None:
        try:
            info = check_wav(path, self.cfg)
        except SourceError as exc:
            if self.cfg.on_bad_file == "error":
                raise
            warnings.warn(f"skipping bad WAV file: {exc}", BadFileWarning, stacklevel=3)
            self.skipped.append({"path": path.relative_to(self.root).as_posix(),
                                 "reason": str(exc)})
            return
        self._files.append((path.relative_to(self.root).as_posix(), label_name, info))

    def __len__(self) -> int:
        return len(self._files)

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Decode files ``[start, stop)`` one by one, then one mel call for the block."""
        _check_range(start, stop, len(self._files))
        block = self._files[start:stop]
        waves = np.empty((len(block), self.cfg.clip_samples), dtype=np.float32)
        for j, (rel, _, info) in enumerate(block):
            waves[j] = load_clip(self.root / rel, self.cfg, info)
        mel, seg = _mel_of_waves(waves, self.cfg)
        names = [name for _, name, _ in block]
        labels = np.array([self.label2id[n] for n in names], dtype=np.int16)
        return _build_records(self.cfg, start, mel, labels, [rel for rel, _, _ in block],
                              names, seg)

    def describe(self) -> dict[str, Any]:
        counts = {name: 0 for name in self.label2id}
        for _, name, _ in self._files:
            counts[name] += 1
        rates = sorted({info.sample_rate for _, _, info in self._files})
        return {"kind": self.kind, "path": str(self.root), "n_files": len(self._files),
                "label2id": self.label2id, "label_counts": counts, "sample_rates": rates,
                "n_skipped": len(self.skipped), "skipped": self.skipped}


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
            raise ConfigError.bad_value("labels", self.label2id,
                                        "synthetic data needs ids for LEAK and NOLEAK")

    def __len__(self) -> int:
        return self.n_files

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        _check_range(start, stop, self.n_files)
        waves = np.empty((stop - start, self.cfg.clip_samples), dtype=np.float32)
        names = []
        for j, i in enumerate(range(start, stop)):
            rng = np.random.default_rng([self.seed, i])
            leak, waves[j] = synthesize_clip(rng, self.cfg.clip_samples, self.cfg.sample_rate)
            names.append(self.NAMES[0] if leak else self.NAMES[1])
        mel, seg = _mel_of_waves(waves, self.cfg)
        labels = np.array([self.label2id[n] for n in names], dtype=np.int16)
        paths = [f"synthetic://{self.seed}/{i}" for i in range(start, stop)]
        return _build_records(self.cfg, start, mel, labels, paths, names, seg)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": f"synthetic://{self.seed}", "n_files": self.n_files,
                "seed": self.seed, "label2id": self.label2id}


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
