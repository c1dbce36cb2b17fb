"""Filterbank, log-mel and resampling against independent references (librosa, scipy).

librosa (and scipy, which it depends on) are test-only references; pygame is
test-only too and provides real recorded audio (its example sounds).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from cachebuild.mel.config import MelConfig
from cachebuild.mel.filterbank import (
    empty_filters,
    hz_to_mel,
    mel_filterbank,
    mel_frequencies,
    mel_to_hz,
)
from cachebuild.mel.segment import segment, segment_clip
from cachebuild.mel.spectrogram import LogMel, hann_window, log_mel
from cachebuild.mel.wav import read_wav, resample, resampled_length

librosa = pytest.importorskip("librosa")


# ----------------------------------------------------------------- filterbank
@pytest.mark.parametrize("sr", [4096, 16000, 22050, 22051])
@pytest.mark.parametrize("n_fft,n_mels", [(512, 64), (2048, 128), (511, 40), (256, 20)])
@pytest.mark.parametrize("htk", [False, True])
@pytest.mark.parametrize("norm", ["slaney", None])
def test_filterbank_equals_librosa(sr, n_fft, n_mels, htk, norm):
    for fmin, fmax in [(0.0, None), (30.5, None), (125.0, sr / 2 - 250.0)]:
        ours = mel_filterbank(sr, n_fft, n_mels, fmin, fmax, htk=htk, norm=norm)
        ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=htk, norm=norm, dtype=np.float64)
        assert ours.dtype == np.float64 and ours.shape == (n_mels, 1 + n_fft // 2)
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("htk", [False, True])
def test_mel_scale_matches_librosa_and_inverts(htk):
    f = np.concatenate([np.linspace(0, 999.9, 50), [1000.0], np.geomspace(1000.1, 24000, 50)])
    np.testing.assert_allclose(hz_to_mel(f, htk=htk), librosa.hz_to_mel(f, htk=htk), atol=1e-10)
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(f, htk=htk), htk=htk), f, rtol=1e-12)
    np.testing.assert_allclose(mel_frequencies(66, 20.0, 2048.0, htk=htk), librosa.mel_frequencies(66, fmin=20.0, fmax=2048.0, htk=htk), atol=1e-10)
    assert float(hz_to_mel(440.0, htk=htk)) == pytest.approx(float(librosa.hz_to_mel(440.0, htk=htk)))


def test_empty_filters_reported():
    assert empty_filters(mel_filterbank(4096, 512, 64)).size == 0
    assert empty_filters(mel_filterbank(4096, 64, 64)).size > 0  # far more bands than bins


def test_hann_is_periodic_like_scipy():
    scipy_signal = pytest.importorskip("scipy.signal")
    np.testing.assert_allclose(hann_window(512), scipy_signal.get_window("hann", 512), atol=1e-15)


# ----------------------------------------------------------------- log-mel
def _librosa_log_mel(x: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """Reference: librosa on every short window (leading axes are librosa 'channels')."""
    spec = librosa.feature.melspectrogram(
        y=x,
        sr=cfg.sample_rate,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop,
        window="hann",
        center=cfg.center,
        pad_mode=cfg.pad_mode,
        power=cfg.power,
        n_mels=cfg.n_mels,
        fmin=cfg.fmin,
        fmax=cfg.fmax_hz,
        htk=cfg.mel_scale == "htk",
        norm=cfg.norm,
    )
    if cfg.log == "none":
        return spec
    to_db = librosa.power_to_db if cfg.power == 2.0 else librosa.amplitude_to_db
    if cfg.top_db is None:
        return to_db(spec, ref=1.0, amin=cfg.log_floor, top_db=None)
    flat = spec.reshape(-1, *spec.shape[-2:])  # librosa's top_db is relative to the whole input
    return np.stack([to_db(s, ref=1.0, amin=cfg.log_floor, top_db=cfg.top_db) for s in flat]).reshape(spec.shape)


@pytest.fixture(scope="module")
def real_audio() -> list[tuple[str, np.ndarray, int]]:
    """Recorded sounds shipped with pygame (8-bit PCM, 11025 Hz)."""
    pygame = pytest.importorskip("pygame")
    folder = os.path.join(os.path.dirname(pygame.__file__), "examples", "data")
    out = []
    for name in ("house_lo.wav", "boom.wav", "whiff.wav", "car_door.wav", "punch.wav"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            wave, rate = read_wav(path)
            out.append((name, wave, rate))
    if not out:
        pytest.skip("pygame example sounds not found")
    return out


def _windows(wave: np.ndarray, short: int) -> np.ndarray:
    n = wave.size // short
    return wave[: n * short].reshape(n, short)


def test_user_config_log_mel_matches_librosa_on_real_audio(real_audio):
    """Default (user) config: resample the recordings to 4096 Hz, cut, compare per window."""
    cfg = MelConfig(short_clip="pad")
    checked = 0
    for _, wave, rate in real_audio:
        clip = segment_clip(resample(wave, rate, cfg.sample_rate), cfg)  # [40, 2, 512]
        ours = log_mel(clip, cfg)
        ref = _librosa_log_mel(clip, cfg)
        assert ours.shape == ref.shape == (40, 2, 64, 1) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-3)
        # the stored float16 values are librosa's, rounded to float16 (at most one ulp apart)
        diff = np.abs(ours.astype(np.float16).astype(np.float32) - ref.astype(np.float16).astype(np.float32))
        assert np.all(diff <= np.spacing(np.abs(ref).astype(np.float16)).astype(np.float32))
        checked += int(np.sum(ref > -150))
    assert checked > 1000  # real signal, not just floors


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mel_scale": "htk", "norm": None, "fmin": 40.0, "fmax": 5000.0},
        {"power": 2.0, "n_mels": 40},
        {"center": True, "top_db": 60.0},
        {"center": True, "pad_mode": "constant", "mel_scale": "slaney", "norm": "slaney"},
        {"n_fft": 256, "hop": 64, "short_window": 1024, "long_window": 2048},
        {"log": "none"},
    ],
)
def test_log_mel_matches_librosa_native_rate(real_audio, kwargs):
    """Other settings, at the recordings' own rate (11025 Hz, an odd rate)."""
    _, wave, rate = real_audio[0]
    cfg = MelConfig(sample_rate=rate, **kwargs)
    x = _windows(wave, cfg.short_window)
    ours = log_mel(x, cfg)
    ref = _librosa_log_mel(x, cfg)
    assert ours.shape == ref.shape == (x.shape[0], cfg.n_mels, cfg.frames_per_short())
    if cfg.log == "none":
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6 * float(ref.max()))
    else:
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-3)


