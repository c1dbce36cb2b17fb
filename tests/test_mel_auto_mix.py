"""The ``mel`` view's default pools (``mix="auto"``: 64 MB of decoded files, at least 1,024) mix a cache of
the users' size like their i.i.d. sampler (thirteenth session).

Their trainer (``StatefulSampler``) permutes every segment index per epoch, so a batch of ``B`` segments
of ``F`` files x ``n`` segments draws from about ``F * (1 - (1 - 1/F) ** B)`` distinct files. Pools of
1,024 files (the default before) cap that at 1,024 and repeat each file's segments within a batch; at
the users' layout (10 KB a file) the default pool holds 6,553 files, so a cache of their size (~6,000
files) is one pool.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import CacheMismatchError
from loader_fixtures import build_mel_from_arrays
from loaders import ShardStream
from loaders.pools import DEFAULT_MIX, POOL_BYTES, auto_mix

FILES = 3000
BATCH = 4096


@pytest.fixture(scope="module")
def mel3k(tmp_path_factory) -> Path:
    return build_mel_from_arrays(tmp_path_factory.mktemp("mel3k") / "cache", FILES, seed=3)


def _distinct_files(stream: ShardStream) -> np.ndarray:
    return np.array([len(np.unique(b["file_id"][~b["is_pad"]].numpy())) for b in stream if not bool(b["is_pad"].any())])


def test_the_default_pool_holds_64_mb_of_files() -> None:
    per_file = 40 * 2 * 64 * 1 * 2  # the users' [40, 2, 64, 1] float16
    assert auto_mix(per_file) == POOL_BYTES // per_file == 6553
    assert auto_mix(200_000) == DEFAULT_MIX  # (big files: never fewer than 1,024 per pool)


def test_default_batches_span_as_many_files_as_an_iid_sampler(mel3k: Path) -> None:
    stream = ShardStream(mel3k, view="mel", batch_size=BATCH, seed=0)
    assert stream.config.view_options["mix"] == 6553
    iid = FILES * (1 - (1 - 1 / FILES) ** BATCH)  # ~2,237 distinct files of 3,000
    ours = _distinct_files(stream)
    assert abs(ours.mean() - iid) < 0.02 * iid, (ours.mean(), iid)
    small = _distinct_files(ShardStream(mel3k, view="mel", batch_size=BATCH, seed=0, mix=1024))
    assert small.mean() < 0.7 * iid  # what pools of 1,024 files gave (a pool's files, several segments each)


def test_float32_batches_and_waveforms_count_in_the_pool_bytes(mel3k: Path) -> None:
    assert ShardStream(mel3k, view="mel", batch_size=64, dtype="float32").config.view_options["mix"] == POOL_BYTES // (40 * 2 * 64 * 4)


def test_a_state_saved_with_pools_of_1024_files_names_mix_or_resumes_where_the_plan_is_the_same(mel3k: Path, tmp_path: Path) -> None:
    old = ShardStream(mel3k, view="mel", batch_size=BATCH, seed=1, mix=1024)
    it = iter(old)
    next(it)
    with pytest.raises(CacheMismatchError, match=r"another plan \(view_options: saved .*'mix': 1024.*now .*'mix': 6553.*\); pass mix=1024 to resume it"):
        ShardStream(mel3k, view="mel", batch_size=BATCH, seed=1).load_state_dict(old.state_dict())
    ShardStream(mel3k, view="mel", batch_size=BATCH, seed=1, mix=1024).load_state_dict(old.state_dict())  # (what the message says)
    small = build_mel_from_arrays(tmp_path / "small", 300, seed=4)  # at most 1,024 files: one pool either way
    old = ShardStream(small, view="mel", batch_size=512, seed=1, mix=1024)
    it = iter(old)
    next(it)
    state, rest = old.state_dict(), [b["file_id"].tolist() for b in it]
    new = ShardStream(small, view="mel", batch_size=512, seed=1)
    new.load_state_dict(state)
    assert [b["file_id"].tolist() for b in new] == rest


@pytest.mark.parametrize("bad", ["big", 0, 2.5, True])
def test_a_bad_mix_is_one_line(mel3k: Path, bad: object) -> None:
    with pytest.raises(ValueError, match=r"view 'mel': mix must be >= 1 .* got"):
        ShardStream(mel3k, view="mel", batch_size=64, mix=bad)
