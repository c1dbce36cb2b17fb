"""Configuration of the mel-spectrogram cache: one frozen dataclass, parsed once.

:class:`MelConfig` says how audio becomes records: the sample rate the audio must
have, how a clip is cut (``num_long`` long windows of ``long_window`` samples,
each cut into ``long_window // short_window`` non-overlapping short windows), how
each short window becomes a log-mel image (STFT, mel filterbank, log), how the
result is stored (``dtype``), and what to do with input files that do not fit.

The defaults are the users' own builder: torchaudio's
``MelSpectrogram(sample_rate=4096, n_fft=512, hop_length=128, n_mels=64,
power=1.0, center=False)`` with torchaudio's defaults (HTK mel scale, no filter
normalisation, f_min 0, f_max sr/2, periodic Hann window of n_fft samples),
then ``20 * log10(clamp(x, 1e-10))`` stored as float16. Slaney's scale and
normalisation (librosa's defaults) stay available as ``mel_scale = "slaney"``,
``norm = "slaney"``.

:func:`parse_mel_config` is where a TOML table or CLI dict enters: it rejects
unknown keys, checks types, and builds the dataclass, whose ``__post_init__``
validates values (so a directly constructed ``MelConfig`` is checked too).
Every error is a :class:`~cachebuild.errors.ConfigError` naming key, value and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cachebuild.errors import ConfigError

__all__ = ["MelConfig", "parse_mel_config", "coerce_value", "IGNORED_TOP_LEVEL_KEYS", "MEL_PARAM_KEYS"]

#: Top-level keys of a cache config that belong to the builder, not to the mel part.
IGNORED_TOP_LEVEL_KEYS = frozenset({"seed", "out", "build", "kind", "source"})

_CHOICES: dict[str, tuple[Any, ...]] = {
    "mel_scale": ("slaney", "htk"),
    "norm": ("slaney", None),
    "log": ("db", "none"),
    "dtype": ("float16", "float32"),
    "resample": ("refuse", "resample"),
    "on_bad_file": ("warn", "error"),
    "short_clip": ("refuse", "pad"),
    "pad_mode": ("reflect", "constant"),
}

#: The keys that change the numbers of a mel image (given the same waveform window).
MEL_PARAM_KEYS = (
    "sample_rate",
    "short_window",
    "n_fft",
    "hop",
    "center",
    "pad_mode",
    "n_mels",
    "fmin",
    "fmax",
    "mel_scale",
    "norm",
    "power",
    "log",
    "log_floor",
    "top_db",
)


@dataclass(frozen=True)
class MelConfig:
    """How audio files become mel records (all fields validated on construction).

    ``num_long=None`` derives the number of long windows from ``clip_seconds``:
    ``floor(clip_seconds * sample_rate / long_window)``; the resolved integer is
    stored, so ``to_dict()`` always carries it. ``fmax=None`` means
    ``sample_rate / 2`` (see :attr:`fmax_hz`). ``pad_mode`` matters only with
    ``center``: ``"reflect"`` (torchaudio's default) or ``"constant"`` (zeros,
    librosa >= 0.10's default). ``labels`` is an optional global
    mapping label name -> integer id, stored as a sorted tuple of pairs so the
    config stays hashable; :attr:`label2id` gives it back as a dict.
    """

    sample_rate: int = 4096
    clip_seconds: float = 10.0
    long_window: int = 1024
    num_long: int | None = None
    short_window: int = 512
    n_fft: int = 512
    hop: int = 128
    center: bool = False
    pad_mode: str = "reflect"
    n_mels: int = 64
    fmin: float = 0.0
    fmax: float | None = None
    mel_scale: str = "htk"
    norm: str | None = None
    power: float = 1.0
    log: str = "db"
    log_floor: float = 1e-10
    top_db: float | None = None
    dtype: str = "float16"
    store_waveform: bool = False
    resample: str = "refuse"
    on_bad_file: str = "warn"
    short_clip: str = "refuse"
    labels: tuple[tuple[str, int], ...] | None = field(default=None)

    def __post_init__(self) -> None:
        _positive_int(self, "sample_rate", "long_window", "short_window", "n_fft", "hop", "n_mels")
        _positive_number(self, "clip_seconds", "power", "log_floor")
        if self.num_long is None:
            derived = int(math.floor(self.clip_seconds * self.sample_rate / self.long_window))
            if derived < 1:
                raise ConfigError.bad_value(
                    "clip_seconds",
                    self.clip_seconds,
                    f"a clip must hold at least one long window of {self.long_window} samples",
                )
            object.__setattr__(self, "num_long", derived)
        else:
            _positive_int(self, "num_long")
        if self.long_window % self.short_window:
            raise ConfigError.bad_value(
                "short_window",
                self.short_window,
                f"must divide long_window ({self.long_window}) exactly",
            )
        if self.n_fft > self.short_window:
            raise ConfigError.bad_value("n_fft", self.n_fft, f"must be <= short_window ({self.short_window})")
        if not isinstance(self.center, bool):
            raise ConfigError.bad_value("center", self.center, "true or false")
        if not isinstance(self.store_waveform, bool):
            raise ConfigError.bad_value("store_waveform", self.store_waveform, "true or false")
        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ConfigError.bad_value(key, getattr(self, key), f"one of {list(allowed)}")
        nyquist = self.sample_rate / 2
        if self.fmax is not None:
            _positive_number(self, "fmax")
            if self.fmax > nyquist:
                raise ConfigError.bad_value("fmax", self.fmax, f"must be <= sample_rate/2 ({nyquist})")
        if not _is_number(self.fmin) or self.fmin < 0 or self.fmin >= self.fmax_hz:
            raise ConfigError.bad_value("fmin", self.fmin, f"a number in [0, fmax={self.fmax_hz})")
        if self.top_db is not None:
            _positive_number(self, "top_db")
        if self.labels is not None:
            object.__setattr__(self, "labels", _check_labels(self.labels))

    # ----------------------------------------------------------- derived values
    @property
    def fmax_hz(self) -> float:
        """Upper edge of the filterbank in Hz (``fmax`` or the Nyquist frequency)."""
        return float(self.sample_rate) / 2 if self.fmax is None else float(self.fmax)

    @property
    def num_short(self) -> int:
        """Short windows per long window."""
        return self.long_window // self.short_window

    @property
    def clip_samples(self) -> int:
        """Samples of one clip that are used: ``num_long * long_window`` (the rest is dropped)."""
        assert self.num_long is not None  # resolved in __post_init__
        return self.num_long * self.long_window

    @property
    def label2id(self) -> dict[str, int] | None:
        """The configured label mapping as a dict, or None when not configured."""
        return None if self.labels is None else dict(self.labels)

    def frames_per_short(self) -> int:
        """STFT frames per short window (``t``): ``1 + (short - n_fft) // hop`` (no
        padding, torchaudio's and librosa's ``center=False``), or ``1 + short // hop``
        with ``center`` (``n_fft // 2`` samples of padding each side)."""
        if self.center:
            return 1 + self.short_window // self.hop
        return 1 + (self.short_window - self.n_fft) // self.hop

    def record_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each array field of one record (``waveform`` only if stored)."""
        assert self.num_long is not None
        shapes: dict[str, tuple[int, ...]] = {
            "mel": (self.num_long, self.num_short, self.n_mels, self.frames_per_short()),
            "label": (),
        }
        if self.store_waveform:
            shapes["waveform"] = (self.num_long, self.num_short, self.short_window)
        return shapes

    def record_dtypes(self) -> dict[str, str]:
        """NumPy dtype name of each array field of one record."""
        dtypes = {"mel": self.dtype, "label": "int16"}
        if self.store_waveform:
            dtypes["waveform"] = "float32"
        return dtypes

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field; ``parse_mel_config(cfg.to_dict()) == cfg``."""
        out = dataclasses.asdict(self)
        out["labels"] = self.label2id
        return out


# --------------------------------------------------------------------- parsing
_FIELD_TYPES: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(MelConfig)}


