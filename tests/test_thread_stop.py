"""A threading build that stops (Ctrl-C) while shards are being written: it says that it waits for them, they
stop at their next block without publishing (they used to finish their shard first: a minute at 256 MB, in
silence), and the rerun equals a clean build."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.builder.markers import file_sha256
from cachebuild.format.atomic import is_tmp_name

RECORDS = 600


def _held(rng: np.random.Generator, index: int, hold: str = "") -> dict:
    while index and Path(hold).exists():  # the test holds every running shard here (record 0: the build sizes it first)
        time.sleep(0.02)
    return {"x": rng.standard_normal(8).astype(np.float32)}


def _build(out: Path, hold: Path) -> object:
    src = FunctionSource.per_record(_held, {"x": "float32"}, params={"hold": str(hold)}, block_records=10)
    return build(src, out, records=RECORDS, workers=2, backend="threading", shard_mb=0.001, progress=False)


def _files(out: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != ".cachebuild-build.lock"}


@pytest.mark.timeout(120)
def test_ctrl_c_stops_the_running_threads_at_their_next_block(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out, hold = tmp_path / "c", tmp_path / "hold"
    hold.touch()
    said: list[str] = []

    def interrupt() -> None:  # Ctrl-C once both threads are mid-shard; the shards go on once the build has said it waits
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.is_dir() and sum(is_tmp_name(p) for p in out.iterdir()) >= 2):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # (a real signal: the main thread is blocked on a lock)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not said:
            said.extend(r.getMessage() for r in caplog.records if r.name == "cachebuild")
            time.sleep(0.02)
        hold.unlink()

    caplog.set_level(logging.WARNING, logger="cachebuild")
    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _build(out, hold)
            time.sleep(30)  # (a build that finished first is still interrupted, here)
    finally:
        timer.join()
        hold.unlink(missing_ok=True)
    assert said and said[0].startswith("stopping: waiting for 2 running shards to stop at their next block (they publish nothing); press Ctrl-C to leave now"), said
    files = _files(out)
    assert not [n for n in files if n.startswith("shard-")], files  # the held shards published nothing, their temporary files removed
    time.sleep(0.5)
    assert _files(out) == files
    _build(out, hold)
    _build(tmp_path / "clean", hold)
    assert _files(out) == _files(tmp_path / "clean")
