"""The ``mel`` / ``mel_files`` views and file-level voting.

A small file in the users' HDF5 layout is built into caches (zstd and raw) with
``run_mel_build``; the views must give back exactly its float16 values and
labels (every segment once per epoch), equal a plain tarfile + zstd reader
value for value, be deterministic and resume exactly; the vectorised votes
must equal a plain per-file loop.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import loaders.views.mel  # noqa: F401  (registers "mel" and "mel_files")
from cachebuild.format import read_manifest
from loader_fixtures import Reference, batches_equal
from loaders import ShardStream, make_loader
from cachebuild.mel.voting import VoteAccumulator, file_confusion, file_level_accuracy, file_votes, leak_label_id, segment_file_votes

F, L, S, M, T, W = 45, 40, 2, 64, 1, 512


# ----------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def h5_data(tmp_path_factory):
    """A file in the users' layout, with attributes as their converter writes them."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 2, F).astype(np.int16)
    waves = (rng.standard_normal((F, L, S, W)) * 0.1).astype(np.float32)
    mel = rng.uniform(-90, 10, (F, L, S, M, T)).astype(np.float16)
    path = tmp_path_factory.mktemp("melh5") / "leaks.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=labels)
        f.create_dataset("segments_waveform", data=waves, chunks=(4, L, S, W))
        f.create_dataset("segments_mel", data=mel, chunks=(8, L, S, M, T), compression="gzip")
        f.attrs["config_json"] = json.dumps({"sr": 4096, "n_fft": 512, "hop_length": 128, "n_mels": 64, "fmin": 0.0})
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    return path, mel, labels, waves


