"""Mel caches tried as a new user would (review): real WAV folders and HDF5 files in the users' layout,
built through the CLI and streamed back, checked against an independent soundfile + librosa reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import SourceError
from cachebuild.format import open_cache, read_record
from cachebuild.mel import MelConfig
from cachebuild.mel.records import BadFileWarning
from cachebuild.mel.sources import H5Source, WavFolderSource
from loaders import ShardStream

sf = pytest.importorskip("soundfile")
librosa = pytest.importorskip("librosa")

SR, CLIP = 4096, 40 * 1024


def reference_log_mel(path: Path) -> np.ndarray:
    """The users' builder's mel, computed independently: soundfile decode, channel mean, FFT resample,
    zero-pad/truncate, [40, 2, 512] windows, periodic Hann, |rfft|, librosa HTK filterbank, 20*log10, float16."""
    x, rate = sf.read(str(path), dtype="float64", always_2d=True)
    x = x.mean(axis=1)
    if rate != SR:
        x = librosa.resample(x, orig_sr=rate, target_sr=SR, res_type="fft")
    x = np.pad(x, (0, max(0, CLIP - len(x))))[:CLIP].reshape(40, 2, 512)
    spec = np.abs(np.fft.rfft(x * librosa.filters.get_window("hann", 512, fftbins=True), axis=-1))
    fb = librosa.filters.mel(sr=SR, n_fft=512, n_mels=64, htk=True, norm=None, fmin=0.0, fmax=SR / 2)
    mel = np.einsum("mk,lsk->lsm", fb, spec)[..., None]
    return (20 * np.log10(np.maximum(mel, 1e-10))).astype(np.float16)


@pytest.fixture()
def wav_folder(tmp_path) -> Path:
    rng = np.random.default_rng(7)
    root = tmp_path / "wavs"
    (root / "LEAK").mkdir(parents=True)
    (root / "NOLEAK").mkdir()
    noise = lambda n, ch=1: rng.normal(0, 0.3, (n, ch)).clip(-1, 1)  # noqa: E731
    sf.write(root / "LEAK" / "mono16.wav", noise(CLIP), SR, subtype="PCM_16")
    sf.write(root / "LEAK" / "stereo_float.wav", noise(CLIP, 2).astype(np.float32), SR, subtype="FLOAT")
    sf.write(root / "LEAK" / "rate8k_24bit.wav", noise(2 * CLIP), 2 * SR, subtype="PCM_24")
    sf.write(root / "NOLEAK" / "short.wav", noise(300), SR, subtype="PCM_16")  # shorter than one segment
    sf.write(root / "NOLEAK" / "silent.wav", np.zeros(CLIP), SR, subtype="PCM_16")
    sf.write(root / "NOLEAK" / "long_u8.wav", noise(CLIP + 5000), SR, subtype="PCM_U8")
    (root / "NOLEAK" / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunk")
    return root


def test_wav_folder_build_equals_an_independent_reference(wav_folder, tmp_path):
    from cachebuild.cli import main

    out = tmp_path / "cache"
    args = ["mel", "--from-wav", str(wav_folder), "--out", str(out), "-j", "1", "-q", "--set", "short_clip=pad", "--set", "resample=resample"]
    with pytest.raises(SystemExit) as exit_info, pytest.warns(BadFileWarning, match="corrupt.wav"):
        main(args)
    assert exit_info.value.code in (0, None)
    shards = open_cache(out)
    n = shards.manifest.records
    paths = [read_record(shards, i)["json"]["path"] for i in range(n)]
    assert paths == ["LEAK/mono16.wav", "LEAK/rate8k_24bit.wav", "LEAK/stereo_float.wav", "NOLEAK/long_u8.wav", "NOLEAK/short.wav", "NOLEAK/silent.wav"]
    want = np.stack([reference_log_mel(wav_folder / p) for p in paths])
    labels = np.array([0, 0, 0, 1, 1, 1])
    batch = next(iter(ShardStream(out, view="mel_files", batch_size=n, shuffle=False)))
    got = batch["mel"].numpy()
    # float32 vs float64 arithmetic: at most one float16 step apart, nearly all equal
    assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= 0.125
    assert (got == want).mean() > 0.999
    assert (batch["label"].numpy() == labels).all() and (batch["file_id"].numpy() == np.arange(n)).all()
    seen = []  # the segment view: every (file, long, short) once, each equal to the file's window
    for b in ShardStream(out, view="mel", batch_size=97, seed=3):
        keep = ~b["is_pad"].numpy()
        f, l, s = (b[k].numpy()[keep] for k in ("file_id", "long_index", "short_index"))
        assert (b["mel"].numpy()[keep][:, 0] == got[f, l, s]).all() and (b["label"].numpy()[keep] == labels[f]).all()
        seen.append((f * 40 + l) * 2 + s)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n * 80))


def test_audio_outside_label_folders_is_named_not_dropped_silently(wav_folder):
    """A user's LEAK/site1/*.wav used to vanish without a word (LEAK left with fewer files)."""
    (wav_folder / "NOLEAK" / "corrupt.wav").unlink()  # only the warning under test
    (wav_folder / "LEAK" / "site1").mkdir()
    (wav_folder / "LEAK" / "mono16.wav").rename(wav_folder / "LEAK" / "site1" / "a.wav")
    (wav_folder / "top.WAV").write_bytes((wav_folder / "NOLEAK" / "silent.wav").read_bytes())
    (wav_folder / "LEAK" / ".hidden").mkdir()
    (wav_folder / "LEAK" / ".hidden" / "x.wav").write_bytes(b"")
    with pytest.warns(BadFileWarning, match=r"2 audio file\(s\) not read.*LEAK/site1/a.wav, top.WAV"):
        src = WavFolderSource(wav_folder, MelConfig(short_clip="pad", resample="resample"))
    assert src.describe()["not_read"] == ["LEAK/site1/a.wav", "top.WAV"]
    assert len(src) == 5  # the readable files of the label folders themselves


