"""An HDF5 file's ``config_json`` against our mel config: what to check, and when.

The users' builder writes ``config_json = {"sample_rate", "duration_sec",
"long_window", "short_window", "n_mels", "n_fft", "hop_length", "power"}``; the
rest of what made its mels is torchaudio's ``MelSpectrogram`` defaults (HTK
scale, no norm, f_min 0, f_max sr/2, ``center=False`` passed explicitly, 20 log10
with a 1e-10 floor), which are our defaults too. Other tools use other names
(``sr``, ``f_min``, ``htk``...): :data:`FILE_KEY_ALIASES` maps them to ours.

Two cases, two rules (see docs/DECISIONS.md):

* **mels recomputed from the stored waveforms**: every parameter that changes the
  numbers (:data:`~cachebuild.mel.config.MEL_PARAM_KEYS`) and that the file
  states must equal ours, else :func:`check_recompute` refuses in one line naming
  the key, both values and the ``--set`` flag that follows the file.
* **stored mels copied through**: our mel parameters do not apply, so nothing is
  refused for them; the records state the file's parameters
  (:func:`stored_config`: ours, overridden by every key the file states). Only the
  stored dataset's shape must agree with them (:func:`check_mel_shape`).

A key the file does not state is taken from our config (whose defaults are the
users' builder's), and never checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cachebuild.errors import ConfigError, SourceError
from cachebuild.mel.config import MEL_PARAM_KEYS, MelConfig, coerce_value

__all__ = [
    "FILE_KEY_ALIASES",
    "FileParams",
    "read_file_params",
    "check_recompute",
    "stored_config",
    "config_differences",
    "check_mel_shape",
]

#: Our key -> the names it may have in a file's config_json (ours first).
FILE_KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "sample_rate": ("sample_rate", "sr"),
    "long_window": ("long_window",),
    "short_window": ("short_window",),
    "n_fft": ("n_fft",),
    "hop": ("hop", "hop_length"),
    "center": ("center",),
    "pad_mode": ("pad_mode",),
    "n_mels": ("n_mels",),
    "fmin": ("fmin", "f_min"),
    "fmax": ("fmax", "f_max"),
    "mel_scale": ("mel_scale", "htk"),
    "norm": ("norm",),
    "power": ("power",),
    "log": ("log",),
    "log_floor": ("log_floor", "amin"),
    "top_db": ("top_db",),
}

#: Keys checked when mels are recomputed: what changes the numbers, and what cuts the windows.
_RECOMPUTE_KEYS = ("long_window", *MEL_PARAM_KEYS)
_LOWER = ("mel_scale", "log", "pad_mode", "norm")


@dataclasses.dataclass(frozen=True)
class FileParams:
    """What a file's config_json says, in our keys: ``values[key]`` and the name it had."""

    values: dict[str, Any]
    names: dict[str, str]
    raw: dict[str, Any] = dataclasses.field(default_factory=dict)  # as written in the file
    unsupported: tuple[str, ...] = ()  # "win_length=400 (...)" lines: recompute cannot follow

    def stated(self, key: str) -> str:
        """``name=value`` as the file wrote it, for messages."""
        return f"{self.names[key]}={self.raw.get(key, self.values[key])!r}"


def _normalise(key: str, alias: str, value: Any) -> Any:
    """One raw config_json value in our key's type (SourceError text on failure)."""
    if alias == "htk" and isinstance(value, bool):
        return "htk" if value else "slaney"
    if isinstance(value, str) and key in _LOWER:
        value = value.lower()
    if isinstance(value, float) and value.is_integer() and key in ("sample_rate", "long_window", "short_window", "n_fft", "hop", "n_mels"):
        value = int(value)
    return coerce_value(key, value)


def read_file_params(file_cfg: Any, where: str) -> FileParams:
    """Read the keys we know from a parsed ``config_json`` (None or not a table: nothing).

    Two names for one key with different values, or a value of the wrong type,
    is a SourceError naming the file, the name(s) and the value(s).
    """
    if not isinstance(file_cfg, Mapping):
        return FileParams({}, {})
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    raw: dict[str, Any] = {}
    for key, aliases in FILE_KEY_ALIASES.items():
        for alias in aliases:
            if alias not in file_cfg:
                continue
            try:
                value = _normalise(key, alias, file_cfg[alias])
            except ConfigError as exc:
                raise SourceError(f"{where}: config_json has {alias}={file_cfg[alias]!r}, not a valid {key}: {exc}") from exc
            if key in values and values[key] != value:
                raise SourceError(f"{where}: config_json disagrees with itself: {names[key]}={values[key]!r} but {alias}={value!r}")
            values.setdefault(key, value)
            names.setdefault(key, alias)
            raw.setdefault(key, file_cfg[alias])
    return FileParams(values, names, raw, _unsupported(file_cfg, values))


