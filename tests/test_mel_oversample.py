"""Class oversampling in the ``mel`` view (``oversample={"LEAK": 2}``), as the users' leak trainer's
``leak_oversample_factor``: its ``build_indices`` repeats every LEAK segment index ``factor`` times
before shuffling, so an epoch holds each LEAK segment ``factor`` times and every other segment once.
Checked against that rule on the segments the loader yields (0 and 2 workers, two epochs), plus
resume, bad options and mixtures."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from cachebuild.errors import CacheMismatchError, ConfigError
from loader_fixtures import all_batches_equal, build_mel_from_arrays
from loaders import ShardStream, make_loader

FILES = 120


@pytest.fixture(scope="module")
def mel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mel_from_arrays(tmp_path_factory.mktemp("oversample") / "c", files=FILES, shard_mb=0.5)


def _stream(root: Path, **kw) -> ShardStream:
    return ShardStream(root, view="mel", batch_size=256, shuffle=True, seed=4, mix=32, **kw)


def _batches(loader, epoch: int) -> list[dict]:
    loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def _their_epoch(labels: dict[int, int], segments: int, leak: int, factor: int) -> collections.Counter:
    """The users' ``build_indices`` rule: every (file, segment) index once, LEAK ones ``factor`` times."""
    return collections.Counter({(f, k): (factor if y == leak else 1) for f, y in labels.items() for k in range(segments)})


def _read(batches: list[dict], num_short: int) -> tuple[collections.Counter, dict[int, int]]:
    seen: collections.Counter = collections.Counter()
    labels: dict[int, int] = {}
    for b in batches:
        real = ~b["is_pad"]
        files, longs, shorts, ys = (b[k][real].tolist() for k in ("file_id", "long_index", "short_index", "label"))
        for f, lo, sh, y in zip(files, longs, shorts, ys):
            seen[(f, lo * num_short + sh)] += 1
            labels[f] = y
    return seen, labels


@pytest.mark.parametrize("workers", [0, 2])
def test_leak_segments_are_read_factor_times_per_epoch(mel: Path, workers: int) -> None:
    loader = make_loader(_stream(mel, oversample={"LEAK": 3}), num_workers=workers)
    for epoch in (0, 1):
        seen, labels = _read(_batches(loader, epoch), num_short=2)
        assert len(labels) == FILES and set(labels.values()) == {0, 1}
        assert seen == _their_epoch(labels, 80, leak=0, factor=3)


def test_oversampled_batches_do_not_depend_on_workers_and_resume_exactly(mel: Path) -> None:
    want = _batches(make_loader(_stream(mel, oversample={"LEAK": 2}), num_workers=0), 1)
    assert all_batches_equal(want, _batches(make_loader(_stream(mel, oversample={"LEAK": 2}), num_workers=2), 1))
    first = make_loader(_stream(mel, oversample={"LEAK": 2}), num_workers=0)
    first.set_epoch(1)
    it = iter(first)
    head = [{k: v.clone() for k, v in next(it).items()} for _ in range(5)]
    state = first.state_dict()
    resumed = make_loader(_stream(mel, oversample={"LEAK": 2}), num_workers=2)
    resumed.load_state_dict(state)
    tail = [{k: v.clone() for k, v in b.items()} for b in resumed]
    assert all_batches_equal(want, head + tail)
    plain = make_loader(_stream(mel), num_workers=0)
    with pytest.raises(CacheMismatchError, match="another plan.*oversample"):
        plain.load_state_dict(state)


def test_default_mixing_pools_hold_the_repeated_files(mel: Path) -> None:
    """At the default ``mix`` (pools larger than the cache) a batch spans more file copies than the
    cache has files: the view's per-batch bound counts copies (it said "spans 132 files, more than
    the planned 120")."""
    stream = ShardStream(mel, view="mel", batch_size=256, shuffle=True, seed=4, oversample={"LEAK": 2})
    seen, labels = _read([{k: v.clone() for k, v in b.items()} for b in make_loader(stream, num_workers=0)], num_short=2)
    assert seen == _their_epoch(labels, 80, leak=0, factor=2)


def test_labels_by_id_and_factor_one(mel: Path) -> None:
    by_name = _batches(make_loader(_stream(mel, oversample={"NOLEAK": 2}), num_workers=0), 0)
    by_id = _batches(make_loader(_stream(mel, oversample={1: 2}), num_workers=0), 0)
    assert all_batches_equal(by_name, by_id)
    assert all_batches_equal(_batches(make_loader(_stream(mel, oversample={"LEAK": 1}), num_workers=0), 0), _batches(make_loader(_stream(mel), num_workers=0), 0))


@pytest.mark.parametrize(
    "option,words",
    [
        ({"CRACK": 2}, ["'CRACK'", "'LEAK' (0)", "'NOLEAK' (1)"]),
        ({"LEAK": 0}, ["oversample['LEAK'] = 0", "whole number"]),
        ({"LEAK": 1.5}, ["oversample['LEAK'] = 1.5"]),
        ({"LEAK": True}, ["oversample['LEAK'] = True"]),
        (["LEAK"], ["must be a dict"]),
        ({7: 2}, ["key 7 is not a label", "'LEAK' (0)"]),  # an id outside the cache's label table: it oversampled nothing, silently
    ],
)
def test_bad_oversample_options_are_named(mel: Path, option: object, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _stream(mel, oversample=option)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_mixture_is_refused(mel: Path) -> None:
    from loaders import Mixture

    with pytest.raises(ConfigError, match="weights="):
        ShardStream(Mixture({"a": mel, "b": mel}), view="mel", batch_size=256, oversample={"LEAK": 2})


def test_the_mel_files_view_refuses_oversample_naming_it(mel: Path) -> None:
    """Whole files (``mel_files``) take no ``oversample``: the error names that option alone, not
    every option given (it listed ``dtype`` too), and says what the view takes."""
    with pytest.raises(TypeError) as info:
        ShardStream(mel, view="mel_files", batch_size=8, dtype="float16", oversample={"LEAK": 2})
    assert "['oversample']" in str(info.value) and "it takes: dtype, waveform" in str(info.value), str(info.value)
