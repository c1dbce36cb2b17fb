"""Mel defaults equal the users' builder (torchaudio), and the --from-h5 config rules.

The users' builder computes, per short window of 512 samples at 4096 Hz::

    torchaudio.transforms.MelSpectrogram(sample_rate=4096, n_fft=512, hop_length=128,
                                         n_mels=64, power=1.0, center=False)
    then 20 * log10(clamp(x, 1e-10)), stored as float16.

``_torchaudio_reference`` below is a test-only, independent implementation of
torchaudio's definition (explicit DFT matrix instead of an FFT, its own HTK
filterbank formulas, the sin^2 form of the periodic Hann window, explicit frame
indices). librosa (``htk=True, norm=None``) is the second reference.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cachebuild.cli import main
from cachebuild.errors import SourceError
from cachebuild.format import read_manifest
from cachebuild.format import open_cache, read_record
from cachebuild.mel import H5Source, MelConfig, log_mel, parse_mel_config
from cachebuild.mel.h5 import StoredMelWarning
from cachebuild.mel.filterbank import mel_filterbank
from cachebuild.mel.spectrogram import LogMel, filterbank_taps

F = 6  # files in the test HDF5s


# ----------------------------------------------------------------- references (test-only)
def _htk_filterbank(sr: int, n_fft: int, n_mels: int, f_min: float, f_max: float) -> np.ndarray:
    """torchaudio's melscale_fbanks(norm=None, mel_scale='htk'), float64 [n_freqs, n_mels]."""
    n_freqs = n_fft // 2 + 1
    bins_hz = np.linspace(0.0, sr // 2, n_freqs)
    m_lo, m_hi = (2595.0 * np.log10(1.0 + f / 700.0) for f in (f_min, f_max))
    corners = 700.0 * (10.0 ** (np.linspace(m_lo, m_hi, n_mels + 2) / 2595.0) - 1.0)
    fb = np.zeros((n_freqs, n_mels))
    for m in range(n_mels):  # readable, not fast: one triangle at a time
        lo, mid, hi = corners[m], corners[m + 1], corners[m + 2]
        rising = (bins_hz - lo) / (mid - lo)
        falling = (hi - bins_hz) / (hi - mid)
        fb[:, m] = np.clip(np.minimum(rising, falling), 0.0, None)
    return fb


def _torchaudio_reference(x: np.ndarray, sr: int = 4096, n_fft: int = 512, hop: int = 128, n_mels: int = 64, power: float = 1.0, center: bool = False, pad_mode: str = "reflect") -> np.ndarray:
    """MelSpectrogram(...) then 20*log10(clamp(., 1e-10)) (10*log10 for power 2), float64."""
    x = np.asarray(x, dtype=np.float64)
    if center:
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(n_fft // 2, n_fft // 2)], mode=pad_mode)
    n_frames = 1 + (x.shape[-1] - n_fft) // hop
    starts = hop * np.arange(n_frames)
    frames = x[..., starts[:, None] + np.arange(n_fft)[None, :]]  # [..., t, n_fft]
    window = np.sin(np.pi * np.arange(n_fft) / n_fft) ** 2  # periodic Hann
    k = np.arange(n_fft // 2 + 1)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(n_fft), k) / n_fft)  # [n_fft, n_freqs]
    spec = np.abs((frames * window) @ dft) ** power  # [..., t, n_freqs]
    mel = spec @ _htk_filterbank(sr, n_fft, n_mels, 0.0, float(sr // 2))  # [..., t, n_mels]
    mult = 10.0 if power == 2.0 else 20.0
    return mult * np.log10(np.maximum(np.swapaxes(mel, -1, -2), 1e-10))


#: Our spectra are float64, but the input is float32 audio: ~140 dB below a window's peak
#: both sides hold rounding noise, so values further than this below their window's peak
#: (or at the floor) are left out of the comparisons with the float64 reference.
DYNAMIC_RANGE_DB = 120.0
#: torchaudio itself runs a float32 FFT: measured against ours, |diff| <= 0.001 dB within
#: 60 dB of the peak, 0.011 dB at 60-80 dB, 0.13 dB at 80-100 dB (its noise floor).
TORCHAUDIO_RANGE_DB = 70.0


def _meaningful(ref: np.ndarray, range_db: float = DYNAMIC_RANGE_DB) -> np.ndarray:
    peak = ref.max(axis=(-2, -1), keepdims=True)
    keep = (ref > peak - range_db) & (ref > -199.0)
    assert keep.sum() >= 1000, "the signals must exercise real values, not floors"
    return keep


def _assert_within_one_f16_step(ours: np.ndarray, ref: np.ndarray, range_db: float = DYNAMIC_RANGE_DB, atol_db: float = 1e-4) -> None:
    """Stored values (float16) equal the reference's float16 values, or are one step apart."""
    keep = _meaningful(ref, range_db)
    a16, b16 = ours[keep].astype(np.float16), ref[keep].astype(np.float16)
    step = np.maximum(np.spacing(np.abs(a16)), np.spacing(np.abs(b16))).astype(np.float64)
    apart = np.abs(a16.astype(np.float64) - b16.astype(np.float64))
    # near 0 dB a float16 step is finer than float32 rounding of the dB value itself
    ok = (apart <= step) | (np.abs(ours[keep] - ref[keep]) <= atol_db)
    assert ok.all(), f"{int((~ok).sum())} values differ by more than one float16 step"


def _assert_close(ours: np.ndarray, ref: np.ndarray, atol: float = 2e-3, range_db: float = DYNAMIC_RANGE_DB) -> None:
    keep = _meaningful(ref, range_db)
    np.testing.assert_allclose(ours[keep], ref[keep], rtol=0, atol=atol)


def _signals(n: int = 96, length: int = 512) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    t = np.arange(length) / 4096.0
    level = np.exp(rng.uniform(np.log(1e-4), np.log(0.9), (n, 1)))
    noise = rng.standard_normal((n, length)) * level
    f0 = rng.uniform(20.0, 2040.0, (n, 1))
    f0[:8, 0] = [8.0, 62.5, 128.0, 500.0, 1000.0, 1024.0, 2000.0, 2047.0]  # bin centres, edges
    tones = level * np.sin(2 * np.pi * f0 * t + rng.uniform(0, 2 * np.pi, (n, 1)))
    chord = tones + 0.3 * level * np.sin(2 * np.pi * (f0 * 1.5 % 2000 + 30) * t)
    quiet = 1e-6 * np.sin(2 * np.pi * 300.0 * t) + np.zeros((n, 1))
    return {"noise": noise, "tones": tones, "chord": chord + 0.01 * noise, "quiet": quiet}


# ----------------------------------------------------------------- defaults
def test_defaults_are_the_users_torchaudio_call():
    cfg = MelConfig()
    assert (cfg.sample_rate, cfg.n_fft, cfg.hop, cfg.n_mels) == (4096, 512, 128, 64)
    assert (cfg.power, cfg.center, cfg.mel_scale, cfg.norm) == (1.0, False, "htk", None)
    assert (cfg.fmin, cfg.fmax_hz, cfg.log, cfg.log_floor, cfg.top_db) == (0.0, 2048.0, "db", 1e-10, None)
    assert (cfg.dtype, cfg.short_window, cfg.long_window, cfg.num_long) == ("float16", 512, 1024, 40)
    assert cfg.frames_per_short() == 1  # center=False: 1 + (512 - 512) // 128
    # Slaney stays an option
    assert parse_mel_config({"mel_scale": "slaney", "norm": "slaney"}).norm == "slaney"


@pytest.mark.parametrize("kind", ["noise", "tones", "chord", "quiet"])
def test_default_log_mel_equals_torchaudio_definition(kind):
    x = _signals()[kind].astype(np.float32)
    ours = log_mel(x, MelConfig())
    ref = _torchaudio_reference(x)
    assert ours.shape == ref.shape == (x.shape[0], 64, 1)
    _assert_close(ours, ref)
    _assert_within_one_f16_step(ours, ref)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_fft": 256, "hop": 64},  # 5 frames per window: framing
        {"n_fft": 200, "hop": 96},  # hop does not divide: last samples unused
        {"n_fft": 256, "hop": 64, "center": True},  # torchaudio pads by reflection
        {"n_fft": 256, "hop": 100, "center": True, "pad_mode": "constant"},
        {"power": 2.0, "n_mels": 40},
    ],
)
def test_framing_window_and_power_follow_torchaudio(kwargs):
    cfg = MelConfig(**kwargs)
    x = _signals()["chord"].astype(np.float32)
    ours = log_mel(x, cfg)
    ref = _torchaudio_reference(x, n_fft=cfg.n_fft, hop=cfg.hop, n_mels=cfg.n_mels, power=cfg.power, center=cfg.center, pad_mode=cfg.pad_mode)
    want_t = (1 + 512 // cfg.hop) if cfg.center else 1 + (512 - cfg.n_fft) // cfg.hop
    assert ours.shape == ref.shape == (x.shape[0], cfg.n_mels, want_t)
    _assert_close(ours, ref)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"n_fft": 256, "hop": 64},
        {"n_fft": 256, "hop": 64, "center": True},
        {"power": 2.0},
    ],
)
def test_log_mel_equals_real_torchaudio_when_installed(kwargs):
    """The users' call itself (skipped where torchaudio is not installed, as in our venv)."""
    torch = pytest.importorskip("torch")
    torchaudio = pytest.importorskip("torchaudio")
    cfg = MelConfig(**kwargs)
    x = np.concatenate(list(_signals().values())).astype(np.float32)
    transform = torchaudio.transforms.MelSpectrogram(sample_rate=4096, n_fft=cfg.n_fft, hop_length=cfg.hop, n_mels=64, power=cfg.power, center=cfg.center)
    with torch.no_grad():
        m = transform(torch.from_numpy(x)).double()
    ref = ((10.0 if cfg.power == 2.0 else 20.0) * m.clamp(min=1e-10).log10()).numpy()
    ours = log_mel(x, cfg)
    assert ours.shape == ref.shape
    _assert_close(ours, ref, atol=5e-3, range_db=TORCHAUDIO_RANGE_DB)
    # near 0 dB a float16 step (1.2e-4 dB) is finer than torchaudio's float32 filterbank
    # (weights from differences of nearby float32 frequencies): measured 2.3e-4 dB there,
    # where ours equals the float64 reference
    _assert_within_one_f16_step(ours, ref, range_db=TORCHAUDIO_RANGE_DB, atol_db=1e-3)


def test_default_log_mel_equals_librosa_htk_no_norm():
    librosa = pytest.importorskip("librosa")
    x = np.concatenate(list(_signals().values())).astype(np.float32)
    spec = librosa.feature.melspectrogram(y=x, sr=4096, n_fft=512, hop_length=128, window="hann", center=False, power=1.0, n_mels=64, htk=True, norm=None)
    ref = librosa.amplitude_to_db(spec, ref=1.0, amin=1e-10, top_db=None)
    _assert_within_one_f16_step(log_mel(x, MelConfig()), ref)


def test_default_filterbank_equals_librosa_and_torchaudio_formulas():
    librosa = pytest.importorskip("librosa")
    fb = LogMel(MelConfig()).filterbank_t  # [257, 64] float32 as used
    ref = librosa.filters.mel(sr=4096, n_fft=512, n_mels=64, fmin=0.0, fmax=2048.0, htk=True, norm=None, dtype=np.float64)
    np.testing.assert_allclose(fb, ref.T, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ref.T, _htk_filterbank(4096, 512, 64, 0.0, 2048.0), rtol=0, atol=1e-12)
    assert float(fb.max()) <= 1.0 and np.all(fb.max(axis=0) > 0.5)  # peak-1 triangles, none empty


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mel_scale": "slaney", "norm": "slaney"},
        {"power": 2.0, "n_mels": 40},
        {"n_fft": 256, "hop": 64, "center": True, "top_db": 80.0},
    ],
)
def test_log_mel_bytes_do_not_depend_on_the_block(kwargs):
    """A window's bytes are the same whatever block it is computed in, at any position."""
    cfg = MelConfig(**kwargs)
    x = np.concatenate(list(_signals(n=300).values())).astype(np.float32)
    whole = LogMel(cfg)(x)
    for start, stop in [(0, 1), (1, 2), (3, 83), (5, 1200), (1199, 1200), (17, 700)]:
        assert LogMel(cfg)(x[start:stop]).tobytes() == whole[start:stop].tobytes(), (start, stop)
    small_chunks = LogMel(cfg, chunk_frames=7)(x[:50])
    assert small_chunks.tobytes() == whole[:50].tobytes()


