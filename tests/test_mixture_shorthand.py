"""``ShardStream([a, b], weights=..., schedule=..., epoch_size=...)``, as issue 16 words it, is the
short form of ``ShardStream(Mixture([a, b], ...))``: the same batches, the same state; and a schedule
may be written ``{first_epoch: weights}`` or as ``((first, end), weights)`` tuples."""

from __future__ import annotations

import pytest

from cachebuild.errors import ConfigError
from loaders import Mixture, ShardStream, Stage
from mixture_fixtures import levels  # noqa: F401


def _epochs(stream: ShardStream, n: int) -> list[list[list[int]]]:
    return [[b["record_id"][~b["is_pad"]].tolist() for b in stream] for _ in range(n)]


def _pair(levels, spec: dict, **shorthand) -> tuple[ShardStream, ShardStream]:
    long = ShardStream(Mixture(levels, **spec), view="graphs", batch_size=16, seed=1)
    short = ShardStream(levels, view="graphs", batch_size=16, seed=1, **shorthand)
    return long, short


def test_weights_and_epoch_size_on_the_stream_make_the_same_mixture(levels) -> None:
    names = list(levels)
    spec = {"weights": {names[0]: 1, names[1]: 3}, "epoch_size": 120}
    long, short = _pair(levels, spec, **spec)
    assert _epochs(short, 2) == _epochs(long, 2)
    assert short.mixture is not None and short.fingerprint == long.fingerprint
    it = iter(short)
    next(it)
    state = short.state_dict()
    resumed = ShardStream(Mixture(levels, **spec), view="graphs", batch_size=16, seed=1)
    resumed.load_state_dict(state)
    assert [b["record_id"].tolist() for b in resumed] == [b["record_id"].tolist() for b in it]
    roots = list(levels.values())  # a list of roots, weights a list in order
    a = ShardStream(roots, view="graphs", batch_size=16, seed=1, weights=[1, 3, 0])
    b = ShardStream(Mixture(roots, weights=[1, 3, 0]), view="graphs", batch_size=16, seed=1)
    assert _epochs(a, 1) == _epochs(b, 1)


def test_a_schedule_as_a_dict_or_tuples_equals_the_stage_list(levels) -> None:
    names = list(levels)
    stages = [Stage((0, 1), {names[0]: 1}), Stage((1, None), {names[0]: 1, names[1]: 2})]
    long = ShardStream(Mixture(levels, schedule=stages), view="graphs", batch_size=16, seed=1)
    want = _epochs(long, 3)
    first_cache_records = ShardStream(levels[names[0]], view="graphs", batch_size=16).manifest.records
    assert all(i < first_cache_records for batch in want[0] for i in batch)  # epoch 0: the first cache only
    assert any(i >= first_cache_records for batch in want[1] for i in batch)
    by_dict = ShardStream(levels, view="graphs", batch_size=16, seed=1, schedule={0: {names[0]: 1}, 1: {names[0]: 1, names[1]: 2}})
    by_tuples = ShardStream(Mixture(levels, schedule=[((0, 1), {names[0]: 1}), ((1, None), {names[0]: 1, names[1]: 2})]), view="graphs", batch_size=16, seed=1)
    assert _epochs(by_dict, 3) == want and _epochs(by_tuples, 3) == want
    assert by_dict.fingerprint == long.fingerprint


def test_shorthand_misuse_is_one_clear_error(levels) -> None:
    one = next(iter(levels.values()))
    with pytest.raises(ConfigError, match="mix several caches"):
        ShardStream(one, view="graphs", weights=[1])
    with pytest.raises(ConfigError, match="beside a Mixture"):
        ShardStream(Mixture(levels), view="graphs", schedule={0: None})
    with pytest.raises(ConfigError, match="weight of cache"):
        ShardStream(levels, view="graphs", weights={n: -1 for n in levels})
    with pytest.raises(ConfigError, match="no stage"):
        ShardStream(levels, view="graphs", schedule={2: None})
