"""Review as a new user (2026-11-24): loader mistakes a newcomer plausibly makes get one clear line.

The users' own trainers build ``DataLoader(dataset, batch_size=args.batch_size, ...)``; given a
``ShardStream`` (which makes whole batches) that used to stack batches silently into
``[n, batch_size, ...]`` (``[1, batch_size, ...]`` with DataLoader's default ``batch_size=1``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cachebuild import FunctionSource, build
from cachebuild.errors import CacheMismatchError
from loader_fixtures import build_causal
from loaders import ShardStream

BATCH = 16


def _record(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(4).astype(np.float32), "y": np.array(index, dtype=np.int64)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("newuser") / "cache"
    build(FunctionSource.per_record(_record, {"x": "float32", "y": "int64"}), out, records=100, workers=1, progress=False)
    return out


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": 4}], ids=["default-batch_size", "batch_size-4"])
def test_dataloader_with_a_batch_size_is_refused_in_one_line(cache, kwargs):
    loader = DataLoader(ShardStream(cache, view="records", batch_size=BATCH), **kwargs)
    n = kwargs.get("batch_size", 1)
    with pytest.raises(
        TypeError, match=rf"^a DataLoader with a batch_size would stack {n} of a ShardStream's batches into one \[{n}, batch_size, \.\.\.\] .* pass DataLoader\(stream, batch_size=None\)"
    ) as info:
        next(iter(loader))
    assert "\n" not in str(info.value)


def test_dataloader_with_a_batch_size_is_refused_from_a_worker(cache):
    loader = DataLoader(ShardStream(cache, view="records", batch_size=BATCH), batch_size=4, num_workers=1)
    with pytest.raises(TypeError, match=r"would stack 4 of a ShardStream's batches into one \[4, batch_size.*batch_size=None"):
        next(iter(loader))


def test_dataloader_with_batch_size_none_still_yields_the_streams_batches(cache):
    batch = next(iter(DataLoader(ShardStream(cache, view="records", batch_size=BATCH), batch_size=None)))
    assert batch["x"].shape == (BATCH, 4) and batch["y"].dtype == torch.int64
    # a user's own collate_fn is theirs to keep: only the default collate is refused
    pairs = next(iter(DataLoader(ShardStream(cache, view="records", batch_size=BATCH), batch_size=2, collate_fn=list)))
    assert len(pairs) == 2 and pairs[0]["x"].shape == (BATCH, 4)


def test_resume_into_another_view_gives_no_mix_hint(tmp_path):
    """A state saved under one view, loaded into another: the message names the views and does not
    suggest ``mix=`` (which cannot make a ``graphs`` state load into a ``twins`` stream)."""
    causal = build_causal(tmp_path / "causal", graphs=20)
    saved = ShardStream(causal, view="graphs", batch_size=4, seed=0)
    next(iter(saved))
    state = saved.state_dict()
    with pytest.raises(CacheMismatchError, match=r"view: saved 'graphs', now 'twins'") as info:
        ShardStream(causal, view="twins", batch_size=64, seed=0).load_state_dict(state)
    assert "mix=" not in str(info.value)


def _users_h5(path: Path, files: int = 4) -> Path:
    """The users' layout as their builder writes it: labels, stored mels, the label mapping."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.array([0, 1] * (files // 2), np.int16))
        f.create_dataset("segments_mel", data=np.zeros((files, 40, 2, 64, 1), np.float16))
        f.attrs["label2id_json"] = '{"LEAK": 0, "NOLEAK": 1}'
    return path


@pytest.mark.parametrize("name", ["lab", ""])
def test_h5_labels_dataset_not_found_names_flag_and_the_files_datasets(tmp_path, name):
    """Like a renamed mel or waveform dataset (was: ``no labels dataset 'lab'`` and nothing more)."""
    from cachebuild.errors import SourceError
    from cachebuild.mel.config import MelConfig
    from cachebuild.mel.h5 import H5Source

    path = _users_h5(tmp_path / "leaks.h5")
    with pytest.raises(SourceError, match=rf"^{path}: no labels dataset '{name}' \(--h5-dataset labels=NAME names it\); the file has: labels, segments_mel$"):
        H5Source(path, MelConfig(), datasets={"labels": name})