@pytest.mark.parametrize(
    "sr,n_fft,n_mels,htk,norm",
    [
        (4096, 512, 64, True, None),
        (4096, 512, 64, False, "slaney"),
        (22050, 2048, 128, False, "slaney"),
        (4096, 64, 64, True, None),  # more bands than bins: empty bands
    ],
)
def test_filterbank_taps_equal_the_matrix(sr, n_fft, n_mels, htk, norm):
    fb = mel_filterbank(sr, n_fft, n_mels, htk=htk, norm=norm)
    bins, weights = filterbank_taps(fb)
    x = np.random.default_rng(0).uniform(0, 1, (50, fb.shape[1]))
    tapped = sum(x[:, b] * w for b, w in zip(bins, weights))
    np.testing.assert_allclose(tapped, x @ fb.T, rtol=1e-12, atol=1e-15)
    assert bins.shape[0] == max(1, int((fb != 0).sum(axis=1).max()))


def test_slaney_option_is_the_old_30_db_offset():
    x = _signals()["noise"].astype(np.float32)
    users = log_mel(x, MelConfig())
    slaney = log_mel(x, MelConfig(mel_scale="slaney", norm="slaney"))
    assert float(np.median(slaney - users)) < -20.0  # what the old default got wrong


# ----------------------------------------------------------------- HDF5 files
USERS_CONFIG = {"sample_rate": 4096, "duration_sec": 10, "long_window": 1024, "short_window": 512, "n_mels": 64, "n_fft": 512, "hop_length": 128, "power": 1.0}


