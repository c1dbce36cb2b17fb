"""Mel config, WAV decoding and the three mel record sources (HDF5, WAV folder, synthetic)."""

from __future__ import annotations

import json
import pickle
import struct
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachebuild.errors import ConfigError, SourceError
from cachebuild.mel import (
    MEL_FIELDS,
    BadFileWarning,
    H5Source,
    MelConfig,
    MelSource,
    SyntheticSource,
    WavFolderSource,
    log_mel,
    parse_mel_config,
)
from cachebuild.mel.filterbank import mel_frequencies
from cachebuild.mel.segment import segment
from cachebuild.mel.sources import estimated_record_bytes, record_fields
from cachebuild.mel.wav import decode_samples, read_wav, read_wav_info, resample

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CFG = MelConfig()  # the user's values are the defaults


# ----------------------------------------------------------------- config
def test_defaults_are_the_users_pipeline():
    assert CFG.num_long == 40 and CFG.num_short == 2 and CFG.clip_samples == 40960
    assert CFG.frames_per_short() == 1 and CFG.fmax_hz == 2048.0
    assert CFG.record_shapes() == {"mel": (40, 2, 64, 1), "label": ()}
    assert MelConfig(store_waveform=True).record_shapes()["waveform"] == (40, 2, 512)
    assert record_fields(CFG) == [("mel", "float16"), ("label", "int16"), ("json", "json")]
    assert estimated_record_bytes(CFG) > 40 * 2 * 64 * 2
    assert MEL_FIELDS == {"mel": "float16", "label": "int16", "waveform": "float32"}


def test_toml_config_parses_to_the_users_values():
    with open(ROOT / "configs" / "mel-leak.toml", "rb") as f:
        raw = tomllib.load(f)
    cfg = parse_mel_config(raw)  # kind/seed are the builder's keys and are skipped
    assert cfg == MelConfig(labels=(("LEAK", 0), ("NOLEAK", 1)))
    assert cfg.label2id == {"LEAK": 0, "NOLEAK": 1}
    assert parse_mel_config(cfg.to_dict()) == cfg
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()


@pytest.mark.parametrize(
    "key,value",
    [
        ("sample_rate", 0),
        ("sample_rate", 4096.5),
        ("n_mels", True),
        ("mel_scale", "bark"),
        ("norm", "l2"),
        ("log", "ln"),
        ("dtype", "float64"),
        ("resample", "yes"),
        ("on_bad_file", "ignore"),
        ("short_clip", "crop"),
        ("short_window", 300),
        ("n_fft", 1024),
        ("fmax", 3000.0),
        ("fmin", -1.0),
        ("power", 0),
        ("top_db", -5.0),
        ("center", "no"),
        ("log_floor", 0.0),
        ("num_long", 0),
        ("labels", {"LEAK": -1}),
        ("labels", {"LEAK": 0, "NOLEAK": 0}),
        ("labels", ["LEAK"]),
        ("store_waveform", 1),
    ],
)
def test_bad_config_values_name_key_and_value(key, value):
    with pytest.raises(ConfigError, match=key.split(".")[0]) as info:
        parse_mel_config({key: value})
    assert "invalid value" in str(info.value)


def test_unknown_and_ignored_keys():
    with pytest.raises(ConfigError, match="hop_length"):
        parse_mel_config({"hop_length": 128})
    cfg = parse_mel_config({"seed": 1, "out": "x", "build": {}, "kind": "mel", "source": {}, "norm": "none", "clip_seconds": 5})
    assert cfg.norm is None and cfg.num_long == 20


# ----------------------------------------------------------------- WAV writing helpers
def _quantise(x: np.ndarray, bits: int) -> np.ndarray:
    scale = 2 ** (bits - 1)
    return np.clip(np.round(x * scale), -scale, scale - 1).astype(np.int64)