def parse_mel_config(mapping: Mapping[str, Any] | MelConfig | None) -> MelConfig:
    """Build a :class:`MelConfig` from a TOML/CLI mapping (or pass one through).

    Keys of the whole cache config that are not the mel part's business
    (:data:`IGNORED_TOP_LEVEL_KEYS`) are skipped; any other unknown key is an
    error. ``norm`` accepts the string ``"none"`` (TOML has no null) as None;
    ``labels`` is a table name -> id. Absent keys take the defaults above.
    """
    if mapping is None:
        return MelConfig()
    if isinstance(mapping, MelConfig):
        return mapping
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"mel config must be a table/mapping, got {type(mapping).__name__}")
    kwargs: dict[str, Any] = {}
    for key, value in mapping.items():
        if key in IGNORED_TOP_LEVEL_KEYS:
            continue
        if key not in _FIELD_TYPES:
            raise ConfigError(f"unknown mel config key '{key}' (value {value!r}); known keys: {sorted(_FIELD_TYPES)}")
        kwargs[key] = _coerce(key, value)
    return MelConfig(**kwargs)


def coerce_value(key: str, value: Any) -> Any:
    """Check one raw value of config key ``key`` and convert it to the field's type.

    The same rules as :func:`parse_mel_config` (``"none"`` -> None for ``norm``;
    a ConfigError names key and value); used to read other tools' configs too.
    """
    if key not in _FIELD_TYPES:
        raise ConfigError(f"unknown mel config key '{key}' (value {value!r})")
    value = _coerce(key, value)
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError.bad_value(key, value, f"one of {list(_CHOICES[key])}")
    return value


