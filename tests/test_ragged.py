"""Variable-length records padded to the batch maximum: lengths, content, less padding, exactly once, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cachebuild import FunctionSource, build
from loaders import ShardStream
from loaders.ragged import padding_fraction, trim_to_batch_max

RECORDS = 400


def _states(rng: np.random.Generator, index: int, dim: int = 4) -> dict:
    """A trajectory of n states (mostly short, a few long: the users' sequence lengths)."""
    n = min(160, 1 + int(rng.exponential(10.0)))
    return {"states": rng.standard_normal((n, dim)).astype(np.float32), "n": np.array(n, dtype=np.int64)}


@pytest.fixture(scope="module")
def seq_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("seq") / "cache"
    build(FunctionSource.per_record(_states, {"states": "float32", "n": "int64"}), out, records=RECORDS, workers=1, shard_mb=0.02, progress=False)
    return out


def _stream(cache: Path) -> ShardStream:
    return ShardStream(cache, view="records", batch_size=32, shuffle=True, seed=4)


def test_batch_max_lengths_content_and_padding(seq_cache: Path) -> None:
    stream = _stream(seq_cache)
    stream.set_epoch(0)
    seen, cache_pad, batch_pad = [], [], []
    for batch in stream:
        t = trim_to_batch_max(batch)
        n = batch["n"].numpy()
        assert t["states_lengths"].tolist() == n.tolist()
        assert t["states"].shape == (32, int(n.max()), 4) and t["states_mask"].shape == (32, int(n.max()), 4)
        rows = torch.arange(t["states"].shape[1])[None, :] < t["states_lengths"][:, None]
        assert torch.equal(t["states_mask"][..., 0], rows)
        assert torch.equal(t["states"], batch["states"][:, : int(n.max())])
        assert not t["states"][~rows].any()  # zeros beyond each record's length
        shapes = batch["states_shape"].numpy()
        cache_pad.append(padding_fraction(shapes, batch["states"].shape[1:]))
        batch_pad.append(padding_fraction(shapes, t["states"].shape[1:]))
        seen.extend(batch["record_id"][~batch["is_pad"]].tolist())
    assert sorted(seen) == list(range(RECORDS))  # exactly once
    cache_mean, batch_mean = float(np.mean(cache_pad)), float(np.mean(batch_pad))
    assert batch_mean < cache_mean - 0.1, (cache_mean, batch_mean)


def test_trimmed_batches_resume(seq_cache: Path) -> None:
    ref = _stream(seq_cache)
    ref.set_epoch(1)
    expect = [trim_to_batch_max(b) for b in ref]
    first = _stream(seq_cache)
    first.set_epoch(1)
    it = iter(first)
    head = [trim_to_batch_max(next(it)) for _ in range(4)]
    state = first.state_dict()
    fresh = _stream(seq_cache)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    got = head + [trim_to_batch_max(b) for b in fresh]
    assert len(got) == len(expect)
    for a, b in zip(got, expect):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_trim_names_a_fixed_field(seq_cache: Path) -> None:
    batch = next(iter(_stream(seq_cache)))
    with pytest.raises(KeyError, match="'n' has no 'n_shape'"):
        trim_to_batch_max(batch, ["n"])
    arrays = {k: v.numpy() for k, v in batch.items()}
    assert trim_to_batch_max(arrays)["states"].shape[1] == int(arrays["n"].max())