def _write_h5(path: Path, config: dict | None, mel_shape_cfg: MelConfig | None = None, mel: bool = True, waveform: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """An HDF5 file in the users' layout; mels made with the torchaudio reference."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(3)
    waves = (rng.standard_normal((F, 40, 2, 512)) * 0.05).astype(np.float32)
    cfg = mel_shape_cfg or MelConfig()
    mels = _torchaudio_reference(waves, n_fft=cfg.n_fft, hop=cfg.hop, n_mels=cfg.n_mels).astype(np.float16)
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.array([0, 1, 1, 0, 1, 0], dtype=np.int16))
        if waveform:
            f.create_dataset("segments_waveform", data=waves)
        if mel:
            f.create_dataset("segments_mel", data=mels)
        if config is not None:
            f.attrs["config_json"] = json.dumps(config)
        f.attrs["cnn_config_json"] = json.dumps({"model_type": "mel"})
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    return waves, mels


def test_users_file_copies_stored_mels_with_their_parameters(tmp_path):
    path = tmp_path / "users.h5"
    waves, mels = _write_h5(path, USERS_CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the users' file agrees with the defaults: no notice
        src = H5Source(path, MelConfig())
    recs = src.records(0, F)
    assert all(r["mel"].tobytes() == mels[i].tobytes() for i, r in enumerate(recs))
    meta = recs[0]["json"]
    assert meta["mel_from"] == "stored" and meta["mel_scale"] == "htk" and meta["norm"] is None
    assert (meta["n_fft"], meta["hop"], meta["power"], meta["center"]) == (512, 128, 1.0, False)
    # what we would compute from the stored waveforms is what they stored
    recomputed = H5Source(path, MelConfig(), datasets={"mel": None}).records(0, F)
    assert recomputed[0]["json"]["mel_from"] == "computed"
    _assert_within_one_f16_step(np.stack([r["mel"] for r in recomputed]), _torchaudio_reference(waves))


def test_copying_never_refuses_on_parameters_that_do_not_matter(tmp_path):
    """The file's mels were made with Slaney, n_fft 256, hop 64: copy them, say so."""
    path = tmp_path / "slaney.h5"
    theirs = MelConfig(n_fft=256, hop=64)
    _, mels = _write_h5(path, {**USERS_CONFIG, "n_fft": 256, "hop_length": 64, "mel_scale": "slaney", "norm": "slaney", "f_min": 0, "f_max": None, "center": False}, theirs)
    with pytest.warns(StoredMelWarning, match="mel_scale: stored 'slaney', config 'htk'"):
        src = H5Source(path, MelConfig(power=2.0))  # our power does not apply either
    meta = src.records(2, 3)[0]["json"]
    assert (meta["mel_scale"], meta["norm"], meta["n_fft"], meta["hop"]) == ("slaney", "slaney", 256, 64)
    assert meta["power"] == 1.0 and meta["fmax"] == 2048.0 and meta["mel_from"] == "stored"
    assert src.cfg.record_shapes()["mel"] == mels.shape[1:] == (40, 2, 64, 5)
    assert src.requested_cfg == MelConfig(power=2.0)


def test_file_silent_on_a_key_takes_the_config_value(tmp_path):
    path = tmp_path / "users.h5"
    _write_h5(path, USERS_CONFIG)  # says nothing about mel_scale / norm (torchaudio defaults)
    meta = H5Source(path, MelConfig(mel_scale="slaney")).records(0, 1)[0]["json"]
    assert meta["mel_scale"] == "slaney"  # the user's statement about the file is all we have


RECOMPUTE_CASES = [  # (config_json key, file value, our key, our value as the message prints it, flag)
    ("mel_scale", "slaney", "mel_scale", "'htk'", "--set mel_scale=slaney"),
    ("htk", False, "mel_scale", "'htk'", "--set mel_scale=slaney"),
    ("norm", "slaney", "norm", "None", "--set norm=slaney"),
    ("power", 2.0, "power", "1.0", "--set power=2.0"),
    ("center", True, "center", "False", "--set center=true"),
    ("n_fft", 256, "n_fft", "512", "--set n_fft=256"),
    ("hop_length", 64, "hop", "128", "--set hop=64"),
    ("n_mels", 32, "n_mels", "64", "--set n_mels=32"),
    ("f_min", 20.0, "fmin", "0.0", "--set fmin=20.0"),
    ("f_max", 1000.0, "fmax", "2048.0", "--set fmax=1000.0"),
    ("sr", 8000, "sample_rate", "4096", "--set sample_rate=8000"),
    ("log", "none", "log", "'db'", "--set log=none"),
]


@pytest.mark.parametrize("file_key,file_value,key,ours,flag", RECOMPUTE_CASES)
def test_recompute_refuses_every_parameter_that_changes_the_numbers(tmp_path, file_key, file_value, key, ours, flag):
    path = tmp_path / "f.h5"
    config = {k: v for k, v in USERS_CONFIG.items() if not (file_key == "sr" and k == "sample_rate")}
    config[file_key] = file_value
    _write_h5(path, config, mel=False)
    with pytest.raises(SourceError) as info:
        H5Source(path, MelConfig())
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    assert f"{file_key}={file_value!r}" in msg and f"config {key}={ours}" in msg and flag in msg
    # the same mismatch with stored mels present is no refusal (they are copied)
    if key not in ("n_fft", "hop", "n_mels", "center"):  # these change the stored shape
        path2 = tmp_path / "g.h5"
        _write_h5(path2, config)
        with pytest.warns(StoredMelWarning, match=key):
            H5Source(path2, MelConfig())


def test_recompute_follows_the_flag(tmp_path):
    path = tmp_path / "f.h5"
    _write_h5(path, {**USERS_CONFIG, "mel_scale": "slaney", "norm": "slaney", "hop_length": 64}, mel=False)
    cfg = parse_mel_config({"mel_scale": "slaney", "norm": "slaney", "hop": 64})
    meta = H5Source(path, cfg).records(0, 1)[0]["json"]
    assert (meta["mel_scale"], meta["norm"], meta["hop"], meta["mel_from"]) == ("slaney", "slaney", 64, "computed")


def test_recompute_flags_for_none_values(tmp_path):
    path = tmp_path / "f.h5"
    _write_h5(path, {**USERS_CONFIG, "f_max": None, "top_db": None}, mel=False)
    with pytest.raises(SourceError, match=r"--set fmax=2048.0 no top_db in the config"):
        H5Source(path, MelConfig(fmax=1000.0, top_db=80.0))
    assert H5Source(path, MelConfig()).mel_from == "computed"  # None = sr/2: agrees


def test_window_settings_we_cannot_reproduce_refuse_only_a_recompute(tmp_path):
    path = tmp_path / "f.h5"
    _write_h5(path, {**USERS_CONFIG, "win_length": 400, "window": "hamming"}, mel=False)
    with pytest.raises(SourceError, match=r"win_length=400.*window='hamming'"):
        H5Source(path, MelConfig())
    path2 = tmp_path / "g.h5"
    _write_h5(path2, {**USERS_CONFIG, "win_length": 400, "window": "hamming"})
    assert H5Source(path2, MelConfig()).mel_from == "stored"


def test_recompute_lists_every_disagreement_in_one_line(tmp_path):
    path = tmp_path / "f.h5"
    _write_h5(path, {**USERS_CONFIG, "norm": "slaney", "power": 2.0}, mel=False)
    with pytest.raises(SourceError, match=r"norm.*power.*--set norm=slaney --set power=2.0"):
        H5Source(path, MelConfig())


@pytest.mark.parametrize(
    "config,match",
    [
        ({**USERS_CONFIG, "n_fft": "big"}, r"n_fft='big'"),
        ({**USERS_CONFIG, "sr": 8000}, r"sample_rate=4096 but sr=8000"),
        ({**USERS_CONFIG, "n_mels": 32}, r"n_mels 64 in the dataset but 32 expected \(config_json has n_mels=32\)"),
        ({**USERS_CONFIG, "mel_scale": "bark"}, r"mel_scale='bark'"),
    ],
)
def test_bad_config_json_names_both_values(tmp_path, config, match):
    path = tmp_path / "bad.h5"
    _write_h5(path, config)
    with pytest.raises(SourceError, match=match) as info:
        H5Source(path, MelConfig())
    assert "\n" not in str(info.value) and "bad.h5" in str(info.value)


def test_stored_shape_against_the_config_names_the_flag(tmp_path):
    path = tmp_path / "noconfig.h5"
    _write_h5(path, None)  # no config_json at all: our config describes the file
    with pytest.raises(SourceError, match=r"n_mels 64 in the dataset but 32 expected.*--set n_mels=64"):
        H5Source(path, MelConfig(n_mels=32))
    assert H5Source(path, MelConfig()).records(0, 1)[0]["json"]["mel_from"] == "stored"


# ----------------------------------------------------------------- CLI
def _read_record(root: Path, i: int = 0) -> dict:
    with open_cache(root) as shards:
        return read_record(shards, i, strict=True)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_cli_refusal_exits_non_zero_and_leaves_the_cache_intact(tmp_path):
    out = tmp_path / "cache"
    r = CliRunner().invoke(main, ["mel", "--synthetic", "4", "--out", str(out), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    before = _snapshot(out)
    bad = tmp_path / "bad.h5"
    _write_h5(bad, {**USERS_CONFIG, "hop_length": 64}, mel=False)
    for extra in ([], ["--overwrite"]):
        r = CliRunner().invoke(main, ["mel", "--from-h5", str(bad), "--out", str(out), "-q", *extra])
        assert r.exit_code == SourceError.exit_code != 0
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert "hop_length=64" in lines[0] and "config hop=128" in lines[0] and "--set hop=64" in lines[0]
    assert _snapshot(out) == before
    r = CliRunner().invoke(main, ["mel", "--from-h5", str(bad), "--out", str(tmp_path / "c2"), "-q", "-j", "1", "--set", "hop=64"])
    assert r.exit_code == 0, r.output
    assert _read_record(tmp_path / "c2")["json"]["hop"] == 64


def test_cli_ignoring_stored_mels_recomputes_and_checks(tmp_path):
    path = tmp_path / "users.h5"
    waves, _ = _write_h5(path, {**USERS_CONFIG, "mel_scale": "slaney"})
    r = CliRunner().invoke(main, ["mel", "--from-h5", str(path), "--out", str(tmp_path / "c"), "-q", "--h5-dataset", "mel="])
    assert r.exit_code != 0 and "mel_scale='slaney'" in r.output and "--set mel_scale=slaney" in r.output
    r = CliRunner().invoke(main, ["mel", "--from-h5", str(path), "--out", str(tmp_path / "c"), "-q", "-j", "1", "--h5-dataset", "mel=", "--set", "mel_scale=slaney"])
    assert r.exit_code == 0, r.output
    rec = _read_record(tmp_path / "c", 2)
    assert rec["json"]["mel_from"] == "computed" and rec["json"]["mel_scale"] == "slaney"
    want = log_mel(waves[2], MelConfig(mel_scale="slaney")).astype(np.float16)
    assert rec["mel"].tobytes() == want.tobytes()


def test_cli_copy_states_the_files_parameters_in_records_and_manifest(tmp_path):
    path = tmp_path / "slaney.h5"
    _, mels = _write_h5(path, {**USERS_CONFIG, "mel_scale": "slaney", "norm": "slaney"})
    out = tmp_path / "cache"
    with pytest.warns(StoredMelWarning):
        from cachebuild.jobs import run_mel_build

        run_mel_build(None, [], {}, out, from_h5=path, workers=1, progress=False)
    rec = _read_record(out, 1)
    assert rec["mel"].tobytes() == mels[1].tobytes()
    assert rec["json"]["mel_scale"] == "slaney" and rec["json"]["norm"] == "slaney"
    mel_cfg = read_manifest(out).config["mel"]
    assert mel_cfg["mel_scale"] == "slaney" and mel_cfg["norm"] == "slaney"
    assert dataclasses.asdict(MelConfig())["mel_scale"] == "htk"  # defaults untouched
