"""Mixing on label-sorted caches, as the users' own files are (thirteenth session, fidelity review).

The users' leak builder (``eviltwinkie/AILH_MASTER``, ``AI_DEV/dataset_builder.py``,
``_discover_records``) lists WAV files with ``os.walk`` over the label folders, so the
HDF5 files it writes hold all files of one label, then all of the next; ``--from-h5`` and
``--from-wav`` keep that order as record ids. Their trainer (``dataset_trainer.py``,
``StatefulSampler``) draws one permutation of *all* segment indices per epoch, so every
batch has the file-level label share up to binomial noise.

A plan that shuffles records within windows of 16 shards (``window=16``: the default
before the thirteenth session, and still the default for a remote cache) is, for a cache of
at most 16 shards, one window, a full shuffle (pinned below: the order equals
``window=None``). Beyond 16 shards, a window holds only the records of its shards, and on a
label-sorted cache its label share is that of the shards it drew: measured on a 31-shard
cache of 6,000 files (45% LEAK) at B=8,192, the per-batch LEAK share had sd 0.088 (0.27 to
0.61) with ``window=16``, 0.0115 with ``window=None`` and 0.0052 with their sampler. So the
default (``window="auto"``) is now a full shuffle for a local cache (docs/DECISIONS.md,
thirteenth session), pinned here on such a cache. Every other mixing test builds caches with i.i.d. labels, where windows cannot show this.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loaders import ShardStream
from loaders.plan import DEFAULT_WINDOW, epoch_order
from loaders.shard_window import resolve_window

FILES = 2048
LEAK_SHARE = 0.45
BATCH = 2048


@pytest.mark.parametrize("shards", [1, 2, 7, 16])
@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_default_window_is_a_full_shuffle_up_to_16_shards(shards: int, epoch: int) -> None:
    counts = np.random.default_rng(shards).integers(0, 400, size=shards)
    assert np.array_equal(epoch_order(counts, 3, epoch, True, DEFAULT_WINDOW), epoch_order(counts, 3, epoch, True, None))


def test_more_than_16_shards_are_shuffled_in_windows() -> None:
    counts = np.full(40, 50)
    order = epoch_order(counts, 3, 0, True, DEFAULT_WINDOW)
    shard = order // 50
    first = set(shard[: 16 * 50].tolist())
    assert len(first) == 16  # the first 800 records come from 16 shards only (the window)
    assert len(set((epoch_order(counts, 3, 0, True, None)[:800] // 50).tolist())) > 30


@pytest.fixture(scope="module")
def sorted_cache(tmp_path_factory) -> Path:
    """A cache of a file in the users' layout whose records are label-sorted (LEAK first), > 16 shards."""
    h5py = pytest.importorskip("h5py")
    from cachebuild.jobs import run_mel_build

    root = tmp_path_factory.mktemp("sorted")
    leak = int(FILES * LEAK_SHARE)
    labels = np.r_[np.zeros(leak), np.ones(FILES - leak)].astype(np.int16)
    with h5py.File(root / "sorted.h5", "w") as f:
        f.create_dataset("labels", data=labels)
        f.create_dataset("segments_mel", data=np.zeros((FILES, 40, 2, 64, 1), dtype=np.float16))
        f.attrs["labels_json"] = json.dumps(["LEAK", "NOLEAK"])
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})
    out = root / "cache"
    run_mel_build(None, [], {"build.shard_mb": 0.5, "build.codec": "none"}, out, from_h5=root / "sorted.h5", workers=1, progress=False)
    return out


def _leak_shares(cache: Path, window: int | str | None, epochs: int = 3, **view: object) -> np.ndarray:
    shares = []
    for epoch in range(epochs):
        for b in ShardStream(str(cache), view="mel", batch_size=BATCH, shuffle=True, seed=epoch, window=window, drop_last=True, **view):
            shares.append(float((b["label"].numpy() == 0).mean()))
    return np.array(shares)


def _their_shares(epochs: int = 3) -> np.ndarray:
    """Their StatefulSampler: ``default_rng(seed ^ epoch).permutation`` of every segment index."""
    leak = int(FILES * LEAK_SHARE)
    seg = np.repeat(np.r_[np.zeros(leak), np.ones(FILES - leak)], 80)
    shares = []
    for epoch in range(1, epochs + 1):
        lab = seg[np.random.default_rng(0 ^ epoch).permutation(seg.size)]
        shares += [float((lab[i : i + BATCH] == 0).mean()) for i in range(0, seg.size - BATCH + 1, BATCH)]
    return np.array(shares)


def test_sorted_cache_has_more_shards_than_a_window(sorted_cache: Path) -> None:
    manifest = json.loads((sorted_cache / "manifest.json").read_text())
    assert len(manifest["shards"]) > DEFAULT_WINDOW