def _unsupported(file_cfg: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[str, ...]:
    """Settings of the file that cachebuild cannot reproduce (window length, window type)."""
    out = []
    win, n_fft = file_cfg.get("win_length"), values.get("n_fft")
    if win is not None and n_fft is not None and win != n_fft:
        out.append(f"win_length={win!r} (cachebuild's window is n_fft={n_fft} samples long)")
    window = file_cfg.get("window")
    if window is not None and str(window).lower() not in ("hann", "hann_window"):
        out.append(f"window={window!r} (cachebuild uses a periodic Hann window)")
    return tuple(out)


def _fmax_hz(params: Mapping[str, Any], cfg: MelConfig) -> float:
    fmax = params["fmax"]
    if fmax is not None:
        return float(fmax)
    return float(params.get("sample_rate", cfg.sample_rate)) / 2


def _same(theirs: Any, ours: Any) -> bool:
    if isinstance(theirs, bool) or isinstance(ours, bool) or theirs is None or ours is None:
        return theirs == ours
    if isinstance(theirs, (int, float)) and isinstance(ours, (int, float)):
        return float(theirs) == float(ours)
    return theirs == ours


def _mismatches(cfg: MelConfig, params: FileParams) -> list[tuple[str, Any, Any]]:
    """(key, file's value, ours) for every stated key that differs from ``cfg``."""
    out = []
    for key in _RECOMPUTE_KEYS:
        if key not in params.values:
            continue
        if key == "pad_mode" and not (cfg.center and params.values.get("center", True)):
            continue  # padding only exists with center
        theirs, ours = params.values[key], getattr(cfg, key)
        if key == "fmax":
            theirs, ours = _fmax_hz(params.values, cfg), cfg.fmax_hz
        if not _same(theirs, ours):
            out.append((key, theirs, ours))
    return out


def _fix(key: str, value: Any) -> str:
    """The CLI flag that sets ``key`` to ``value`` (None: leave the key out, except norm)."""
    if value is None:
        return "--set norm=none" if key == "norm" else f"no {key} in the config"
    if isinstance(value, bool):
        return f"--set {key}={'true' if value else 'false'}"
    return f"--set {key}={value}"


def check_recompute(cfg: MelConfig, params: FileParams, where: str, wave_ds: str) -> None:
    """Refuse to recompute mels from ``wave_ds`` with parameters the file says differ.

    One line: each differing key with the file's name and value and ours, then
    the ``--set`` flags that make the config follow the file.
    """
    if params.unsupported:
        raise SourceError(f"{where}: config_json has {'; '.join(params.unsupported)}; mels recomputed from '{wave_ds}' could not match the file's; keep its stored mels instead")
    diffs = _mismatches(cfg, params)
    if not diffs:
        return
    parts = [f"{key}: file {params.stated(key)}, config {key}={ours!r}" for key, _, ours in diffs]
    flags = " ".join(_fix(key, theirs) for key, theirs, _ in diffs)
    raise SourceError(f"{where}: config_json disagrees with the config on the parameters of mels recomputed from '{wave_ds}' ({'; '.join(parts)}); pass {flags} to follow the file")


def stored_config(cfg: MelConfig, params: FileParams, where: str) -> MelConfig:
    """The config that describes stored mels: ``cfg`` with every key the file states."""
    changes = {k: v for k, v in params.values.items() if getattr(cfg, k) != v}
    if not changes:
        return cfg
    try:
        return dataclasses.replace(cfg, **changes)
    except ConfigError as exc:
        raise SourceError(f"{where}: config_json describes mels cachebuild cannot represent: {exc}") from exc


def config_differences(ours: MelConfig, stored: MelConfig) -> list[str]:
    """``key: stored X, config Y`` for every mel parameter where the two differ."""
    out = []
    for key in ("long_window", *MEL_PARAM_KEYS):
        a, b = getattr(stored, key), getattr(ours, key)
        if key == "fmax":
            a, b = stored.fmax_hz, ours.fmax_hz
        if not _same(a, b):
            out.append(f"{key}: stored {a!r}, config {b!r}")
    return out


def check_mel_shape(name: str, shape: tuple[int, ...], n_files: int, cfg: MelConfig, params: FileParams, where: str) -> None:
    """The stored mel dataset must have the shape ``cfg`` (the stored parameters) gives.

    A dimension that disagrees is named with where its expected value came from:
    the file's own config_json (the file contradicts itself) or our config (with
    the ``--set`` flag that would follow the dataset).
    """
    want = (n_files, *cfg.record_shapes()["mel"])
    if tuple(shape) == want:
        return
    if len(shape) != len(want):
        raise SourceError(f"{where}: dataset '{name}' has shape {tuple(shape)}, expected {len(want)} axes [files, num_long, num_short, n_mels, t] = {want}")
    dims = ("files", "num_long", "num_short", "n_mels", "t")
    sources = {"num_long": ("num_long",), "num_short": ("long_window", "short_window"), "n_mels": ("n_mels",), "t": ("short_window", "n_fft", "hop", "center")}
    parts = []
    for dim, got, exp in zip(dims, shape, want):
        if got == exp:
            continue
        keys = sources.get(dim, ())
        stated = [params.stated(k) for k in keys if k in params.values]
        if dim == "files":
            origin = f"the labels dataset has {exp} entries"
        elif stated:
            origin = f"config_json has {', '.join(stated)}"
        elif dim in ("num_long", "n_mels"):
            origin = f"the config has {dim}={exp}; pass --set {dim}={got} to follow the file"
        else:
            origin = f"the config's {'/'.join(keys)} give {exp}"
        parts.append(f"{dim} {got} in the dataset but {exp} expected ({origin})")
    raise SourceError(f"{where}: dataset '{name}' has shape {tuple(shape)}: {'; '.join(parts)}")