def test_log_mel_is_block_independent():
    """A window's bytes do not depend on the block it is computed in (BLAS shape fixed)."""
    cfg = MelConfig()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((9000, 512)) * 0.1).astype(np.float32)
    whole = LogMel(cfg)(x)  # default chunking: 1024 frames per BLAS call
    for start, stop in [(0, 1), (1, 2), (3, 83), (1000, 3100), (8999, 9000), (17, 9000)]:
        part = LogMel(cfg)(x[start:stop])
        assert part.tobytes() == whole[start:stop].tobytes(), (start, stop)


def test_log_mel_shapes_and_errors():
    cfg = MelConfig()
    x = np.zeros((2, 40, 2, 512), dtype=np.float32)
    out = log_mel(x, cfg)
    assert out.shape == (2, 40, 2, 64, 1)
    np.testing.assert_allclose(out, 20 * np.log10(cfg.log_floor), atol=1e-4)  # silence -> floor
    with pytest.raises(ValueError, match="short_window"):
        log_mel(np.zeros((3, 500), dtype=np.float32), cfg)
    assert log_mel(np.zeros((0, 512), dtype=np.float32), cfg).shape == (0, 64, 1)


def test_segment_is_a_reshape_in_order():
    cfg = MelConfig()
    waves = np.arange(3 * 41000, dtype=np.float32).reshape(3, 41000)
    seg = segment(waves, cfg)
    assert seg.shape == (3, 40, 2, 512)
    f, l, s = 2, 17, 1
    start = l * cfg.long_window + s * cfg.short_window
    np.testing.assert_array_equal(seg[f, l, s], waves[f, start : start + 512])
    with pytest.raises(ValueError, match="samples"):
        segment(waves[:, :1000], cfg)
    with pytest.raises(ValueError, match="short_clip"):
        segment_clip(np.zeros(100, np.float32), cfg)
    padded = segment_clip(np.ones(1000, np.float32), MelConfig(short_clip="pad"))
    assert padded.shape == (40, 2, 512) and padded.sum() == 1000


# ----------------------------------------------------------------- resampling
@pytest.mark.parametrize("n,sr_in,sr_out", [(11025, 11025, 4096), (8192, 8192, 4096), (4001, 4000, 4096), (1000, 3000, 4096), (1001, 44100, 4096)])
def test_resample_equals_scipy(n, sr_in, sr_out):
    scipy_signal = pytest.importorskip("scipy.signal")
    x = np.random.default_rng(n).standard_normal((2, n))
    num = resampled_length(n, sr_in, sr_out)
    ours = resample(x, sr_in, sr_out)
    assert ours.shape == (2, num) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, scipy_signal.resample(x, num, axis=-1), atol=1e-5)


def test_resample_keeps_a_tone():
    sr_in, sr_out, f0 = 11025, 4096, 300.0
    t_in = np.arange(sr_in) / sr_in
    y = resample(np.sin(2 * np.pi * f0 * t_in), sr_in, sr_out)
    t_out = np.arange(y.size) / sr_out
    np.testing.assert_allclose(y, np.sin(2 * np.pi * f0 * t_out), atol=2e-3)
