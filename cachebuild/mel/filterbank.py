"""Mel filterbank in plain NumPy, equal to ``librosa.filters.mel`` (float64).

Why our own: the builder must not depend on librosa (and its numba/soundfile
stack) at run time, yet the cache must be interchangeable with features made by
librosa. The formulas below are the published Slaney (Auditory Toolbox) and HTK
mel scales, evaluated in the same order of floating-point operations as
librosa 0.10/0.11, so the two agree to ~1e-15 (the tests demand 1e-10).

The filters are triangles whose corners are ``n_mels + 2`` frequencies equally
spaced on the mel scale between ``fmin`` and ``fmax``, evaluated at the FFT bin
centre frequencies ``k * sr / n_fft``. With ``norm="slaney"`` each triangle is
scaled by ``2 / (upper corner - lower corner)`` in Hz (constant energy per band);
with ``norm=None`` its peak is 1.

torchaudio's ``melscale_fbanks`` (what ``MelSpectrogram`` uses; HTK scale and
``norm=None`` by default) builds the same triangles from the same formulas, on
bins ``linspace(0, sr // 2, n_bins)``, which equal ``k * sr / n_fft`` for an even
sample rate and an even ``n_fft`` (the users' 4096 Hz, 512); it does so in float32.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "hz_to_mel",
    "mel_to_hz",
    "mel_frequencies",
    "fft_frequencies",
    "mel_filterbank",
    "empty_filters",
]

# Slaney scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above
# (a factor 6.4 every 27 mels).
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hz_to_mel(frequencies: ArrayLike, htk: bool = False) -> np.ndarray:
    """Frequencies in Hz -> mels (Slaney's scale, or HTK's ``2595 log10(1 + f/700)``)."""
    f = np.asarray(frequencies, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + f / 700.0)
    mels = f / _F_SP
    log_region = f >= _MIN_LOG_HZ
    safe = np.where(log_region, f, _MIN_LOG_HZ)  # avoid log of values not used
    return np.where(log_region, _MIN_LOG_MEL + np.log(safe / _MIN_LOG_HZ) / _LOGSTEP, mels)


def mel_to_hz(mels: ArrayLike, htk: bool = False) -> np.ndarray:
    """Mels -> frequencies in Hz (inverse of :func:`hz_to_mel`)."""
    m = np.asarray(mels, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    freqs = _F_SP * m
    log_region = m >= _MIN_LOG_MEL
    return np.where(log_region, _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL)), freqs)


def mel_frequencies(n: int, fmin: float, fmax: float, htk: bool = False) -> np.ndarray:
    """``n`` frequencies (Hz) equally spaced on the mel scale from ``fmin`` to ``fmax``."""
    lo = hz_to_mel(fmin, htk=htk)
    hi = hz_to_mel(fmax, htk=htk)
    return mel_to_hz(np.linspace(lo, hi, n), htk=htk)


def fft_frequencies(sr: float, n_fft: int) -> np.ndarray:
    """Centre frequency (Hz) of each of the ``1 + n_fft // 2`` bins of a real FFT."""
    return np.fft.rfftfreq(n=n_fft, d=1.0 / sr)


def mel_filterbank(
    sr: float,
    n_fft: int,
    n_mels: int = 64,
    fmin: float = 0.0,
    fmax: float | None = None,
    htk: bool = False,
    norm: str | None = "slaney",
) -> np.ndarray:
    """Triangular mel filterbank, float64 ``[n_mels, 1 + n_fft // 2]``.

    ``fmax=None`` means ``sr / 2``; ``htk`` picks the HTK mel scale instead of
    Slaney's; ``norm`` is ``"slaney"`` (area normalisation) or ``None``.
    Same result as ``librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels,
    fmin=fmin, fmax=fmax, htk=htk, norm=norm, dtype=np.float64)``. Unlike
    librosa it does not warn about empty filters (too many bands for the FFT
    resolution); :func:`empty_filters` reports them.
    """
    if norm not in ("slaney", None):
        raise ValueError(f"norm must be 'slaney' or None, got {norm!r}")
    if fmax is None:
        fmax = float(sr) / 2
    fftfreqs = fft_frequencies(sr, n_fft)
    corners = mel_frequencies(int(n_mels) + 2, fmin=fmin, fmax=fmax, htk=htk)
    fdiff = np.diff(corners)
    ramps = np.subtract.outer(corners, fftfreqs)  # [n_mels + 2, n_bins]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    if norm == "slaney":
        enorm = 2.0 / (corners[2:] - corners[:-2])
        weights *= enorm[:, None]
    return weights


def empty_filters(weights: np.ndarray) -> np.ndarray:
    """Indices of filterbank rows that are all zero (bands narrower than one FFT bin)."""
    return np.flatnonzero(weights.max(axis=1) <= 0)