def _coerce(key: str, value: Any) -> Any:
    """Check the type of one raw value and convert it to the field's type."""
    kind = _FIELD_TYPES[key]
    if key == "norm" and isinstance(value, str) and value.lower() == "none":
        return None
    if key == "labels":
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError.bad_value(key, value, "a table of label name -> integer id")
        return tuple(value.items())
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError.bad_value(key, value, f"a value of type {kind}")
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError.bad_value(key, value, "an integer")
        return int(value)
    if kind.startswith("float"):
        if not _is_number(value):
            raise ConfigError.bad_value(key, value, "a number")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError.bad_value(key, value, "true or false")
        return value
    if not isinstance(value, str):
        raise ConfigError.bad_value(key, value, f"a string, one of {list(_CHOICES.get(key, ()))}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(cfg: MelConfig, *keys: str) -> None:
    for key in keys:
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError.bad_value(key, value, "a positive integer")


def _positive_number(cfg: MelConfig, *keys: str) -> None:
    for key in keys:
        value = getattr(cfg, key)
        if not _is_number(value) or value <= 0:
            raise ConfigError.bad_value(key, value, "a positive finite number")


def _check_labels(labels: Any) -> tuple[tuple[str, int], ...]:
    """Validate a label mapping: string names, distinct int16-range non-negative ids."""
    pairs = tuple(labels.items()) if isinstance(labels, Mapping) else tuple(labels)
    if not pairs:
        raise ConfigError.bad_value("labels", {}, "a non-empty table of label name -> id")
    seen: set[int] = set()
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ConfigError.bad_value("labels", labels, "a table of label name -> integer id")
        name, idx = pair
        if not isinstance(name, str) or not name:
            raise ConfigError.bad_value("labels", name, "label names must be non-empty strings")
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 2**15:
            raise ConfigError.bad_value(f"labels.{name}", idx, "an integer id in [0, 32767]")
        if idx in seen:
            raise ConfigError.bad_value(f"labels.{name}", idx, "ids must be distinct")
        seen.add(idx)
    return tuple(sorted(pairs))