def _users_h5(path: Path, label_attrs: dict[str, object]) -> tuple[np.ndarray, np.ndarray]:
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(1)
    labels = np.array([1, 0, 0, 1, 1], dtype=np.int16)
    mel = rng.normal(-40, 10, (5, 40, 2, 64, 1)).astype(np.float16)
    with h5py.File(path, "w") as f:
        f["labels"] = labels
        f.create_dataset("segments_mel", data=mel, chunks=(2, 40, 2, 64, 1))
        f.attrs["config_json"] = json.dumps({"sample_rate": 4096, "n_fft": 512, "hop_length": 128, "n_mels": 64, "power": 1.0})
        for key, value in label_attrs.items():
            f.attrs[key] = json.dumps(value)
    return labels, mel


@pytest.mark.parametrize(
    "attrs",
    [
        {"labels_json": {"0": "LEAK", "1": "NOLEAK"}},  # id -> name (was: ValueError traceback, int('LEAK'))
        {"label2id_json": {"LEAK": "0", "NOLEAK": "1"}},  # ids written as strings
        {"labels_json": ["LEAK", "NOLEAK"], "label2id_json": {"LEAK": 0, "NOLEAK": 1}},  # the users' builder
    ],
)
def test_h5_label_mappings_either_direction(tmp_path, attrs):
    labels, mel = _users_h5(tmp_path / "leaks.h5", attrs)
    src = H5Source(tmp_path / "leaks.h5", MelConfig())
    recs = src.records(0, 5)
    assert [r["json"]["label_name"] for r in recs] == [["LEAK", "NOLEAK"][i] for i in labels]
    assert [int(r["label"]) for r in recs] == labels.tolist()
    assert all(r["mel"].tobytes() == mel[i].tobytes() for i, r in enumerate(recs))


def test_h5_malformed_label_mapping_is_one_line(tmp_path):
    _users_h5(tmp_path / "leaks.h5", {"label2id_json": {"LEAK": [0], "NOLEAK": None}})
    with pytest.raises(SourceError, match=r"leaks.h5: attribute label2id_json must map label names to integer ids"):
        H5Source(tmp_path / "leaks.h5", MelConfig())


def test_an_empty_recording_is_a_bad_file_even_when_padding(wav_folder):
    """A 0-frame WAV used to become a record of pure zero padding (silence labelled LEAK) with short_clip = "pad"."""
    (wav_folder / "NOLEAK" / "corrupt.wav").unlink()  # only the warning under test
    sf.write(wav_folder / "LEAK" / "empty.wav", np.zeros((0, 1)), SR, subtype="PCM_16")
    sf.write(wav_folder / "LEAK" / "one_frame_48k.wav", np.full((1, 1), 0.5), 48000, subtype="PCM_16")  # 0 samples at 4096 Hz
    with pytest.warns(BadFileWarning, match=r"no audio samples") as record:
        src = WavFolderSource(wav_folder, MelConfig(short_clip="pad", resample="resample"))
    messages = " ".join(str(w.message) for w in record)
    assert "empty.wav: no audio samples (0 frames at 4096 Hz)" in messages and "one_frame_48k.wav: no audio samples (1 frames at 48000 Hz)" in messages
    assert [s["path"] for s in src.describe()["skipped"]] == ["LEAK/empty.wav", "LEAK/one_frame_48k.wav"]
    with pytest.raises(SourceError, match=r"empty.wav: no audio samples"):
        WavFolderSource(wav_folder, MelConfig(short_clip="pad", resample="resample", on_bad_file="error"))