def write_pcm(path: Path, x: np.ndarray, bits: int, rate: int = 4096) -> np.ndarray:
    """Write float frames ``[n, ch]`` as integer PCM with stdlib ``wave``; return the decoded truth."""
    q = _quantise(x, bits)
    if bits == 8:
        payload = (q + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        payload = q.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        payload = q.astype(f"<i{bits // 8}").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(x.shape[1])
        w.setsampwidth(bits // 8)
        w.setframerate(rate)
        w.writeframes(payload)
    return q / 2 ** (bits - 1)


def write_float(path: Path, x: np.ndarray, rate: int = 4096, extensible: bool = False) -> None:
    """Write an IEEE-float (format 3, or EXTENSIBLE/float) WAV by hand, with an odd LIST chunk."""
    ch = x.shape[1]
    if extensible:
        guid = struct.pack("<H", 3) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt = struct.pack("<HHIIHHHHI", 0xFFFE, ch, rate, rate * ch * 4, ch * 4, 32, 22, 32, 0) + guid
    else:
        fmt = struct.pack("<HHIIHHH", 3, ch, rate, rate * ch * 4, ch * 4, 32, 0)
    data = x.astype("<f4").tobytes()
    junk = b"INFOabc"  # odd size: a pad byte follows
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"LIST" + struct.pack("<I", len(junk)) + junk + b"\x00" + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks)


# ----------------------------------------------------------------- WAV decoding
@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_decoding(tmp_path, bits, channels):
    x = np.random.default_rng(bits).uniform(-1, 1, (1001, channels))
    x[:3] = [[-1.0] * channels, [0.0] * channels, [0.999] * channels]
    path = tmp_path / f"pcm{bits}.wav"
    truth = write_pcm(path, x, bits, rate=8000)
    info = read_wav_info(path)
    assert (info.format_tag, info.channels, info.sample_rate, info.n_frames) == (1, channels, 8000, 1001)
    frames = decode_samples(np.fromfile(path, np.uint8, info.n_frames * info.block_align, offset=info.data_offset), info)
    np.testing.assert_allclose(frames, truth, rtol=0, atol=1e-7)  # exact up to float32
    # within one quantisation step (plus float32 rounding, which dominates at 32 bits)
    assert np.abs(frames - x).max() <= 2.0 ** (1 - bits) + 2.0**-24
    mono, rate = read_wav(path)
    assert rate == 8000 and mono.dtype == np.float32 and mono.shape == (1001,)
    np.testing.assert_allclose(mono, truth.mean(axis=1), atol=1e-7)
    with wave.open(str(path), "rb") as w:  # stdlib agrees on what the file holds
        assert w.getnframes() == info.n_frames and w.getsampwidth() * 8 == bits


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([8, 16, 24, 32]), channels=st.integers(1, 5), frames=st.integers(0, 300), seed=st.integers(0, 2**16))
def test_pcm_round_trip_property(bits, channels, frames, seed):
    import tempfile

    x = np.random.default_rng(seed).uniform(-1, 1, (frames, channels))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.wav"
        truth = write_pcm(path, x, bits, rate=4096 + seed)
        mono, rate = read_wav(path)
    assert rate == 4096 + seed and mono.shape == (frames,)
    np.testing.assert_allclose(mono, truth.mean(axis=1) if frames else np.zeros(0), atol=1e-6)


@pytest.mark.parametrize("extensible", [False, True])
@pytest.mark.parametrize("channels", [1, 2])
def test_float_decoding(tmp_path, extensible, channels):
    x = np.random.default_rng(3).uniform(-1, 1, (777, channels)).astype(np.float32)
    path = tmp_path / "f.wav"
    write_float(path, x, rate=4096, extensible=extensible)
    info = read_wav_info(path)
    assert (info.format_tag, info.channels, info.n_frames) == (3, channels, 777)
    mono, rate = read_wav(path)
    np.testing.assert_array_equal(mono, x.mean(axis=1, dtype=np.float32))


def test_real_recording_decodes_like_stdlib_wave():
    pygame = pytest.importorskip("pygame")
    path = Path(pygame.__file__).parent / "examples" / "data" / "house_lo.wav"
    if not path.exists():
        pytest.skip("pygame example sound missing")
    mono, rate = read_wav(path)
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 1 and w.getnchannels() == 1
        raw = np.frombuffer(w.readframes(w.getnframes()), np.uint8)
        assert rate == w.getframerate()
    np.testing.assert_array_equal(mono, (raw.astype(np.float32) - 128) / 128)


