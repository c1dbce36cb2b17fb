"""Vectorised log-mel spectrogram of a block of short windows.

``log_mel(segments, cfg)`` maps float audio ``[..., short_window]`` to float32
``[..., n_mels, t]`` in one call for a whole block of files, the same numbers as
calling, for every short window ``x`` separately::

    S = librosa.feature.melspectrogram(y=x, sr=sr, n_fft=n_fft, hop_length=hop,
                                       window="hann", center=center, pad_mode="constant",
                                       power=power, n_mels=n_mels, fmin=fmin, fmax=fmax,
                                       htk=(mel_scale == "htk"), norm=norm)
    librosa.amplitude_to_db(S, ref=1.0, amin=log_floor, top_db=top_db)   # power == 1
    librosa.power_to_db(S, ref=1.0, amin=log_floor, top_db=top_db)       # any other power

i.e. ``20 * log10(max(S, log_floor))`` for magnitudes and ``10 * log10(max(S,
log_floor))`` otherwise, reference 1.0 (0 dB = a full-scale value of 1), and
``top_db`` (if set) clamps each short window's image at its own maximum minus
``top_db``. ``log="none"`` returns the linear mel values. Agreement with librosa
is to float32 rounding (see tests/test_mel_filterbank.py).

How (and why this way):

* frames are a strided view (``sliding_window_view``), no copy;
* the periodic Hann window (``0.5 - 0.5 cos(2 pi n / N)``, scipy's ``fftbins=True``
  as librosa uses) and the real FFT run in float64: NumPy's float64 FFT is ~6x
  faster than its float32 one and also closer to librosa, which FFTs in float64;
* magnitudes are cast to float32 and projected on the filterbank with one BLAS
  matmul per chunk of rows;
* rows are processed in chunks of a *fixed* number of frames (the last chunk is
  zero-padded), so every BLAS call has the same shape. BLAS picks different
  kernels for different shapes (e.g. GEMV for one row) whose rounding differs;
  with a fixed shape, a file's mel bytes do not depend on which other files
  share its block, which keeps shards byte-identical however the work is split.
  The FFT (NumPy's pocketfft, row by row) and the elementwise steps are already
  independent of the block.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cachebuild.mel.config import MelConfig
from cachebuild.mel.filterbank import mel_filterbank

__all__ = ["LogMel", "log_mel", "hann_window", "to_db"]

#: Frames per BLAS call. Fixed so results do not depend on block size (see module doc).
CHUNK_FRAMES = 1024


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window of length ``n`` (float64), as ``scipy.signal.get_window('hann', n)``."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def to_db(values: np.ndarray, cfg: MelConfig, out: np.ndarray | None = None) -> np.ndarray:
    """Apply the configured log to mel values ``[..., n_mels, t]`` (float32, in place if ``out``).

    Power 1 uses ``amplitude_to_db`` (20 log10), any other power ``power_to_db``
    (10 log10); floor ``cfg.log_floor``, reference 1.0; ``top_db`` per image
    (last two axes).
    """
    if out is None:
        out = np.array(values, dtype=np.float32, copy=True)
    elif out is not values:
        out[...] = values
    if cfg.log == "none":
        return out
    factor = np.float32(20.0 if cfg.power == 1.0 else 10.0)
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
            cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax_hz,
            htk=cfg.mel_scale == "htk", norm=cfg.norm,
        )
        self.filterbank_t = np.ascontiguousarray(fb.T, dtype=np.float32)  # [n_bins, n_mels]
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
            raise ValueError(
                f"segments must end with an axis of short_window={cfg.short_window} samples, "
                f"got shape {segments.shape}"
            )
        lead = segments.shape[:-1]
        flat = segments.reshape(-1, cfg.short_window)
        out = np.empty((flat.shape[0], cfg.n_mels, self.t), dtype=np.float32)
        step = self.windows_per_chunk
        mag = np.zeros((step * self.t, self.n_bins), dtype=np.float32)  # scratch, per call
        for start in range(0, flat.shape[0], step):
            view = out[start : start + step]
            self._chunk(flat[start : start + step], view, mag)
            if log:
                to_db(view, cfg, out=view)
        return out.reshape(*lead, cfg.n_mels, self.t)

    def _chunk(self, x: np.ndarray, out: np.ndarray, mag: np.ndarray) -> None:
        """Mel of ``k <= windows_per_chunk`` short windows into ``out`` [k, n_mels, t].

        ``mag`` is the fixed-shape float32 scratch ``[windows_per_chunk * t, n_bins]``.
        """
        cfg = self.cfg
        k = x.shape[0]
        if cfg.center:  # librosa >= 0.10 default pad_mode="constant": zeros
            pad = cfg.n_fft // 2
            x = np.pad(x, ((0, 0), (pad, pad)))
        frames = sliding_window_view(x, cfg.n_fft, axis=-1)[:, :: cfg.hop][:, : self.t]
        spec = np.fft.rfft(frames * self.window, axis=-1)  # float64 -> complex128 [k, t, bins]
        rows = k * self.t
        np.abs(spec.reshape(rows, self.n_bins), out=mag[:rows], casting="same_kind")
        if rows < mag.shape[0]:
            mag[rows:] = 0.0  # fixed GEMM shape: pad the last chunk
        if cfg.power == 2.0:
            np.square(mag[:rows], out=mag[:rows])
        elif cfg.power != 1.0:
            np.power(mag[:rows], np.float32(cfg.power), out=mag[:rows])
        mel = mag @ self.filterbank_t  # [rows_fixed, n_mels]
        out[...] = mel[:rows].reshape(k, self.t, cfg.n_mels).transpose(0, 2, 1)


@functools.lru_cache(maxsize=8)
def _operator(cfg: MelConfig) -> LogMel:
    return LogMel(cfg)


def log_mel(segments: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """Log-mel of a block: float ``[..., short_window]`` -> float32 ``[..., n_mels, t]``.

    Uses a cached :class:`LogMel` per config.
    """
    return _operator(cfg)(segments)