@pytest.mark.parametrize("epoch", ["1", 1.0, None, True])
def test_set_epoch_takes_whole_numbers_only(cache, epoch):
    """``set_epoch("1")`` (an epoch read from a command line) was a ``'<' not supported`` TypeError."""
    with pytest.raises(ValueError, match=rf"^epoch must be a whole number, got {re.escape(repr(epoch))}$"):
        ShardStream(cache, view="records", batch_size=BATCH).set_epoch(epoch)
    stream = ShardStream(cache, view="records", batch_size=BATCH)
    stream.set_epoch(np.int64(3))
    next(iter(stream))
    assert stream.epoch == 3


def test_a_recipe_with_params_against_a_cache_without_names_the_param_only():
    """README's ``python mydata.py`` (a source without params), then ``cachebuild build --config mine.toml
    --append`` (``[params] length = 64``): the refusal said ``config.params: cache {}, this build (not set)``
    next to ``config.params.length: cache (not set), this build 64``, as if the build had no params."""
    from cachebuild.builder.mismatch import describe_differences

    cache = {"config": {"params": {}, "fn": "mydata:impulse"}, "seed": 0}
    this = {"config": {"params": {"length": 64}, "fn": "mydata:impulse"}, "seed": 0}
    assert describe_differences(cache, this) == "config.params.length: cache (not set), this build 64"
    assert describe_differences(this, cache) == "config.params.length: cache 64, this build (not set)"
    assert describe_differences({"config": {"params": {}}}, {"config": {"params": 3}}) == "config.params: cache {}, this build 3"


def test_missing_h5_file_or_wav_folder_is_a_short_line(tmp_path):
    """A typo in ``--from-h5`` gave h5py's five clauses of C error state; in ``--from-wav``, "not a directory"."""
    for args, line in (
        (["--from-h5", str(tmp_path / "leaks.h5")], f"error: {tmp_path / 'leaks.h5'}: no such file\n"),
        (["--from-wav", str(tmp_path / "data")], f"error: {tmp_path / 'data'}: no such folder\n"),
    ):
        proc = subprocess.run([sys.executable, "-m", "cachebuild", "mel", *args, "--out", str(tmp_path / "cache"), "-q"], capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stderr) == (6, line)


def test_a_file_given_for_the_cache_names_its_folder(cache, tmp_path):
    """``ShardStream("cache/x/manifest.json")`` said ``cannot read cache/x/manifest.json/manifest.json: Not a directory``."""
    from cachebuild.errors import ManifestError

    for name in ("manifest.json", "shard-00000.tar"):
        with pytest.raises(ManifestError, match=rf"^{re.escape(str(cache / name))} is a file, not a cache folder: pass its folder, {re.escape(str(cache))}$"):
            ShardStream(cache / name, view="records", batch_size=BATCH)
    (tmp_path / "leaks.h5").write_bytes(b"")
    with pytest.raises(ManifestError, match=r"leaks.h5 is a file, not a cache folder \(a cache is a folder holding manifest.json\)$"):
        ShardStream(tmp_path / "leaks.h5", view="records", batch_size=BATCH)


@pytest.mark.parametrize("remote", [{"cache_dir": "/tmp/x"}, "/tmp/x", True])
def test_remote_options_of_another_type_are_one_line(cache, remote):
    """``remote={"cache_dir": ...}`` on an http:// cache was an ``AttributeError`` in the first fetch."""
    with pytest.raises(TypeError, match=r"^remote must be a loaders.remote.RemoteOptions or None, got (dict|str|bool) .*: pass remote=RemoteOptions\("):
        ShardStream("http://127.0.0.1:9/cache", view="records", batch_size=BATCH, remote=remote)
    with pytest.raises(TypeError, match=r"^remote must be"):  # refused for a local cache too, not ignored
        ShardStream(cache, view="records", batch_size=BATCH, remote=remote)


def test_rerun_on_a_rewritten_input_notes_it(tmp_path):
    """A same-shape rewrite of the HDF5 file left the rerun at "nothing to do", silently stale."""
    h5 = _users_h5(tmp_path / "leaks.h5")
    recipe = {"kind": "mel", "source": {"h5": str(h5)}}
    out = tmp_path / "cache"
    build(recipe, out, workers=1, progress=False)
    again = build(recipe, out, workers=1, progress=False).lines()
    assert again[0].endswith("nothing to do") and not any("modified" in line for line in again)
    later = os.stat(out / "manifest.json").st_mtime_ns + 10**9
    os.utime(h5, ns=(later, later))
    lines = build(recipe, out, workers=1, progress=False).lines()
    assert lines[0].endswith("nothing to do")
    assert f"note: {h5} modified after this cache was built (its shape still matches the recipe, so nothing was rebuilt); pass --overwrite to rebuild from it" in lines
