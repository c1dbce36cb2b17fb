"""Pooled ``records`` passes planned in the trainer's process with workers asked for decode their pools in a
process of the store's own, into regions of shared memory (:mod:`loaders.views.pool_process`): the same
batches as 0 workers, every decode there, and the process's life bounded: replaced by decoding here if it
dies, ended by ``shutdown_workers``, by the trainer's end or kill (the regions are anonymous memory: nothing is left
behind), and deaf to a terminal's Ctrl-C (the trainer decides)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import ShardCorruptError
from loaders import ShardStream, make_loader
from loaders.loader import shutdown_workers
from loaders.views.records import RecordsView
from test_records_pooled import shared_cache  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
KW = {"view": "records", "batch_size": 40, "seed": 3, "mix": 150}


def _digest(batches) -> list[tuple]:
    return [tuple((k, v.numpy().tobytes()) for k, v in b.items()) for b in batches]


def _memfds() -> int:
    """This process's descriptors of pool regions (``memfd_create``)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:cachebuild-pool")
        except OSError:
            pass
    return n


def _wait_for(cond, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return bool(cond())


def test_every_pool_is_decoded_in_the_process_and_the_batches_are_those_of_zero_workers(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = _digest(make_loader(ShardStream(shared_cache, **KW), num_workers=0))
    here: list[int] = []
    decode = RecordsView._decode_into
    monkeypatch.setattr(RecordsView, "_decode_into", lambda self, *a: (here.append(os.getpid()), decode(self, *a))[1])
    loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2)
    got = _digest(loader)
    store = loader.stream.view.store
    assert got == want
    assert here == []  # (a decode in the process appends to the process's own list)
    assert store.decodes >= 1000 and store.process.pid != os.getpid() and psutil.pid_exists(store.process.pid)
    assert os.readlink(f"/proc/self/fd/{store._shm.fd}").startswith("/memfd:cachebuild-pool")  # (anonymous: no file left behind)
    assert "memfd:cachebuild-pool" in Path(f"/proc/{store.process.pid}/maps").read_text()  # the process writes into them
    zero = make_loader(loader.stream, num_workers=0)  # a 0-worker pass over the same stream decodes in a thread again
    zero.set_epoch(0)
    assert _digest(zero) == want and here and not store.use_process
    first_zero = ShardStream(shared_cache, **KW)  # and the other way: private regions, then a process
    assert _digest(make_loader(first_zero, num_workers=0)) == want
    here.clear()
    two = make_loader(first_zero, num_workers=2)
    two.set_epoch(0)
    assert _digest(two) == want and here == [] and first_zero.view.store._shm is not None


def test_a_killed_decode_process_is_replaced_by_decoding_here(shared_cache: Path) -> None:
    zero = make_loader(ShardStream(shared_cache, **KW), num_workers=0)
    want = _digest(zero) + _digest(zero)
    loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2)
    it = iter(loader)
    got = _digest([next(it) for _ in range(3)])
    pid = loader.stream.view.store.process.pid
    with pytest.warns(RuntimeWarning, match="pool decode process .* ended"):  # (in the decode thread, or here)
        os.kill(pid, signal.SIGKILL)
        got += _digest(it) + _digest(loader)
    assert got == want


def _drop_and_collect(box: list) -> None:
    box.clear()  # (this forked child's copy of the loader, its stream and store)
    gc.collect()


def test_a_forked_child_dropping_its_copy_of_the_stream_leaves_the_decode_process_alone(shared_cache: Path) -> None:
    box = [make_loader(ShardStream(shared_cache, **KW), num_workers=2)]
    first = _digest(box[0])
    process = box[0].stream.view.store.process._proc
    child = mp.get_context("fork").Process(target=_drop_and_collect, args=(box,))  # (a worker, a user's fork, another store's process)
    child.start()
    child.join(10.0)
    assert child.exitcode == 0
    time.sleep(0.2)
    assert process.is_alive()  # (the child's finalizer of the store's process sent it the stop message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        box[0].set_epoch(0)
        assert _digest(box[0]) == first and box[0].stream.view.store.process._proc is process


def _wide_record(rng, index: int) -> dict:
    return {"x": rng.normal(size=int(rng.integers(2000, 4000))).astype(np.float32)}


