"""Review of the ``records`` view's pooled mode (``mix=``): cases a user meets that the first tests missed.

Each test failed before its fix (docs/DECISIONS.md, "Review of pooled records reads").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from loader_fixtures import Reference, padded
from loaders import ShardStream, make_loader

MAX_LEN = 60


def _record(rng: np.random.Generator, index: int) -> dict:
    n = int(rng.integers(0, MAX_LEN + 1))
    values = rng.normal(size=n).astype(np.float32)
    values[rng.random(n) < 0.2] = np.nan
    return {"tok": rng.integers(-5, 5000, size=n).astype(np.int32), "val": values, "lab": np.array(index % 7, np.int64)}


FIELDS = {"tok": "int32", "val": "float32", "lab": "int64"}


@pytest.fixture(scope="module", params=[{"pack": 64, "share": 2048}, {"pack": 1}], ids=["shared", "pack1"])
def cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooledreview") / "cache"
    build(FunctionSource.per_record(_record, FIELDS), root, records=700, workers=1, shard_mb=0.05, progress=False, **request.param)
    return root


def _epoch(stream: ShardStream, workers: int = 0) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy().copy() for k, v in b.items()} for b in make_loader(stream, num_workers=workers)]


def _check(batches: list[dict[str, np.ndarray]], ref: Reference) -> list[int]:
    for b in batches:
        for i, rid in enumerate(b["record_id"].tolist()):
            want = ref.record(rid)
            for name in ("tok", "val"):
                assert b[name][i].tobytes() == padded(want[name], (MAX_LEN,)).tobytes(), (rid, name)
                assert b[f"{name}_shape"][i].tolist() == [len(want[name])]
            assert int(b["lab"][i]) == int(want["lab"])
    return sorted(r for b in batches for r in b["record_id"][~b["is_pad"]].tolist())


@pytest.mark.parametrize("mix, batch_size", [(40, 100), (50, 60)])
def test_batches_spanning_several_pools_hold_their_records_values(cache: Path, mix: int, batch_size: int) -> None:
    # A batch over two or more pools decoded them in one call; a flat (1-d ragged) field laid that call's
    # records out across both regions, and the region reused first overwrote the other pool's records.
    batches = _epoch(ShardStream(cache, view="records", batch_size=batch_size, seed=5, mix=mix))
    assert _check(batches, Reference(cache)) == list(range(700))


def test_a_ctrl_c_while_waiting_for_the_ahead_decode_leaves_it_pending(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C in a batch waiting for the next pool's decode (a notebook's interrupted loop): the store forgot the
    # decode still running and freed its region, so the next pass's pools could be decoded into that region
    # while the old thread still wrote into it. Now the decode stays pending and the next pass waits for it.
    import threading
    import time

    from loaders.views import records as records_view
    from loaders.views.pool_ahead import AheadDecode

    real_decode, real_wait = records_view.RecordsView._decode_into, AheadDecode.wait
    slow = {"left": 1}

    def decode(self: records_view.RecordsView, *args: object) -> None:
        if threading.current_thread().name.startswith("cachebuild-pool-") and slow["left"]:
            slow["left"] -= 1
            time.sleep(0.8)  # (the decode the Ctrl-C interrupts the wait for)
        real_decode(self, *args)  # type: ignore[arg-type]

    interrupted = {"left": 1}

    def wait(self: AheadDecode) -> BaseException | None:
        if interrupted["left"]:
            interrupted["left"] -= 1
            raise KeyboardInterrupt  # (as SIGINT does in the main thread's join)
        return real_wait(self)

    monkeypatch.setattr(records_view.RecordsView, "_decode_into", decode)
    monkeypatch.setattr(AheadDecode, "wait", wait)
    stream = ShardStream(cache, view="records", batch_size=32, seed=9, mix=100)
    loader = make_loader(stream, num_workers=0)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    orphan = [t for t in threading.enumerate() if t.name.startswith("cachebuild-pool-") and t.is_alive()]
    assert orphan, "the interrupted decode is still running"
    batches: list[dict[str, np.ndarray]] = []
    for b in loader:  # the next pass (epoch 1)
        if not batches:
            assert not any(t.is_alive() for t in orphan), "the new pass waited for the old decode before using its regions"
            time.sleep(1.0)  # (before the fix, the old decode then overwrote this pass's next pool)
        batches.append({k: v.numpy().copy() for k, v in b.items()})
    assert _check(batches, Reference(cache)) == list(range(700))


@pytest.mark.parametrize("mix", [0, -3, 100.0, "Auto", [100], True])
def test_every_bad_mix_gets_the_same_line_naming_auto(cache: Path, mix: object) -> None:
    # mix=0 said "mix must be >= 1 records per pool or None", leaving out "auto"; "x" said both
    from cachebuild.errors import ConfigError

    with pytest.raises(ConfigError, match="mix must be >= 1 records per pool, 'auto' or None") as err:
        ShardStream(cache, view="records", batch_size=32, mix=mix)
    assert "\n" not in str(err.value)
