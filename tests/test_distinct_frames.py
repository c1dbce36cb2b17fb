"""``distinct_frames``: the decoder decompresses each shared zstd frame once per block.

Checked against a dictionary walk over random blocks: every entry points at a frame to decode that
has its own (shard, offset); a shared frame is decoded once, at the first entry naming it; frames
come in block order; unshared entries (one entry per frame, repeated when a block repeats a record)
are each decoded.
"""

from __future__ import annotations

import numpy as np
import pytest

from cachebuild.format.shared_frames import distinct_frames


def _reference(shard: np.ndarray, offset: np.ndarray, shared: np.ndarray) -> tuple[list[int], list[int]]:
    pick: list[int] = []
    seen: dict[tuple[int, int], int] = {}
    slot = []
    for i, (s, o, sh) in enumerate(zip(shard.tolist(), offset.tolist(), shared.tolist())):
        if sh and (s, o) in seen:
            slot.append(seen[(s, o)])
            continue
        if sh:
            seen[(s, o)] = len(pick)
        slot.append(len(pick))
        pick.append(i)
    return pick, slot


@pytest.mark.parametrize("seed", range(12))
def test_distinct_frames_equal_a_dictionary_walk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    shard = rng.integers(0, 3, n)
    shared = rng.random(n) < [0.0, 0.3, 0.8, 1.0][seed % 4]
    # shared entries draw from few frames (so they repeat); unshared from their own offsets, a few repeated
    offset = np.where(shared, rng.integers(0, 4, n) * 1000, 10_000 + rng.integers(0, max(n, 1), n))
    pick, slot = distinct_frames(shard, offset, shared)
    want_pick, want_slot = _reference(shard, offset, shared)
    assert pick.tolist() == want_pick
    assert slot.tolist() == want_slot
    assert (shard[pick[slot]] == shard).all() and (offset[pick[slot]] == offset).all()