def test_a_stream_read_at_zero_workers_leaves_no_copy_of_its_private_regions_in_the_decode_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode process is forked once the store has let go of its private regions (else the child keeps
    its copy of their pages, once this process frees its own: 44 MB of 46 MB of pools before the fix). Checked
    at the fork itself: the child's memory, compared with another's, depends on the rest of this process's heap
    (CI run 45: 26 MB of difference with nothing kept)."""
    import loaders.planned as planned

    root = tmp_path / "wide"
    build(FunctionSource.per_record(_wide_record, {"x": "float32"}), root, records=2000, workers=1, shard_mb=4, pack=8, share=65536, progress=False)
    kw = {"view": "records", "batch_size": 64, "seed": 0, "mix": 1000}
    read_before = ShardStream(root, **kw)
    want = _digest(make_loader(read_before, num_workers=0))
    store = read_before.view.store
    assert sum(a.nbytes for a in store.arrays.values()) > 30 * 2**20  # (regions in this process's memory)
    at_fork: list[bool] = []
    start = planned.PoolProcess

    def watched(*args: Any, **kwargs: Any) -> Any:
        at_fork.append(store.arrays is None or store._shm is not None)  # (no private regions left to copy)
        return start(*args, **kwargs)

    monkeypatch.setattr(planned, "PoolProcess", watched)
    moved, fresh = make_loader(read_before, num_workers=2), make_loader(ShardStream(root, **kw), num_workers=2)
    moved.set_epoch(0)
    assert _digest(moved) == want == _digest(fresh)
    assert at_fork[:1] == [True], at_fork


def test_shutdown_ends_the_process_and_a_dropped_stream_removes_its_regions(shared_cache: Path) -> None:
    loader = make_loader(ShardStream(shared_cache, **KW), num_workers=2)
    first = _digest(loader)
    process, held = loader.stream.view.store.process, _memfds()
    assert held >= 1
    shutdown_workers(loader)
    assert not process._proc.is_alive()
    loader.set_epoch(0)
    assert _digest(loader) == first  # the next pass starts another process
    assert loader.stream.view.store.process is not process and loader.stream.view.store.process._proc.is_alive()
    later = loader.stream.view.store.process._proc
    del loader, process
    gc.collect()
    assert _wait_for(lambda: _memfds() < held and not later.is_alive())  # (the stream dropped: its store's process and regions too)


def test_a_corrupt_frame_decoded_in_the_process_is_one_line_in_the_trainer(shared_cache: Path, tmp_path: Path) -> None:
    import shutil

    from cachebuild.format.reader import open_cache

    root = tmp_path / "bad"
    shutil.copytree(shared_cache, root)
    with open_cache(root) as shards:
        shard = shards.manifest.shards[0].name
    data = bytearray((root / shard).read_bytes())
    at = data.find(b"\x28\xb5\x2f\xfd", 4096)  # a zstd frame of the first shard, past its first members
    data[at + 40 : at + 60] = b"\xff" * 20
    (root / shard).write_bytes(bytes(data))
    earlier = set(threading.enumerate())  # (a thread another test left is that test's to report)
    loader = make_loader(ShardStream(root, **KW), num_workers=2)
    with pytest.raises(ShardCorruptError) as info:
        for _ in loader:
            pass
    assert "\n" not in str(info.value) and shard in str(info.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("cachebuild-handover") and t not in earlier]


_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    from loaders import ShardStream, make_loader
    root, what = sys.argv[1], sys.argv[2]
    loader = make_loader(ShardStream(root, view="records", batch_size=40, seed=3, mix=150), num_workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    store = loader.stream.view.store
    print("process", store.process.pid, flush=True)
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for i, b in enumerate(it):
            if i == 2:
                os.killpg(os.getpgid(0), signal.SIGINT)  # (what a terminal's Ctrl-C does)
                time.sleep(1.0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    seen = np.concatenate([b["record_id"][~b["is_pad"]].numpy() for b in loader])
    print("next pass", len(seen), len(np.unique(seen)), store.process.pid, flush=True)
    """
)


def _run(cache: Path, what: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(cache), what], env=env, cwd=REPO, capture_output=True, text=True, timeout=120, start_new_session=True)


@pytest.mark.timeout(240)
def test_a_killed_trainer_leaves_no_decode_process_nor_regions(shared_cache: Path) -> None:
    out = _run(shared_cache, "kill")
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    _, pid = out.stdout.split("\n")[0].split()
    assert _wait_for(lambda: not psutil.pid_exists(int(pid)), 10.0), "the decode process outlived its trainer"


@pytest.mark.timeout(240)
def test_a_terminals_ctrl_c_leaves_the_decode_process_to_the_trainer(shared_cache: Path) -> None:
    out = _run(shared_cache, "ctrl-c")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    pid = lines[0].split()[1]
    assert lines[1] == "interrupted"
    assert lines[2] == f"next pass 1000 1000 {pid}", out.stdout  # the same process decoded the next epoch whole
    assert "Warning" not in out.stderr, out.stderr[-2000:]


def test_a_remote_cache_decodes_in_this_process_with_the_same_batches(shared_cache: Path, tmp_path: Path) -> None:
    from loaders.remote import RemoteOptions
    from remote_fixtures import serve_folder

    want = _digest(make_loader(ShardStream(shared_cache, **KW), num_workers=0))
    with serve_folder(shared_cache) as (url, _):  # (this process's shard set fetches in the pass's order: no copy elsewhere)
        loader = make_loader(ShardStream(url, remote=RemoteOptions(cache_dir=str(tmp_path / "c")), **KW), num_workers=2)
        assert _digest(loader) == want
        store = loader.stream.view.store
        assert store.process is None and store._shm is None