def test_the_default_window_is_a_full_shuffle_for_a_local_cache(sorted_cache: Path) -> None:
    assert ShardStream(str(sorted_cache), view="mel", batch_size=BATCH).config.window is None
    assert ShardStream(str(sorted_cache), view="mel", batch_size=BATCH, window=4).config.window == 4
    assert resolve_window("auto", remote=True) == DEFAULT_WINDOW and resolve_window(None, remote=True) is None
    for bad in (0, -1, 2.5, True, "full"):
        with pytest.raises(ValueError, match="window must be >= 1 shards, None"):
            ShardStream(str(sorted_cache), view="mel", batch_size=BATCH, window=bad)


def test_a_remote_cache_keeps_16_shard_windows_by_default(sorted_cache: Path) -> None:
    from remote_fixtures import serve_folder

    with serve_folder(sorted_cache) as (url, _):
        assert ShardStream(url, view="mel", batch_size=BATCH).config.window == DEFAULT_WINDOW
        assert ShardStream(url, view="mel", batch_size=BATCH, window=None).config.window is None


def test_windows_of_16_shards_do_not_mix_a_sorted_cache(sorted_cache: Path) -> None:
    """Why the local default is a full shuffle: with ``window=16`` batches carry their shards' label share
    (with pools of 1,024 files; the default pool, 64 MB of files, holds this whole cache and mixes across windows)."""
    windowed, theirs = _leak_shares(sorted_cache, DEFAULT_WINDOW, epochs=2, mix=1024), _their_shares(epochs=2)
    assert windowed.std() > 3 * theirs.std(), (windowed.std(), theirs.std())


@pytest.mark.parametrize("window", ["auto", None])
def test_full_shuffle_mixes_labels_of_a_sorted_cache_like_their_sampler(sorted_cache: Path, window: str | None) -> None:
    ours, theirs = _leak_shares(sorted_cache, window), _their_shares()
    assert abs(ours.mean() - LEAK_SHARE) < 0.01
    # the default pool (64 MB of files: 6,553) holds the whole cache, as their permutation does (pools of
    # 1,024 files added their own sampling noise: sd 0.0142 vs their 0.0111)
    assert ours.std() < 1.3 * theirs.std(), (ours.std(), theirs.std())
    assert ours.min() > LEAK_SHARE - 0.08 and ours.max() < LEAK_SHARE + 0.08


def _ids(batch: dict) -> list:
    return batch["record_id"].tolist() if "record_id" in batch else (batch["file_id"] * 10_000 + batch["long_index"] * 100 + batch["short_index"]).tolist()


def _state_after(stream: ShardStream, batches: int) -> tuple[dict, list]:
    it = iter(stream)
    for _ in range(batches):
        next(it)
    return stream.state_dict(), [_ids(b) for b in it]


def test_a_state_saved_with_16_shard_windows_resumes_on_a_small_cache_under_the_new_default(toy_cache: Path) -> None:
    """Caches of at most 16 shards plan the same order with ``window=16`` (the old default) and ``None``."""
    assert len(json.loads((toy_cache / "manifest.json").read_text())["shards"]) <= DEFAULT_WINDOW
    state, rest = _state_after(ShardStream(str(toy_cache), batch_size=16, window=DEFAULT_WINDOW), 5)
    assert state["plan"]["window"] == DEFAULT_WINDOW
    resumed = ShardStream(str(toy_cache), batch_size=16)
    resumed.load_state_dict(state)
    assert [_ids(b) for b in resumed] == rest


def test_a_state_saved_with_16_shard_windows_on_a_larger_cache_names_the_window(sorted_cache: Path) -> None:
    from cachebuild.errors import CacheMismatchError

    state, rest = _state_after(ShardStream(str(sorted_cache), view="mel", batch_size=BATCH, window=DEFAULT_WINDOW), 2)
    with pytest.raises(CacheMismatchError, match=r"another plan \(window: saved 16, now None\)"):
        ShardStream(str(sorted_cache), view="mel", batch_size=BATCH).load_state_dict(state)
    again = ShardStream(str(sorted_cache), view="mel", batch_size=BATCH, window=DEFAULT_WINDOW)
    again.load_state_dict(state)
    assert [_ids(b) for b in again] == rest


def test_a_state_saved_on_the_local_cache_says_how_to_resume_it_over_http(sorted_cache: Path) -> None:
    """A run checkpointed on a local cache (``window="auto"``: one window) and resumed from the same cache
    served over HTTP (``"auto"``: 16-shard windows) was refused naming only ``window: saved None, now 16``,
    a setting the user never gave; the message says which window resumes it, and that one does."""
    from cachebuild.errors import CacheMismatchError
    from remote_fixtures import serve_folder

    state, rest = _state_after(ShardStream(str(sorted_cache), view="mel", batch_size=BATCH), 2)
    with serve_folder(sorted_cache) as (url, _):
        with pytest.raises(CacheMismatchError, match=r"\(window: saved None, now 16\); pass window=None to resume it \(the default window='auto'"):
            ShardStream(url, view="mel", batch_size=BATCH).load_state_dict(state)
        again = ShardStream(url, view="mel", batch_size=BATCH, window=None)
        again.load_state_dict(state)
        assert [_ids(b) for b in again] == rest
