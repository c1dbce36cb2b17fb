"""A reader keeps one file descriptor per open shard (Python's mmap holds a duplicate), and a local cache
is shuffled whole by default (``window="auto"``), so every shard is open for the epoch: a cache of more
shards than the soft open-file limit (``ulimit -n``, 1,024 on many systems) failed mid-epoch with
``OSError: [Errno 24] Too many open files`` (with ``window=16`` too: local shards are not closed). The
reader now raises the soft limit to the hard one when a descriptor is refused, and names the limit in one
line when the hard limit is too low. Real processes with real limits (``resource.setrlimit``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build

resource = pytest.importorskip("resource")
LIMIT = 96


def _record(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(4).astype(np.float32)}


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fds") / "c"
    summary = build(FunctionSource.per_record(_record, {"x": "float32"}), out, records=5000, shard_mb=0.0003, workers=1, progress=False)
    assert summary.shards > 2 * LIMIT
    return out


def _read_epoch(cache: Path, soft: int, hard: int | None) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard} if {hard is not None} else hard))
        from loaders import ShardStream
        n = sum(len(b["x"]) for b in ShardStream({str(cache)!r}, batch_size=100))
        print("rows", n, "soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4 * LIMIT, reason="the hard open-file limit is too low to raise")
def test_a_cache_of_more_shards_than_the_soft_limit_reads_a_whole_epoch(many_shards: Path) -> None:
    res = _read_epoch(many_shards, LIMIT, None)
    assert res.returncode == 0, res.stderr[-3000:]
    rows, soft = res.stdout.split()[1], int(res.stdout.split()[3])
    assert rows == "5000" and soft > LIMIT


def test_a_hard_limit_too_low_is_one_line_naming_it(many_shards: Path) -> None:
    res = _read_epoch(many_shards, LIMIT, LIMIT)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("cachebuild.format.open_files.OpenFilesError: ") and f"may open {LIMIT}, hard limit {LIMIT}" in last and "ulimit -n" in last, res.stderr[-3000:]
