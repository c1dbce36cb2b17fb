"""The mel records against the users' leak builder, before the mel: audio, segments, HDF5 files.

``test_mel_users.py`` checks the log-mel itself against torchaudio's definition. Here,
test-only references of what the users' builders do before and around it
(``eviltwinkie/AILH_MASTER``: ``AI_DEV/dataset_builder.py`` of 2025-11-21 and the earlier
``leak_dataset_builder_v15.py``):

* ``load_wav_mono_fast``: ``soundfile.read(path, dtype="float32", always_2d=True)``, one
  channel as is, two as ``(L + R) * 0.5``, more as ``mean(axis=1, dtype=float32)``;
* then zero-pad at the end or trim to ``sample_rate * duration_sec`` samples, and
  ``reshape(num_long, num_short, short_window)`` (consecutive, non-overlapping windows);
* their newest ``config_json`` adds ``center``, ``long_scale_sec`` and ``short_points``.

Known difference (documented, not a bug): their builders pad a short clip silently; our
default (``short_clip = "refuse"``) skips it with a warning, ``short_clip = "pad"`` is theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import SourceError
from cachebuild.mel import BadFileWarning, H5Source, MelConfig, WavFolderSource, log_mel
from cachebuild.mel.wav import read_wav
from test_mel_sources import write_pcm

sf = pytest.importorskip("soundfile")

SR, SECONDS = 4096, 10
N = SR * SECONDS


def _their_load(path: Path) -> tuple[np.ndarray, int]:
    """Their ``load_wav_mono_fast``."""
    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    if data.shape[1] == 1:
        wav = data[:, 0]
    elif data.shape[1] == 2:
        wav = (data[:, 0] + data[:, 1]) * 0.5
    else:
        wav = data.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(wav, dtype=np.float32), sr


def _their_segments(wav: np.ndarray) -> np.ndarray:
    """Their pad (zeros at the end) or trim to 10 s, then [40, 2, 512]."""
    if wav.size < N:
        wav = np.pad(wav, (0, N - wav.size), mode="constant")
    return wav[:N].reshape(N // 1024, 2, 512).astype(np.float32)


def _write_pcm(path: Path, frames: np.ndarray, bits: int) -> None:
    write_pcm(path, frames, bits, rate=SR)


@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_decoded_audio_equals_their_soundfile_read(tmp_path: Path, bits: int, channels: int) -> None:
    """Every PCM width and channel count: our mono float32 samples equal theirs bit for bit."""
    frames = np.random.default_rng(bits * 10 + channels).uniform(-0.9, 0.9, (5000, channels))
    path = tmp_path / "x.wav"
    _write_pcm(path, frames, bits)
    ours, rate = read_wav(path)
    theirs, their_rate = _their_load(path)
    assert rate == their_rate == SR and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)


def test_float_wav_equals_their_soundfile_read(tmp_path: Path) -> None:
    frames = np.random.default_rng(3).uniform(-1.0, 1.0, (4000, 2)).astype(np.float32)
    path = tmp_path / "f.wav"
    sf.write(str(path), frames, SR, subtype="FLOAT")
    np.testing.assert_array_equal(read_wav(path)[0], _their_load(path)[0])


@pytest.fixture()
def clips(tmp_path: Path) -> Path:
    """A label folder tree: a 12 s stereo clip (trimmed), a 7.3 s clip (padded), a 10 s clip."""
    rng = np.random.default_rng(9)
    root = tmp_path / "TRAINING"
    (root / "LEAK").mkdir(parents=True)
    (root / "NOLEAK").mkdir()
    _write_pcm(root / "LEAK" / "long_stereo.wav", rng.uniform(-0.5, 0.5, (12 * SR, 2)), 16)
    _write_pcm(root / "LEAK" / "short.wav", rng.uniform(-0.5, 0.5, (int(7.3 * SR), 1)), 16)
    _write_pcm(root / "NOLEAK" / "exact.wav", rng.uniform(-0.5, 0.5, (N, 1)), 24)
    return root


def test_segments_equal_their_pad_trim_and_reshape(clips: Path) -> None:
    cfg = MelConfig(short_clip="pad", store_waveform=True)
    src = WavFolderSource(clips, cfg)
    recs = src.records(0, len(src))
    assert [r["json"]["path"] for r in recs] == ["LEAK/long_stereo.wav", "LEAK/short.wav", "NOLEAK/exact.wav"]
    for rec in recs:
        want = _their_segments(_their_load(clips / rec["json"]["path"])[0])
        np.testing.assert_array_equal(rec["waveform"], want)
        np.testing.assert_array_equal(rec["mel"], log_mel(want, cfg).astype(np.float16))
    their_ids = {name: i for i, name in enumerate(sorted({"LEAK", "NOLEAK"}))}  # sorted label folders
    assert [int(r["label"]) for r in recs] == [their_ids[r["json"]["path"].split("/")[0]] for r in recs]


def test_default_skips_the_short_clip_they_pad(clips: Path) -> None:
    """The documented difference: by default a short clip is a bad file (warned, skipped)."""
    with pytest.warns(BadFileWarning, match="short.wav"):
        src = WavFolderSource(clips, MelConfig())
    assert len(src) == 2 and [s["path"] for s in src.skipped] == ["LEAK/short.wav"]


def _their_newest_h5(path: Path, center: bool) -> np.ndarray:
    """A file as their newest ``dataset_builder.py`` writes it (its ``config_json`` keys)."""
    import h5py

    cfg = MelConfig()
    waves = (np.random.default_rng(1).standard_normal((3, 40, 2, 512)) * 0.1).astype(np.float32)
    mel = log_mel(waves, cfg).astype(np.float16)
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.array([0, 1, 0], np.int16))
        f.create_dataset("segments_waveform", data=waves)
        f.create_dataset("segments_mel", data=mel)
        f.attrs["config_json"] = json.dumps(
            {
                "sample_rate": 4096, "duration_sec": 10, "long_window": 1024, "short_window": 512,
                "n_mels": 64, "n_fft": 512, "hop_length": 128, "power": 1.0,
                "long_scale_sec": 1024 / 4096, "short_points": 512, "center": center,
            }
        )  # fmt: skip
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    return mel


def test_their_newest_h5_copies_and_recomputes_identically(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    path = tmp_path / "TRAINING_DATASET.H5"
    mel = _their_newest_h5(path, center=False)
    copied = H5Source(path, MelConfig()).records(0, 3)
    recomputed = H5Source(path, MelConfig(), datasets={"mel": None}).records(0, 3)
    for i, (a, b) in enumerate(zip(copied, recomputed)):
        np.testing.assert_array_equal(a["mel"], mel[i])
        np.testing.assert_array_equal(b["mel"], mel[i])
        assert int(a["label"]) == int(b["label"]) == [0, 1, 0][i]


def test_their_h5_made_with_center_is_not_recomputed_without_it(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    path = tmp_path / "centered.H5"
    _their_newest_h5(path, center=True)
    with pytest.raises(SourceError, match="center"):
        H5Source(path, MelConfig(), datasets={"mel": None})


def _their_file_decisions(p_seg: np.ndarray, threshold: float) -> np.ndarray:
    """Their ``evaluate_file_level`` (fixed threshold): mean per long window, ``p >= threshold``,
    a leak when at least ``ceiling_half(num_long) = (L + 1) // 2`` long windows vote leak."""
    out = []
    for probs_short in p_seg:  # [L, S] of one file
        probs_long = probs_short.mean(axis=1).tolist()
        above = sum(1 for p in probs_long if p >= threshold)
        out.append(above >= (len(probs_long) + 1) // 2)
    return np.array(out)


@pytest.mark.parametrize("threshold", [0.5, 0.25, 0.75])
def test_file_decisions_equal_their_evaluate_file_level_with_ties(threshold: float) -> None:
    """Ties included: windows at exactly the threshold and files with exactly half their windows."""
    import torch

    from cachebuild.mel.voting import file_votes

    rng = np.random.default_rng(int(threshold * 100))
    Fv, Lv, t, d = 400, 40, np.float32(threshold), np.float32(0.125)  # exact in float32: ties stay ties
    above = np.array([[t, t], [t + d, t - d], [t + d, t + d]], np.float32)  # mean >= threshold
    below = np.array([[t - d, t - d], [t, t - 2 * d]], np.float32)  # mean < threshold
    n_above = rng.integers(0, Lv + 1, Fv)
    n_above[:60] = Lv // 2  # exactly half the long windows vote: a leak in theirs
    is_above = np.arange(Lv)[None, :] < n_above[:, None]
    p = np.where(is_above[..., None], above[rng.integers(0, 3, (Fv, Lv))], below[rng.integers(0, 2, (Fv, Lv))])
    half = n_above == Lv // 2
    want = _their_file_decisions(p, threshold)
    _, got = file_votes(torch.from_numpy(p), from_logits=False, threshold=threshold)
    assert want[half].all() and 0.1 < want.mean() < 0.95
    np.testing.assert_array_equal(got.numpy(), want)
    zero = np.zeros((3, Lv, 2), np.float32)  # an untrained model: logit 0, sigmoid 0.5, votes leak in theirs
    assert file_votes(torch.from_numpy(zero), threshold=0.5)[1].all()
