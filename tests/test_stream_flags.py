"""``shuffle`` and ``drop_last`` take a boolean, not any truthy value.

The review of 2026-11-24 (thirteenth session) passed ``shuffle="no"`` (as a value read from a
command line or a YAML file arrives): the stream shuffled, silently, since ``"no"`` is truthy;
``drop_last="yes"`` likewise. Now a value that is not a boolean (or 0/1) is one
``ValueError`` naming the argument and the value; numpy booleans and 0/1 still work.
And numpy integers for ``batch_size``/``seed``/``window`` (accepted) no longer break
``state_dict()`` (its JSON).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import build_toy
from loaders import Mixture, ShardStream, make_loader


@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
@pytest.mark.parametrize("value", ["no", "False", None, 2, 0.0])
def test_a_non_boolean_flag_is_refused(toy_cache, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be True or False, got {value!r}"):
        ShardStream(toy_cache, view="records", batch_size=64, **{name: value})


def _ids(stream):
    return np.concatenate([b["record_id"].numpy() for b in stream])


@pytest.mark.parametrize("value", [np.bool_(False), 0])
def test_numpy_booleans_and_0_1_are_booleans(toy_cache, value):
    plain = _ids(ShardStream(toy_cache, view="records", batch_size=64, shuffle=False))
    assert np.array_equal(_ids(ShardStream(toy_cache, view="records", batch_size=64, shuffle=value)), plain)
    assert np.array_equal(plain[:600], np.arange(600))


def test_numpy_numbers_give_a_state_that_is_json_and_resumes(toy_cache):
    """``batch_size=np.int64(64)`` (a size computed with numpy) was accepted, but ``state_dict()``
    then raised ``TypeError: Object of type int64 is not JSON serializable``: a crash at the first
    checkpoint. The plan now stores plain ints; the state is JSON and resumes in a plain stream."""
    odd = dict(batch_size=np.int64(64), seed=np.int64(3), window=np.int32(2), shuffle=np.bool_(True))
    stream = ShardStream(toy_cache, view="records", **odd)
    loader = make_loader(stream, num_workers=0)
    it = iter(loader)
    first = [next(it)["record_id"].clone() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["record_id"] for b in it]
    fresh = make_loader(ShardStream(toy_cache, view="records", batch_size=64, seed=3, window=2), num_workers=0)
    fresh.load_state_dict(state)
    again = [b["record_id"] for b in fresh]
    assert len(first) + len(rest) == len(fresh) and len(again) == len(rest)
    assert all(torch.equal(a, b) for a, b in zip(again, rest))


def test_a_mixture_epoch_size_from_numpy_gives_a_json_state(tmp_path):
    """``Mixture(..., epoch_size=np.int64(900))`` was accepted, then ``state_dict()`` raised the same
    ``TypeError`` (the stage's epoch size went into the state as it was given)."""
    caches = []
    for i in range(2):
        caches.append(tmp_path / f"c{i}")
        build_toy(caches[-1], records=300, seed=i)
    mix = Mixture({"a": str(caches[0]), "b": str(caches[1])}, weights={"a": 1, "b": 2}, epoch_size=np.int64(450))
    loader = make_loader(ShardStream(mix, view="records", batch_size=64), num_workers=0)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = make_loader(ShardStream(Mixture({"a": str(caches[0]), "b": str(caches[1])}, weights={"a": 1, "b": 2}, epoch_size=450), view="records", batch_size=64), num_workers=0)
    fresh.load_state_dict(state)
    assert sum(1 for _ in fresh) == len(fresh) - 1


def test_fields_given_as_one_string_is_refused_by_name(toy_cache):
    """``fields="mat"`` read as the fields 'm', 'a', 't' ("needs field(s) ['m', 'a', 't']")."""
    with pytest.raises(ValueError, match=r"fields must be a list of field names, got the string 'mat' \(write \['mat'\]\)"):
        ShardStream(toy_cache, view="records", batch_size=64, fields="mat")
