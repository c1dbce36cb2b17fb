"""The ``records`` view's pooled mode (``mix=``): whole shared zstd frames per pool, decoded once, same records.

What it must keep (DESIGN's promises): every record exactly once per epoch, the values of each record
(checked against records read one by one with ``tarfile`` + ``zstd``, :class:`loader_fixtures.Reference`),
zero padding and masks, the same batches at any worker count, exact resume, and a plan that is a pure
function of (seed, epoch). What it trades, by design: a batch draws from its pool (``mix`` records,
whole frames), not from the whole cache; the tests pin that down too, so a change to it is seen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import ConfigError
from cachebuild.format.reader import open_cache
from cachebuild.format.segments import Segments
from loader_fixtures import Reference, padded
from loaders import ShardStream, make_loader
from loaders.frame_order import block_order, frame_blocks

MAX_LEN = 120
PACK = 32


def _record(rng: np.random.Generator, index: int) -> dict:
    # a ragged 1-d field (Segments), a ragged 2-d one (runs), and a fixed-shape label
    n = int(rng.integers(0, MAX_LEN + 1))
    k = int(rng.integers(1, 5))
    return {
        "tok": rng.integers(-(2**31), 2**31 - 1, size=n).astype(np.int32),
        "box": rng.normal(size=(k, 3)).astype(np.float32),
        "lab": np.array(index % 7, np.int16),
    }


FIELDS = {"tok": "int32", "box": "float32", "lab": "int16"}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Members of 32 records whose entries share frames of up to 2 KiB (~8 records), several shards (the last members short)."""
    root = tmp_path_factory.mktemp("pooled") / "shared"
    build(FunctionSource.per_record(_record, FIELDS), root, records=1000, workers=1, shard_mb=0.1, pack=PACK, share=2048, progress=False)
    return root