def _build(h5: Path, out: Path, codec: str = "zstd", waveform: bool = False) -> Path:
    from cachebuild.jobs import run_mel_build

    values = {"build.shard_mb": 0.1, "build.codec": codec, "store_waveform": waveform}
    run_mel_build(None, [], values, out, from_h5=h5, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def mel_cache(h5_data, tmp_path_factory):
    return _build(h5_data[0], tmp_path_factory.mktemp("melz") / "cache", waveform=True)


@pytest.fixture(scope="module")
def mel_cache_raw(h5_data, tmp_path_factory):
    return _build(h5_data[0], tmp_path_factory.mktemp("melr") / "cache", codec="none")


def _epoch(stream: ShardStream, epoch: int = 0) -> list[dict]:
    return [stream.batch(b, epoch) for b in range(stream.plan(epoch).batches)]


def _cat(batches: list[dict], key: str) -> np.ndarray:
    return np.concatenate([b[key].numpy() for b in batches])


# ----------------------------------------------------------------- (1) HDF5 round trip
def test_cache_has_several_shards_and_the_h5_labels(mel_cache, h5_data):
    m = read_manifest(mel_cache)
    assert len(m.shards) >= 3 and m.records == F
    assert leak_label_id(m) == 0 and leak_label_id(m.config, "NOLEAK") == 1


def test_mel_files_round_trip(mel_cache, h5_data):
    _, mel, labels, waves = h5_data
    stream = ShardStream(mel_cache, view="mel_files", batch_size=8, shuffle=False, waveform=True)
    batches = _epoch(stream)
    assert len(batches) == math.ceil(F / 8)
    b0 = batches[0]
    assert b0["mel"].shape == (8, L, S, M, T) and b0["mel"].dtype == torch.float16
    assert b0["long_mask"].shape == (8, L) and bool(b0["long_mask"].all())
    fid, pad = _cat(batches, "file_id"), _cat(batches, "is_pad")
    assert fid[~pad].tolist() == list(range(F))  # cache order, each file once
    assert pad.sum() == 8 * len(batches) - F
    got = _cat(batches, "mel")
    assert got.view(np.uint16).tolist() == mel[fid].view(np.uint16).tolist()  # bit for bit, padding rows too
    assert np.array_equal(_cat(batches, "label"), labels[fid].astype(np.int64))
    assert np.array_equal(_cat(batches, "waveform"), waves[fid])


@pytest.mark.parametrize("workers", [0, 2])
def test_mel_files_offsets_slice_each_files_segments(mel_cache, h5_data, workers):
    """Issue 4: whole files in batches *with offsets*: rows offsets[f]:offsets[f+1] of the flat segments are file f's."""
    _, mel, _, _ = h5_data
    loader = make_loader(ShardStream(mel_cache, view="mel_files", batch_size=8, shuffle=False), num_workers=workers)
    seen = 0
    for b in loader:
        off = b["offsets"].numpy()
        assert b["offsets"].dtype == torch.int64 and off.shape == (9,) and off[0] == 0
        flat = b["mel"].reshape(-1, 1, M, T).numpy()
        assert off[-1] == len(flat)
        for f, fid in enumerate(b["file_id"].tolist()):
            segs = flat[off[f] : off[f + 1]]
            assert segs.view(np.uint16).tolist() == mel[fid].reshape(-1, 1, M, T).view(np.uint16).tolist()
            seen += 1
    assert seen >= F


def test_mel_segments_round_trip_every_segment_once(mel_cache, h5_data):
    _, mel, labels, waves = h5_data
    B = 500
    stream = ShardStream(mel_cache, view="mel", batch_size=B, shuffle=True, seed=3, waveform=True)
    batches = _epoch(stream)
    assert len(batches) == math.ceil(F * L * S / B)
    assert batches[0]["mel"].shape == (B, 1, M, T) and batches[0]["mel"].dtype == torch.float16
    f, l, s = (_cat(batches, k) for k in ("file_id", "long_index", "short_index"))
    pad = _cat(batches, "is_pad")
    seg = (f * L + l) * S + s
    assert np.array_equal(np.sort(seg[~pad]), np.arange(F * L * S))  # every segment exactly once
    assert pad.sum() == len(batches) * B - F * L * S
    assert np.array_equal(_cat(batches, "mel")[:, 0].view(np.uint16), mel[f, l, s].view(np.uint16))
    assert np.array_equal(_cat(batches, "label"), labels[f].astype(np.int64))
    assert np.array_equal(_cat(batches, "waveform"), waves[f, l, s])
    # rows of a batch are mixed across the files of a pool (here all 45 files)
    b = batches[2]["file_id"].numpy()
    assert (b[1:] != b[:-1]).mean() > 0.5
    assert 40 <= len(np.unique(b)) <= stream.view.g_max


def test_float32_option_is_the_cast(mel_cache):
    a = ShardStream(mel_cache, view="mel", batch_size=700, seed=1)
    b = ShardStream(mel_cache, view="mel", batch_size=700, seed=1, dtype="float32")
    x, y = a.batch(1), b.batch(1)
    assert y["mel"].dtype == torch.float32
    assert torch.equal(x["mel"].float(), y["mel"])
    assert torch.equal(x["file_id"], y["file_id"]) and torch.equal(x["long_index"], y["long_index"])
    files = ShardStream(mel_cache, view="mel_files", batch_size=6, shuffle=False, dtype="float32").batch(0)
    assert files["mel"].dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        ShardStream(mel_cache, view="mel", batch_size=8, dtype="int8")


# ----------------------------------------------------------------- (2) equal to a plain reader
def _reference(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every record's mel and label, read one by one with a plain tarfile + zstd reader."""
    ref = Reference(root)
    mels, labels = [], []
    for rid in range(ref.manifest.records):
        rec = ref.record(rid)
        mels.append(rec["mel"])
        labels.append(int(rec["label"]))
        assert rec["json"]["file_id"] == rid
    return np.stack(mels), np.array(labels)


@pytest.mark.parametrize("which", ["zstd", "raw"])
def test_views_equal_shard_reader(which, mel_cache, mel_cache_raw):
    root = mel_cache if which == "zstd" else mel_cache_raw
    assert read_manifest(root).codec.name == ("zstd" if which == "zstd" else "none")
    mel, labels = _reference(root)
    seg = ShardStream(root, view="mel", batch_size=1024, seed=9)
    for batch in _epoch(seg, epoch=1):
        f, l, s = batch["file_id"].numpy(), batch["long_index"].numpy(), batch["short_index"].numpy()
        assert np.array_equal(batch["mel"].numpy()[:, 0].view(np.uint16), mel[f, l, s].view(np.uint16))
        assert np.array_equal(batch["label"].numpy(), labels[f])
    files = ShardStream(root, view="mel_files", batch_size=7, seed=9)  # shuffled files, padded last batch
    for batch in _epoch(files):
        f = batch["file_id"].numpy()
        assert np.array_equal(batch["mel"].numpy().view(np.uint16), mel[f].view(np.uint16))
        assert np.array_equal(batch["label"].numpy(), labels[f])


# ----------------------------------------------------------------- (3) votes
def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _reference_votes(logits: np.ndarray, mask: np.ndarray, threshold: float, vote_fraction: float, rule: str):
    """The users' loop: per file, per long window, vote; then the file's fraction."""
    fracs, decisions = [], []
    for f in range(logits.shape[0]):
        votes = windows = 0
        for l in range(logits.shape[1]):
            if not mask[f, l]:
                continue
            p = [_sigmoid(float(v)) for v in logits[f, l]]
            if rule == "mean":
                vote = sum(p) / len(p) >= threshold
            else:
                vote = sum(q >= threshold for q in p) > len(p) / 2
            votes += vote
            windows += 1
        frac = votes / windows if windows else float("nan")
        fracs.append(frac)
        decisions.append(frac >= vote_fraction)
    return np.array(fracs), np.array(decisions)


@pytest.mark.parametrize("rule", ["mean", "majority"])
@pytest.mark.parametrize("threshold,vote_fraction", [(0.5, 0.5), (0.3, 0.7), (0.6, 0.25)])
def test_file_votes_equal_a_per_file_loop(rule, threshold, vote_fraction):
    rng = np.random.default_rng(0)
    Fv, Lv, Sv = 300, 40, 3 if rule == "majority" else 2
    logits = (rng.standard_normal((Fv, Lv, Sv)) * 2 + rng.normal(0, 1, (Fv, 1, 1))).astype(np.float32)
    mask = rng.random((Fv, Lv)) > 0.1
    mask[0] = False  # a file without windows: NaN, not a leak
    want_frac, want_dec = _reference_votes(logits, mask, threshold, vote_fraction, rule)
    kw = dict(threshold=threshold, vote_fraction=vote_fraction, rule=rule)
    frac, dec = file_votes(torch.from_numpy(logits), long_mask=torch.from_numpy(mask), **kw)
    assert frac.dtype == torch.float64 and dec.dtype == torch.bool
    np.testing.assert_array_equal(frac.numpy(), want_frac)  # NaN == NaN here
    np.testing.assert_array_equal(dec.numpy(), want_dec)
    assert 0.05 < want_dec.mean() < 0.95  # both decisions occur
    # numpy in, numpy out; flat scores as a model returns them
    frac_np, dec_np = file_votes(logits.reshape(-1, 1), num_long=Lv, num_short=Sv, long_mask=mask, **kw)
    assert isinstance(dec_np, np.ndarray) and np.array_equal(dec_np, want_dec)
    # two-class logits: the leak column of a softmax == sigmoid of the logit difference
    two = np.stack([logits, np.zeros_like(logits)], axis=-1)  # class 0 = LEAK
    _, dec2 = file_votes(torch.from_numpy(two), leak_class=0, long_mask=torch.from_numpy(mask), **kw)
    flip = np.abs(1 / (1 + np.exp(-logits.astype(np.float64))) - threshold) < 1e-6  # float32 softmax ties
    assert flip.any() or np.array_equal(dec2.numpy(), want_dec)
    # segments in any order, over several batches, with padding rows: the same
    f, l, s = np.meshgrid(np.arange(Fv), np.arange(Lv), np.arange(Sv), indexing="ij")
    keep = np.broadcast_to(mask[:, :, None], f.shape).reshape(-1)
    rows = rng.permutation(np.flatnonzero(keep))
    rows = np.concatenate([rows, rows[:77]])  # repeats flagged as padding
    pad = np.arange(len(rows)) >= len(rows) - 77
    acc = VoteAccumulator(Fv, Lv, **kw)
    for part in np.array_split(np.arange(len(rows)), 5):
        r = rows[part]
        acc.update(torch.from_numpy(logits.reshape(-1)[r]), f.reshape(-1)[r], l.reshape(-1)[r], pad[part])
    frac3, dec3, windows = acc.result()
    np.testing.assert_array_equal(frac3.numpy(), want_frac)
    np.testing.assert_array_equal(dec3.numpy(), want_dec)
    assert np.array_equal(windows.numpy(), mask.sum(1))
    frac4, _ = segment_file_votes(logits.reshape(-1)[rows], f.reshape(-1)[rows], l.reshape(-1)[rows], Fv, Lv, pad, **kw)
    np.testing.assert_array_equal(frac4, want_frac)


def test_confusion_and_accuracy_equal_a_loop():
    rng = np.random.default_rng(1)
    dec, labels, pad = rng.random(200) > 0.5, rng.integers(0, 2, 200), rng.random(200) < 0.1
    counts = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
    for d, y, p in zip(dec, labels, pad):
        if not p:
            leak = y == 0
            counts[("t" if d == leak else "f") + ("p" if d else "n")] += 1
    got = file_confusion(dec, labels, leak_label=0, is_pad=pad)
    assert {k: got[k] for k in counts} == counts
    assert file_level_accuracy(dec, labels, 0, pad) == (counts["tp"] + counts["tn"]) / (~pad).sum()
    with pytest.raises(ValueError, match="rule"):
        file_votes(np.zeros((1, 2, 2)), rule="max")


def test_segment_and_file_views_give_the_same_votes(mel_cache):
    """A tiny model's file decisions: one call per mel_files batch == tallied over mel view batches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(M * T, 1))
    files = ShardStream(mel_cache, view="mel_files", batch_size=16, shuffle=False, dtype="float32")
    fracs = np.full(F, np.nan)
    with torch.no_grad():
        for batch in files:
            n = batch["mel"].shape[0]
            logits = model(batch["mel"].reshape(-1, 1, M, T) / 50).reshape(n, L, S)
            frac, _ = file_votes(logits, long_mask=batch["long_mask"])
            real = ~batch["is_pad"]
            fracs[batch["file_id"][real].numpy()] = frac[real].numpy()
        acc = VoteAccumulator(F, L)
        for batch in ShardStream(mel_cache, view="mel", batch_size=1000, seed=2, dtype="float32"):
            acc.update(model(batch["mel"] / 50)[:, 0], batch["file_id"], batch["long_index"], batch["is_pad"])
    frac2, _, windows = acc.result()
    assert (windows == L).all()
    np.testing.assert_allclose(frac2.numpy(), fracs, atol=1.5 / L)  # one window may flip on float rounding


# ----------------------------------------------------------------- (4) determinism and resume
def test_same_seed_same_batches_other_seed_differs(mel_cache):
    a = list(ShardStream(mel_cache, view="mel", batch_size=600, seed=4))
    b = list(ShardStream(mel_cache, view="mel", batch_size=600, seed=4))
    c = list(ShardStream(mel_cache, view="mel", batch_size=600, seed=5))
    assert len(a) == len(b) and all(batches_equal(x, y) for x, y in zip(a, b))
    assert not batches_equal(a[0], c[0])
    s = ShardStream(mel_cache, view="mel", batch_size=600, seed=4)
    s.set_epoch(1)
    assert not batches_equal(next(iter(s)), a[0])  # a new epoch, a new order


@pytest.mark.parametrize("workers_after", [0, 2])
def test_resume_mid_epoch_gives_the_remaining_batches(mel_cache, workers_after):
    def stream():
        return ShardStream(mel_cache, view="mel", batch_size=512, seed=6)

    ref = stream()
    ref.set_epoch(2)
    reference = list(ref)
    loader = make_loader(stream(), num_workers=0)
    loader.set_epoch(2)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (2, 3)
    fresh = make_loader(stream(), num_workers=workers_after, prefetch_factor=2, persistent_workers=False)
    fresh.load_state_dict(state)
    fresh.set_epoch(2)
    tail = list(fresh)
    assert len(head) + len(tail) == len(reference)
    assert all(batches_equal(x, y) for x, y in zip(head + tail, reference))
