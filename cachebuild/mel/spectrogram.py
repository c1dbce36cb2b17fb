"""Vectorised log-mel spectrogram of a block of short windows.

``log_mel(segments, cfg)`` maps float audio ``[..., short_window]`` to float32
``[..., n_mels, t]`` in one call for a whole block of files. With the default
config it is the users' builder, for every short window ``x``::

    m = torchaudio.transforms.MelSpectrogram(sample_rate=4096, n_fft=512, hop_length=128,
                                             n_mels=64, power=1.0, center=False)(x)
    20 * torch.log10(torch.clamp(m, min=1e-10))

torchaudio's definition, which this module follows for any config:

* framing: ``center=False`` takes no padding, frame ``j`` is ``x[j*hop : j*hop + n_fft]``,
  ``t = 1 + (len - n_fft) // hop``; ``center=True`` first pads ``n_fft // 2``
  samples each side (``pad_mode``: ``"reflect"`` as torchaudio, or ``"constant"``
  zeros as librosa >= 0.10);
* window: periodic Hann of ``n_fft`` samples (``0.5 - 0.5 cos(2 pi n / N)``,
  ``torch.hann_window(N, periodic=True)``, scipy's ``get_window('hann', N)``),
  no normalisation of the FFT;
* ``|rfft|`` raised to ``power`` (1: magnitude, 2: power);
* the mel filterbank of :mod:`cachebuild.mel.filterbank` (HTK or Slaney scale,
  ``norm`` None or Slaney), applied as ``fb @ spec``;
* the log: ``mult * log10(max(S, log_floor))`` with ``mult = 10`` for power 2 and
  20 otherwise (the users' ``db_mult``; librosa's ``power_to_db`` /
  ``amplitude_to_db`` for powers 2 / 1), reference 1.0, and ``top_db`` (if set)
  clamping each short window's image at its own maximum minus ``top_db``.
  ``log="none"`` returns the linear mel values.

Agreement with librosa (same parameters, ``htk``/``norm`` as configured) and with a
direct implementation of torchaudio's definition is to float32 rounding (see
tests/test_mel_filterbank.py and tests/test_mel_users.py).

How (and why this way):

* frames are a strided view (``sliding_window_view``), no copy;
* the periodic Hann window and the real FFT run in float64: NumPy's float64 FFT
  is ~6x faster than its float32 one and closer to the references;
* magnitudes are ``sqrt(re * re + im * im)`` (``re * re + im * im`` for power 2)
  and the filterbank is applied as a few "taps": each triangle covers at most
  ``W`` consecutive bins (14 with the defaults), so band ``m`` is
  ``sum_j spec[:, start_m + j] * weight[j, m]`` for ``j < W``, accumulated in
  float64 with one elementwise multiply and add per tap, then rounded to float32.
  Every step is an elementwise, correctly rounded IEEE operation on one row at a
  time, so a window's bytes do not depend on which other windows share its call,
  where it sits in the block, or how SIMD lanes fall. A BLAS matmul does not give
  that: OpenBLAS rounds a row differently depending on its position in the
  matrix (measured: 5-6% of values differ by an ulp), which broke byte-identical
  shards once the values moved to where float32 keeps those ulps (HTK, no norm);
* rows are processed in chunks of ``CHUNK_FRAMES`` frames to bound memory.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cachebuild.mel.config import MelConfig
from cachebuild.mel.filterbank import mel_filterbank

__all__ = ["LogMel", "log_mel", "hann_window", "to_db", "filterbank_taps"]

#: Frames per chunk (bounds the float64 scratch; results do not depend on it).
CHUNK_FRAMES = 1024


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window of length ``n`` (float64), as ``scipy.signal.get_window('hann', n)``."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def to_db(values: np.ndarray, cfg: MelConfig, out: np.ndarray | None = None) -> np.ndarray:
    """Apply the configured log to mel values ``[..., n_mels, t]`` (float32, in place if ``out``).

    Power 2 gives ``10 log10`` (``power_to_db``), any other power ``20 log10``
    (``amplitude_to_db`` for power 1), as the users' builder; floor
    ``cfg.log_floor``, reference 1.0; ``top_db`` per image (last two axes).
    """
    if out is None:
        out = np.array(values, dtype=np.float32, copy=True)
    elif out is not values:
        out[...] = values
    if cfg.log == "none":
        return out
    factor = np.float32(10.0 if cfg.power == 2.0 else 20.0)
    np.maximum(out, np.float32(cfg.log_floor), out=out)
    np.log10(out, out=out)
    out *= factor
    if cfg.top_db is not None and out.size:
        peak = out.max(axis=(-2, -1), keepdims=True)
        np.maximum(out, peak - np.float32(cfg.top_db), out=out)
    return out


class LogMel:
    """The log-mel operator of one :class:`MelConfig`: filterbank and window precomputed.

    Call it on a float array ``[..., short_window]``; get float32 ``[..., n_mels, t]``.
    Immutable after construction, so one instance may be shared by threads.
    """

    def __init__(self, cfg: MelConfig, chunk_frames: int = CHUNK_FRAMES) -> None:
        self.cfg = cfg
        self.t = cfg.frames_per_short()
        self.n_bins = 1 + cfg.n_fft // 2
        fb = mel_filterbank(
            cfg.sample_rate,
            cfg.n_fft,
            cfg.n_mels,
            cfg.fmin,
            cfg.fmax_hz,
            htk=cfg.mel_scale == "htk",
            norm=cfg.norm,
        )
        self.filterbank_t = np.ascontiguousarray(fb.T, dtype=np.float32)  # [n_bins, n_mels]
        self.tap_bins, self.tap_weights = filterbank_taps(fb)
        self.window = hann_window(cfg.n_fft)
        # whole short windows per chunk, so a chunk never splits one window's frames
        self.windows_per_chunk = max(1, chunk_frames // self.t)

    def __call__(self, segments: np.ndarray) -> np.ndarray:
        """Log-mel (per the config's ``log``) of every short window in ``segments``."""
        return self.mel(segments, log=True)

    def mel(self, segments: np.ndarray, log: bool = False) -> np.ndarray:
        """Linear mel (``log=False``) or log-mel of ``segments`` ``[..., short_window]``."""
        cfg = self.cfg
        segments = np.asarray(segments)
        if segments.ndim < 1 or segments.shape[-1] != cfg.short_window:
            raise ValueError(f"segments must end with an axis of short_window={cfg.short_window} samples, got shape {segments.shape}")
        lead = segments.shape[:-1]
        flat = segments.reshape(-1, cfg.short_window)
        out = np.empty((flat.shape[0], cfg.n_mels, self.t), dtype=np.float32)
        step = self.windows_per_chunk
        for start in range(0, flat.shape[0], step):
            view = out[start : start + step]
            self._chunk(flat[start : start + step], view)
            if log:
                to_db(view, cfg, out=view)
        return out.reshape(*lead, cfg.n_mels, self.t)

    def _chunk(self, x: np.ndarray, out: np.ndarray) -> None:
        """Mel of ``k <= windows_per_chunk`` short windows into ``out`` [k, n_mels, t]."""
        cfg = self.cfg
        k = x.shape[0]
        if cfg.center:  # torchaudio: reflect; librosa >= 0.10: constant (zeros)
            pad = cfg.n_fft // 2
            x = np.pad(x, ((0, 0), (pad, pad)), mode=cfg.pad_mode)  # type: ignore[call-overload]  # pad_mode: "reflect" or "constant", checked by MelConfig
        frames = sliding_window_view(x, cfg.n_fft, axis=-1)[:, :: cfg.hop][:, : self.t]
        spec = np.fft.rfft(frames * self.window, axis=-1)  # float64 -> complex128 [k, t, bins]
        spec = spec.reshape(k * self.t, self.n_bins)
        mag = spec.real * spec.real
        mag += spec.imag * spec.imag  # |X|^2, exact elementwise IEEE operations
        if cfg.power != 2.0:
            np.sqrt(mag, out=mag)
            if cfg.power != 1.0:
                np.power(mag, cfg.power, out=mag)
        mel = mag[:, self.tap_bins[0]] * self.tap_weights[0]
        for bins, weights in zip(self.tap_bins[1:], self.tap_weights[1:]):
            mel += mag[:, bins] * weights
        out[...] = mel.reshape(k, self.t, cfg.n_mels).transpose(0, 2, 1)


def filterbank_taps(fb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A filterbank ``[n_mels, n_bins]`` as taps: ``bins`` and ``weights``, both ``[W, n_mels]``.

    Row ``j`` holds, for every band, the bin ``start + j`` (its first non-zero bin
    plus ``j``) and that bin's weight, or weight 0 past the band's last non-zero
    bin. ``sum_j x[:, bins[j]] * weights[j]`` equals ``x @ fb.T``. An empty band
    has one zero tap.
    """
    nonzero = fb != 0
    n_mels, n_bins = fb.shape
    any_nz = nonzero.any(axis=1)
    first = np.where(any_nz, nonzero.argmax(axis=1), 0)
    last = np.where(any_nz, n_bins - 1 - nonzero[:, ::-1].argmax(axis=1), 0)
    width = np.where(any_nz, last - first + 1, 1)
    j = np.arange(int(width.max()))[:, None]
    bins = np.minimum(first[None, :] + j, n_bins - 1)
    weights = np.where(j < width[None, :], fb[np.arange(n_mels)[None, :], bins], 0.0)
    return np.ascontiguousarray(bins), np.ascontiguousarray(weights)


@functools.lru_cache(maxsize=8)
def _operator(cfg: MelConfig) -> LogMel:
    return LogMel(cfg)


def log_mel(segments: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """Log-mel of a block: float ``[..., short_window]`` -> float32 ``[..., n_mels, t]``.

    Uses a cached :class:`LogMel` per config.
    """
    return _operator(cfg)(segments)