@pytest.fixture(scope="module")
def plain_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One member per record and field (pack 1): pools still work, members are single records."""
    root = tmp_path_factory.mktemp("pooled") / "plain"
    build(FunctionSource.per_record(_record, FIELDS), root, records=300, workers=1, shard_mb=0.05, pack=1, progress=False)
    return root


def _epoch(stream: ShardStream, workers: int = 0) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy().copy() for k, v in b.items()} for b in make_loader(stream, num_workers=workers)]


def _check_rows(batches: list[dict[str, np.ndarray]], ref: Reference, masks: bool = True) -> None:
    for b in batches:
        for i, rid in enumerate(b["record_id"].tolist()):
            want = ref.record(rid)
            assert b["tok"][i].tobytes() == padded(want["tok"], (MAX_LEN,)).tobytes(), rid
            assert b["box"][i].tobytes() == padded(want["box"], (4, 3)).tobytes(), rid
            assert int(b["lab"][i]) == int(want["lab"])
            assert b["tok_shape"][i].tolist() == [len(want["tok"])] and b["box_shape"][i].tolist() == list(want["box"].shape)
            if masks:
                assert np.array_equal(b["tok_mask"][i], np.arange(MAX_LEN) < len(want["tok"]))
                assert b["box_mask"][i].sum() == want["box"].size
            else:
                assert "tok_mask" not in b


def test_the_cache_shares_frames_across_records(shared_cache: Path) -> None:
    with open_cache(shared_cache) as shards:
        assert shards.manifest.codec.share == 2048 and len(shards.manifest.shards) > 2
        assert any(shards.layout(s).shared[:, shards.field_pos["tok"]].any() for s in range(len(shards.manifest.shards)))


@pytest.mark.parametrize("masks", [True, False])
def test_two_epochs_hold_every_record_once_with_its_values(shared_cache: Path, masks: bool) -> None:
    ref = Reference(shared_cache)
    stream = ShardStream(shared_cache, view="records", batch_size=48, seed=3, mix=200, masks=masks)
    for epoch in range(2):
        stream.set_epoch(epoch)
        batches = _epoch(stream)
        real = np.concatenate([b["record_id"][~b["is_pad"]] for b in batches])
        assert sorted(real.tolist()) == list(range(1000))
        _check_rows(batches, ref, masks)  # (pools' rows are reused between pools: stale bytes must never show)


def _blocks(root: Path) -> np.ndarray:
    with open_cache(root) as shards:
        return frame_blocks(shards, "tok")


def test_each_record_is_decoded_once_per_epoch_and_pools_hold_whole_frames(shared_cache: Path) -> None:
    stream = ShardStream(shared_cache, view="records", batch_size=64, seed=1, mix=256)
    _epoch(stream)
    plan = stream.plan()
    # (the last batch's padding wraps to pool 0, still decoded: decoding ahead keeps the epoch's first pool
    # while a region is free; the next epoch's first pool, decoded ahead, is counted when it is used)
    assert stream.view.store.decodes == 1000
    block = _blocks(shared_cache)[plan.order]
    assert (np.diff(block) != 0).sum() == len(np.unique(block)) - 1  # each frame's records consecutive in the epoch order
    for q in range(len(plan.pools) - 1):  # a pool's frames: at most the two at its ends are cut
        lo, hi = int(plan.pools[q]), int(plan.pools[q + 1])
        inside = np.unique(block[lo:hi])
        cut = [m for m in inside.tolist() if np.count_nonzero(block == m) != np.count_nonzero(block[lo:hi] == m)]
        assert len(cut) <= 2


def test_a_batch_draws_from_its_pool_and_a_pool_from_the_whole_cache(shared_cache: Path) -> None:
    stream = ShardStream(shared_cache, view="records", batch_size=64, seed=7, mix=320)
    plan = stream.plan()
    blocks = _blocks(shared_cache)
    frames = len(np.unique(blocks))
    assert frames >= 100  # (~8 records a frame)
    pool_of = np.searchsorted(plan.pools, np.argsort(plan.order), side="right") - 1  # pool of each record id
    for b in _epoch(stream)[:-1]:
        rid = b["record_id"]
        assert len(np.unique(pool_of[rid])) <= 2  # the batch's pool (and the next, where it straddles)
        assert len(np.unique(blocks[rid])) >= 20  # a batch of 64 spans many frames of its pool
    first = blocks[plan.order[: int(plan.pools[1])]]
    assert len(np.unique(first)) < frames // 2  # a pool is a part of the cache...
    with open_cache(shared_cache) as shards:
        shard_of = np.searchsorted(shards.starts[1:], plan.order[: int(plan.pools[1])], side="right")
    assert len(np.unique(shard_of)) == len(np.diff(_starts(shared_cache)))  # ...drawn from all of its shards


def _starts(root: Path) -> np.ndarray:
    with open_cache(root) as shards:
        return np.asarray(shards.starts)


def test_workers_get_the_same_batches_and_share_pool_decodes(shared_cache: Path) -> None:
    stream = ShardStream(shared_cache, view="records", batch_size=40, seed=11, mix=150)
    zero = _epoch(stream, 0)
    two = _epoch(ShardStream(shared_cache, view="records", batch_size=40, seed=11, mix=150), 2)
    assert len(zero) == len(two)
    for a, b in zip(zero, two):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_plan_is_seeded_and_differs_by_epoch_and_seed(shared_cache: Path) -> None:
    def order(seed: int, epoch: int) -> np.ndarray:
        s = ShardStream(shared_cache, view="records", batch_size=50, seed=seed, mix=200)
        s.set_epoch(epoch)
        return np.concatenate([b["record_id"] for b in _epoch(s)])

    assert np.array_equal(order(2, 0), order(2, 0))
    assert not np.array_equal(order(2, 0), order(2, 1)) and not np.array_equal(order(2, 0), order(3, 0))


def test_resume_mid_epoch_continues_with_the_same_batches(shared_cache: Path) -> None:
    full = _epoch(ShardStream(shared_cache, view="records", batch_size=32, seed=4, mix=128))
    stream = ShardStream(shared_cache, view="records", batch_size=32, seed=4, mix=128)
    loader = make_loader(stream, num_workers=0)
    it = iter(loader)
    for _ in range(9):
        next(it)
    state = loader.state_dict()
    del it
    again = ShardStream(shared_cache, view="records", batch_size=32, seed=4, mix=128)
    resumed = make_loader(again, num_workers=0)
    resumed.load_state_dict(state)
    rest = [{k: v.numpy() for k, v in b.items()} for b in resumed]
    assert len(rest) == len(full) - 9
    for a, b in zip(full[9:], rest):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_state_of_the_unpooled_plan_does_not_load_into_a_pooled_stream(shared_cache: Path) -> None:
    loader = make_loader(ShardStream(shared_cache, view="records", batch_size=32, seed=4), num_workers=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    pooled = make_loader(ShardStream(shared_cache, view="records", batch_size=32, seed=4, mix=128), num_workers=0)
    with pytest.raises(Exception, match="mix"):
        pooled.load_state_dict(state)


def test_without_shuffle_and_with_pack_one_the_records_come_in_order(shared_cache: Path, plain_cache: Path) -> None:
    ordered = _epoch(ShardStream(shared_cache, view="records", batch_size=64, shuffle=False, mix=200))
    assert np.concatenate([b["record_id"] for b in ordered])[:1000].tolist() == list(range(1000))
    _check_rows(ordered, Reference(shared_cache))
    stream = ShardStream(plain_cache, view="records", batch_size=30, seed=2, mix=100)
    batches = _epoch(stream)
    assert sorted(np.concatenate([b["record_id"][~b["is_pad"]] for b in batches]).tolist()) == list(range(300))
    _check_rows(batches, Reference(plain_cache))


def test_auto_mix_sizes_pools_by_padded_bytes(shared_cache: Path) -> None:
    view = ShardStream(shared_cache, view="records", batch_size=32, mix="auto").view
    padded_bytes = MAX_LEN * 4 + 4 * 3 * 4 + 2 + 8 * 3
    assert view.mix == max(1024, (64 << 20) // padded_bytes)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"mix": "all"}, "mix must be"),
        ({"mix": 0}, "mix must be"),
        ({"mix": True}, "mix must be"),
        ({"mix": 100, "bucket_by": "tok"}, "cannot be combined"),
    ],
)
def test_bad_mix_options_are_one_line_errors(shared_cache: Path, options: dict, match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match) as err:
        ShardStream(shared_cache, view="records", batch_size=32, **options)
    assert "\n" not in str(err.value)


def test_block_order_keeps_blocks_together_in_first_seen_order() -> None:
    block = np.array([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 5, 5, 6, 6])
    rng = np.random.default_rng(0)
    for _ in range(20):
        order = rng.permutation(15)
        out = block_order(order, block)
        assert sorted(out.tolist()) == list(range(15))
        of = block[out]
        assert (np.diff(of) != 0).sum() == len(np.unique(of)) - 1  # consecutive
        first_seen = list(dict.fromkeys(block[order].tolist()))
        assert list(dict.fromkeys(of.tolist())) == first_seen  # in the order of their first record's place
        for m in range(7):
            assert np.array_equal(out[of == m], np.flatnonzero(block == m))  # stored order inside
    assert np.array_equal(block_order(order, np.arange(15)), order)  # every record its own block: unchanged


def test_frame_blocks_follow_the_shared_frames(shared_cache: Path, plain_cache: Path) -> None:
    blocks = _blocks(shared_cache)
    with open_cache(shared_cache) as shards:
        offsets = np.concatenate([shards.index(s)[:, shards.field_pos["tok"]]["offset"] for s in range(len(shards.manifest.shards))])
        starts = np.asarray(shards.starts)
    same = offsets[1:] == offsets[:-1]
    same[starts[1:-1] - 1] = False  # (a new shard starts a block)
    assert np.array_equal(np.diff(blocks) == 0, same)
    assert len(np.unique(blocks)) < len(blocks) // 3  # frames hold several records
    assert np.array_equal(_blocks(plain_cache), np.arange(300))  # no shared frames: a block per record


def test_scatter_windows_writes_each_record_at_its_row_start() -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 30, 50)
    buffers = [rng.normal(size=int(lengths.sum()) + 7).astype(np.float32) for _ in range(2)]
    buf = rng.integers(0, 2, 50)
    start = np.zeros(50, np.int64)
    for b in (0, 1):
        sel = np.flatnonzero(buf == b)
        start[sel] = np.cumsum(lengths[sel]) - lengths[sel]
    seg = Segments(rng.permutation(50), buf, start, lengths, buffers)
    for dest in (np.arange(50) + 10, rng.permutation(200)[:50]):  # consecutive rows, scattered rows
        out = np.full((200, 30), np.nan, np.float32)
        seg.scatter_windows(out, dest, slab=7)
        for i in range(50):
            row, b, s, n = int(dest[seg.rows[i]]), int(buf[i]), int(start[i]), int(lengths[i])
            assert np.array_equal(out[row, :n], buffers[b][s : s + n])


@pytest.mark.parametrize("room", [10_000, None])
def test_pack_into_writes_each_record_where_it_says(room: int | None) -> None:
    rng = np.random.default_rng(8)
    lengths = rng.integers(0, 20, 40)
    buffers = [rng.integers(0, 1000, int(lengths.sum()) + 5).astype(np.int32) for _ in range(3)]
    buf = rng.integers(0, 3, 40)
    start = np.zeros(40, np.int64)
    for b in range(3):
        sel = np.flatnonzero(buf == b)
        start[sel] = np.cumsum(lengths[sel]) - lengths[sel]
    rows = rng.permutation(40)
    seg = Segments(rows, buf, start, lengths, buffers)
    out = np.full(10_100, -1, np.int32)
    tight = int(lengths.sum())  # (None: room for the records only, not the buffers: packed back to back)
    at = seg.pack_into(out, 17, room or tight)
    for i in range(40):
        r, n = int(rows[i]), int(lengths[i])
        assert np.array_equal(out[at[r] : at[r] + n], buffers[buf[i]][start[i] : start[i] + n])
    used = sum(len(b) for b in buffers) if room else tight
    assert (out[:17] == -1).all() and (out[17 + used :] == -1).all()
    if room is None:
        by_row = np.argsort(rows)
        assert at.tolist() == (17 + np.cumsum(lengths[by_row]) - lengths[by_row]).tolist()


def test_a_flat_row_at_the_very_end_of_the_store_is_read_whole() -> None:
    from loaders.views.records_pool import _read_flat

    flat = np.arange(100, dtype=np.int32) + 1
    at, length = np.array([0, 90, 97, 50]), np.array([10, 10, 3, 0])  # the widest window (10) from 97 would leave the array
    out = np.full((4, 12), -1, np.int32)
    mask = np.arange(12)[None, :] < length[:, None]
    _read_flat(flat, at, length, out, mask)
    for i in range(4):
        want = np.zeros(12, np.int32)
        want[: length[i]] = flat[at[i] : at[i] + length[i]]
        assert np.array_equal(out[i], want), i


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_an_epoch_exactly_once_with_equal_batches(shared_cache: Path, world: int) -> None:
    seen, counts = [], []
    for rank in range(world):
        stream = ShardStream(shared_cache, view="records", batch_size=40, seed=6, mix=300, rank=rank, world_size=world)
        batches = _epoch(stream)
        counts.append(len(batches))
        seen.extend(np.concatenate([b["record_id"][~b["is_pad"]] for b in batches]).tolist())
    assert len(set(counts)) == 1
    assert sorted(seen) == list(range(1000))


def _ahead_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("cachebuild-pool-")]


def test_decoding_the_next_pool_ahead_changes_no_batch(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loaders.views.pool_ahead import AheadPools

    ahead = ShardStream(shared_cache, view="records", batch_size=32, seed=9, mix=100)
    started: list[tuple[int, bool]] = []
    real = AheadPools.after

    def counting(self: AheadPools, store: object, shards: object, items: object) -> None:
        before = self.pending
        real(self, store, shards, items)  # type: ignore[arg-type]
        if self.pending is not None and self.pending is not before:
            started.append((self.pending.pool, self.pending.next_epoch))

    monkeypatch.setattr(AheadPools, "after", counting)
    with_ahead = [_epoch(ahead) for _ in range(3)]
    decodes = ahead.view.store.decodes
    assert len(started) >= 3 * 10 - 1  # (10 pools an epoch: every pool but epoch 0's first decoded ahead)
    assert sum(later for _, later in started) >= 2  # the next epoch's first pool, in the epoch's last
    monkeypatch.setattr(AheadPools, "after", lambda *a, **k: None)
    plain = ShardStream(shared_cache, view="records", batch_size=32, seed=9, mix=100)
    without = [_epoch(plain) for _ in range(3)]
    first = int(plain.plan().pools[1])
    assert decodes == 3 * 1000  # each record once an epoch: the epoch's first pool kept for its last batch's padding
    assert plain.view.store.decodes == 3 * (1000 + first)  # (without: decoded again for it)
    for a_epoch, b_epoch in zip(with_ahead, without):
        for a, b in zip(a_epoch, b_epoch, strict=True):
            assert all(np.array_equal(a[k], b[k]) for k in a)
    _check_rows(with_ahead[1], Reference(shared_cache))


def test_a_failed_ahead_decode_is_raised_to_the_batch_that_needs_its_pool(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loaders.views import records as records_view

    stream = ShardStream(shared_cache, view="records", batch_size=32, seed=9, mix=100)
    plan = stream.plan()
    doomed = set(plan.pool_records(3).tolist())
    real_decode = records_view.RecordsView._decode_into

    def decode(self: records_view.RecordsView, shards: object, ids: np.ndarray, arrays: dict, dest: np.ndarray) -> None:
        if doomed & set(ids.tolist()):
            raise OSError("disk gone while decoding ahead")
        real_decode(self, shards, ids, arrays, dest)

    monkeypatch.setattr(records_view.RecordsView, "_decode_into", decode)
    stream = ShardStream(shared_cache, view="records", batch_size=32, seed=9, mix=100)
    got = 0
    with pytest.raises(OSError, match="disk gone"):
        for b in make_loader(stream, num_workers=0):
            got += 1
    first_of_pool_3 = int(plan.pools[3]) // 32
    assert got == first_of_pool_3  # every batch before pool 3 was delivered, that one raised
    assert _wait_for(lambda: not _ahead_threads())


def _wait_for(cond: object, seconds: float = 5.0) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_a_pass_left_early_leaves_no_decode_running(shared_cache: Path) -> None:
    stream = ShardStream(shared_cache, view="records", batch_size=32, seed=2, mix=100)
    loader = make_loader(stream, num_workers=0)
    for i, _ in enumerate(loader):
        if i == 5:
            break
    assert _wait_for(lambda: not _ahead_threads())
    stream.set_epoch(1)
    assert sorted(np.concatenate([b["record_id"][~b["is_pad"]].numpy() for b in loader]).tolist()) == list(range(1000))