def test_unsupported_and_broken_headers_name_the_file(tmp_path):
    bad = tmp_path / "nodata.wav"
    bad.write_bytes(b"RIFF\x04\x00\x00\x00WAVE")
    with pytest.raises(SourceError, match="nodata.wav"):
        read_wav_info(bad)
    pygame = pytest.importorskip("pygame")
    adpcm = Path(pygame.__file__).parent / "examples" / "data" / "secosmic_lo.wav"
    if adpcm.exists():  # a real ADPCM recording: format 2 is refused by name
        with pytest.raises(SourceError, match="secosmic_lo.wav.*format tag 2"):
            read_wav_info(adpcm)


# ----------------------------------------------------------------- WAV folder source
def _clip(seed: int, n: int = 40960) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (n, 1))


@pytest.fixture()
def wav_root(tmp_path) -> Path:
    root = tmp_path / "data"
    (root / "LEAK").mkdir(parents=True)
    (root / "NOLEAK").mkdir()
    write_pcm(root / "LEAK" / "a_good.wav", _clip(1), 16)
    write_pcm(root / "LEAK" / "b_trunc.wav", _clip(2), 16)
    full = (root / "LEAK" / "b_trunc.wav").read_bytes()
    (root / "LEAK" / "b_trunc.wav").write_bytes(full[: len(full) // 2])
    write_pcm(root / "NOLEAK" / "c_good.wav", np.repeat(_clip(3), 2, axis=1), 24)  # stereo 24-bit
    write_pcm(root / "NOLEAK" / "d_rate.wav", _clip(4, 80000), 16, rate=8000)
    (root / "NOLEAK" / "e_text.wav").write_text("this is not audio\n")
    (root / "NOLEAK" / "notes.txt").write_text("ignored: not a .wav")
    return root


BAD = ("b_trunc.wav", "d_rate.wav", "e_text.wav")


def test_wav_folder_warns_and_skips_bad_files(wav_root):
    with pytest.warns(BadFileWarning) as caught:
        src = WavFolderSource(wav_root, CFG)
    messages = " ".join(str(w.message) for w in caught)
    for name in BAD:
        assert name in messages
    assert "truncated" in messages and "8000 Hz" in messages and "not a WAV" in messages
    assert len(src) == 2 and isinstance(src, MelSource)
    recs = src.records(0, 2)
    assert [r["json"]["path"] for r in recs] == ["LEAK/a_good.wav", "NOLEAK/c_good.wav"]
    assert [int(r["label"]) for r in recs] == [0, 1] and recs[0]["label"].shape == ()
    assert recs[0]["label"].dtype == np.int16 and recs[1]["json"]["label_name"] == "NOLEAK"
    for rec, rel in zip(recs, ["LEAK/a_good.wav", "NOLEAK/c_good.wav"]):
        audio, _ = read_wav(wav_root / rel)
        want = log_mel(segment(audio[None, :], CFG), CFG)[0].astype(np.float16)
        assert rec["mel"].dtype == np.float16 and rec["mel"].shape == (40, 2, 64, 1)
        np.testing.assert_array_equal(rec["mel"], want)
        assert "waveform" not in rec
    assert recs[0]["json"]["file_id"] == 0 and recs[0]["json"]["fmax"] == 2048.0
    desc = src.describe()
    assert desc["n_skipped"] == 3 and desc["label2id"] == {"LEAK": 0, "NOLEAK": 1}
    json.dumps(desc)
    # picklable, same records after the trip, ranges compose
    again = pickle.loads(pickle.dumps(src))
    assert [r["mel"].tobytes() for r in again.records(0, 1) + again.records(1, 2)] == [r["mel"].tobytes() for r in recs]


def test_wav_folder_error_policy_names_the_file(wav_root):
    with pytest.raises(SourceError, match="b_trunc.wav"):
        WavFolderSource(wav_root, MelConfig(on_bad_file="error"))
    for name in BAD:  # each bad file alone next to a good one
        root = wav_root.parent / f"only_{name}"
        (root / "LEAK").mkdir(parents=True)
        write_pcm(root / "LEAK" / "good.wav", _clip(9), 16)
        src_dir = "LEAK" if name.startswith("b") else "NOLEAK"
        (root / "LEAK" / name).write_bytes((wav_root / src_dir / name).read_bytes())
        with pytest.raises(SourceError, match=name):
            WavFolderSource(root, MelConfig(on_bad_file="error"))


def test_wav_folder_resample_pad_labels_and_waveform(wav_root):
    cfg = MelConfig(resample="resample", short_clip="pad", store_waveform=True, labels=(("LEAK", 7), ("NOLEAK", 3)))
    with pytest.warns(BadFileWarning) as caught:
        src = WavFolderSource(wav_root, cfg)
    assert {Path(str(w.message).split(": ")[1]).name for w in caught} == {"b_trunc.wav", "e_text.wav"}
    assert len(src) == 3
    rec = src.records(2, 3)[0]
    assert rec["json"]["path"] == "NOLEAK/d_rate.wav" and int(rec["label"]) == 3
    audio, rate = read_wav(wav_root / "NOLEAK" / "d_rate.wav")
    expect = resample(audio, rate, 4096)[:40960]
    np.testing.assert_array_equal(rec["waveform"], expect.reshape(40, 2, 512))
    np.testing.assert_array_equal(rec["mel"], log_mel(rec["waveform"], cfg).astype(np.float16))
    with pytest.raises(SourceError, match="no id"):
        WavFolderSource(wav_root, MelConfig(labels=(("LEAK", 0),)))


# ----------------------------------------------------------------- HDF5 source
F_H5 = 7


@pytest.fixture()
def h5_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    waves = (rng.standard_normal((F_H5, 40, 2, 512)) * 0.1).astype(np.float32)
    mel = (log_mel(waves, CFG) + rng.uniform(0, 1, (F_H5, 40, 2, 64, 1))).astype(np.float16)
    labels = np.array([0, 1, 1, 0, 1, 0, 0], dtype=np.int16)
    path = tmp_path / "leaks.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=labels)
        f.create_dataset("segments_waveform", data=waves, chunks=(2, 40, 2, 512), compression="gzip")
        f.create_dataset("segments_mel", data=mel, chunks=(3, 40, 2, 64, 1), compression="gzip")
        f.attrs["config_json"] = json.dumps({"sr": 4096, "n_fft": 512, "hop_length": 128, "n_mels": 64, "fmin": 0.0, "window": "hann"})
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    return path, waves, mel, labels


def test_h5_round_trip_in_blocks(h5_file):
    path, waves, mel, labels = h5_file
    src = H5Source(path, CFG)
    assert len(src) == F_H5 and isinstance(src, MelSource)
    src = pickle.loads(pickle.dumps(src))  # what a joblib worker receives
    recs = src.records(0, 3) + src.records(3, 4) + src.records(4, F_H5) + src.records(F_H5, F_H5)
    assert len(recs) == F_H5
    for i, rec in enumerate(recs):
        assert rec["mel"].dtype == np.float16
        assert rec["mel"].tobytes() == mel[i].tobytes()  # stored mel used as is
        assert rec["label"] == labels[i] and rec["label"].dtype == np.int16
        assert rec["json"]["file_id"] == i and rec["json"]["path"].endswith(f"#{i}")
        assert rec["json"]["label_name"] == ["LEAK", "NOLEAK"][labels[i]]
    desc = src.describe()
    assert desc["label_counts"] == {"LEAK": 4, "NOLEAK": 3} and desc["mel_from"] == "stored"
    json.dumps(desc)
    pickle.dumps(src)  # still picklable with the file open
    src.close()
    with pytest.raises(IndexError):
        src.records(5, 9)


def test_h5_mel_from_waveform_labels_remap_and_waveform(h5_file):
    path, waves, _, labels = h5_file
    cfg = MelConfig(store_waveform=True, labels=(("LEAK", 1), ("NOLEAK", 0)))
    src = H5Source(path, cfg, datasets={"mel": None})
    recs = src.records(2, 6)
    want = log_mel(waves[2:6], cfg).astype(np.float16)
    for j, rec in enumerate(recs):
        np.testing.assert_array_equal(rec["mel"], want[j])
        np.testing.assert_array_equal(rec["waveform"], waves[2 + j])
        assert int(rec["label"]) == 1 - labels[2 + j]


def test_h5_mismatches_are_source_errors(h5_file):
    path = h5_file[0]
    with pytest.raises(SourceError, match="segments_waveform"):
        H5Source(path, MelConfig(n_mels=32), datasets={"mel": None})  # recomputed: checked
    with pytest.raises(SourceError, match="fmin"):
        H5Source(path, MelConfig(fmin=20.0), datasets={"mel": None})
    with pytest.raises(SourceError, match="n_fft"):  # the file's n_fft=512 > our short window
        H5Source(path, MelConfig(short_window=256, n_fft=256))
    with pytest.raises(SourceError, match="not in the config"):
        H5Source(path, MelConfig(labels=(("LEAK", 0), ("OTHER", 1))))
    with pytest.raises(SourceError, match="nothere.h5"):
        H5Source(path.parent / "nothere.h5", CFG)


def test_h5_source_in_joblib_workers(h5_file):
    joblib = pytest.importorskip("joblib")
    path, _, mel, _ = h5_file
    src = H5Source(path, CFG)

    parts = joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(_mel_bytes)(src, a, b) for a, b in [(0, 4), (4, F_H5)])
    assert b"".join(parts) == mel.tobytes()


def _mel_bytes(src: H5Source, start: int, stop: int) -> bytes:
    return b"".join(r["mel"].tobytes() for r in src.records(start, stop))


# ----------------------------------------------------------------- synthetic source
def test_synthetic_is_deterministic_per_file():
    src = SyntheticSource(12, CFG, seed=5)
    whole = src.records(0, 12)
    split = src.records(0, 5) + src.records(5, 6) + src.records(6, 12)
    single = [SyntheticSource(100, CFG, seed=5).records(i, i + 1)[0] for i in (0, 7, 11)]
    for a, b in zip(whole, split):
        assert a["mel"].tobytes() == b["mel"].tobytes() and a["json"] == b["json"]
        assert a["label"] == b["label"]
    for i, rec in zip((0, 7, 11), single):
        assert rec["mel"].tobytes() == whole[i]["mel"].tobytes()
    other = SyntheticSource(12, CFG, seed=6).records(0, 1)[0]
    assert other["mel"].tobytes() != whole[0]["mel"].tobytes()
    wav = SyntheticSource(3, MelConfig(store_waveform=True), seed=5).records(1, 2)[0]
    assert wav["mel"].tobytes() == whole[1]["mel"].tobytes()
    assert wav["waveform"].shape == (40, 2, 512) and np.abs(wav["waveform"]).max() <= 1
    json.dumps(src.describe())


def test_synthetic_classes_are_spectrally_separable():
    recs = SyntheticSource(120, CFG, seed=0).records(0, 120)
    labels = np.array([int(r["label"]) for r in recs])
    assert 30 < labels.sum() < 90  # both classes, roughly balanced
    spectra = np.stack([r["mel"] for r in recs]).astype(np.float32).mean(axis=(1, 2, 4))
    centres = mel_frequencies(CFG.n_mels + 2, 0.0, CFG.fmax_hz, htk=CFG.mel_scale == "htk")[1:-1]
    tilt = spectra[:, centres > 400].mean(1) - spectra[:, centres < 150].mean(1)  # dB
    leak, noleak = tilt[labels == 0], tilt[labels == 1]
    # hiss is broadband; ambient noise is 1/f (HTK bands without norm: wide high bands add level)
    assert leak.min() > 10.0 and noleak.max() < -2.0 and leak.min() - noleak.max() > 15.0


def test_synthetic_label_mapping_must_name_both_classes():
    assert SyntheticSource(1, MelConfig(labels=(("LEAK", 1), ("NOLEAK", 0))), 0).label2id == {"LEAK": 1, "NOLEAK": 0}
    with pytest.raises(ConfigError, match="labels"):
        SyntheticSource(1, MelConfig(labels=(("A", 0), ("B", 1))), 0)
    with pytest.raises(ConfigError, match="n_files"):
        SyntheticSource(-1, CFG, 0)


def test_cli_prints_skipped_files_as_one_clean_warning_line(wav_root, tmp_path):
    import subprocess

    out = tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "cachebuild.cli", "mel", "--from-wav", str(wav_root), "--out", str(out), "-j", "1", "-q"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    warned = [line for line in lines if line.startswith("warning: skipping bad audio file:")]
    assert len(warned) == 3 and all(any(name in line for line in warned) for name in BAD)
    assert lines == warned  # no 'file.py:NN: BadFileWarning' prefix, no source line
    assert "Warning:" not in r.stderr and ".py:" not in r.stderr


@pytest.mark.filterwarnings("default:skipping bad audio file")  # the CLI prints it: that is what is tested
def test_cli_warning_format_does_not_leak_into_the_library(wav_root, tmp_path):
    import warnings

    from click.testing import CliRunner

    from cachebuild.cli import main

    before = warnings.showwarning
    r = CliRunner().invoke(main, ["mel", "--from-wav", str(wav_root), "--out", str(tmp_path / "c"), "-j", "1", "-q"])
    assert r.exit_code == 0 and "warning: skipping bad audio file:" in r.output
    assert warnings.showwarning is before


def test_unsupported_audio_is_listed_as_skipped_never_silently_ignored(wav_root, tmp_path):
    (wav_root / "LEAK" / "f_song.flac").write_bytes(b"fLaC\x00\x00\x00\x22" + bytes(34))
    (wav_root / "NOLEAK" / "g_talk.MP3").write_bytes(b"ID3\x04" + bytes(60))
    with pytest.warns(BadFileWarning) as caught:
        src = WavFolderSource(wav_root, CFG)
    assert len(src) == 2  # the two good WAVs only
    skipped = {s["path"]: s["reason"] for s in src.describe()["skipped"]}
    assert set(skipped) == {"LEAK/b_trunc.wav", "NOLEAK/d_rate.wav", "NOLEAK/e_text.wav", "LEAK/f_song.flac", "NOLEAK/g_talk.MP3"}
    assert "unsupported format (.flac); convert it to WAV" in skipped["LEAK/f_song.flac"]
    assert "unsupported format (.mp3)" in skipped["NOLEAK/g_talk.MP3"]
    assert any("f_song.flac" in str(w.message) for w in caught)
    assert "notes.txt" not in " ".join(skipped)  # not audio: ignored
    for name in BAD:
        (wav_root / ("LEAK" if name.startswith("b") else "NOLEAK") / name).unlink()
    with pytest.raises(SourceError, match=r"f_song.flac: unsupported format \(.flac\)"):
        WavFolderSource(wav_root, MelConfig(on_bad_file="error"))


@pytest.mark.filterwarnings("default:skipping bad audio file")  # the CLI prints it: that is what is tested
def test_cli_names_a_skipped_flac_on_one_line(wav_root, tmp_path):
    from click.testing import CliRunner

    from cachebuild.cli import main

    (wav_root / "LEAK" / "f_song.flac").write_bytes(b"fLaC" + bytes(38))
    r = CliRunner().invoke(main, ["mel", "--from-wav", str(wav_root), "--out", str(tmp_path / "c"), "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    flac = [line for line in r.output.splitlines() if "f_song.flac" in line]
    assert len(flac) == 1 and flac[0].startswith("warning: skipping bad audio file:") and "convert it to WAV" in flac[0]


def test_flac_is_read_through_soundfile_like_the_same_samples_as_wav(tmp_path):
    sf = pytest.importorskip("soundfile")
    root = tmp_path / "data"
    (root / "A").mkdir(parents=True)
    truth = write_pcm(root / "A" / "a.wav", np.repeat(_clip(7), 2, axis=1), 16)  # stereo 16-bit
    ints = np.round(truth * 32768).astype(np.int16)
    sf.write(root / "A" / "b.flac", ints, CFG.sample_rate, subtype="PCM_16")
    src = WavFolderSource(root, CFG)
    assert len(src) == 2 and src.skipped == []
    a, b = src.records(0, 2)
    assert b["json"]["path"] == "A/b.flac"
    np.testing.assert_array_equal(a["mel"], b["mel"])
    assert src.describe()["libsndfile"] == sf.__libsndfile_version__


def test_without_soundfile_other_formats_say_how_to_read_them(wav_root, monkeypatch):
    import cachebuild.mel.other_audio as other

    monkeypatch.setattr(other, "_soundfile", lambda: None)  # as if soundfile were not installed
    (wav_root / "LEAK" / "f_song.flac").write_bytes(b"fLaC" + bytes(38))
    with pytest.warns(BadFileWarning):
        src = WavFolderSource(wav_root, CFG)
    reasons = {s["path"]: s["reason"] for s in src.skipped}
    assert reasons["LEAK/f_song.flac"].endswith("f_song.flac: unsupported format (.flac); convert it to WAV or install soundfile")
