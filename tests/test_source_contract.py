"""The source contract, run against every registered source (ours, FunctionSource, a user's module, the examples'):
byte-identical across 1 and 2 workers and the loky and threading backends, resumable after SIGKILL, fields and dtypes as declared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cachebuild import RecordSource, build
from cachebuild.format.manifest import read_manifest
from cachebuild.tools.verify import verify_cache

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import contract_sources as cs  # noqa: E402

REPO = TESTS.parent


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "ssm_user.py").write_text(cs.USER_MODULE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop("ssm_user", None)


def _files(root: Path) -> dict[str, bytes]:
    names = sorted(p.name for p in root.iterdir() if p.name.endswith((".tar", ".idx.npy", ".idx.npy.zst")) or p.name == "manifest.json")
    return {n: (root / n).read_bytes() for n in names}


def _build(source: RecordSource, out: Path, workers: int) -> object:
    return build(source, out, records=cs.RECORDS, seed=3, workers=workers, shard_mb=cs.shard_mb(source), progress=False)


@pytest.mark.parametrize("name", cs.SOURCES)
def test_source_contract(name: str, user_dir: Path, tmp_path: Path) -> None:
    source = cs.make(name, user_dir)
    assert isinstance(source, RecordSource)
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = _build(source, one, workers=1)
    _build(source, two, workers=2)
    assert s1.shards >= 4
    ref = _files(one)
    assert ref == _files(two), f"{name}: 1 and 2 workers differ"
    threads = tmp_path / "threads"
    build(source, threads, records=cs.RECORDS, seed=3, workers=2, backend="threading", shard_mb=cs.shard_mb(source), progress=False)
    assert _files(threads) == ref, f"{name}: the threading backend differs from loky"

    m = read_manifest(one)
    assert [(f.name, f.dtype) for f in m.fields] == [tuple(f) for f in source.fields()]
    assert m.build["block_records"] == source.block_records
    report = verify_cache(one)
    assert report.ok and report.records == cs.RECORDS

    # a real build process, SIGKILLed after its first shard, then resumed here
    killed = tmp_path / "killed"
    paths = [str(REPO), str(TESTS), str(user_dir), str(cs.EXAMPLES / "ssm"), str(cs.EXAMPLES / "sequences")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.Popen([sys.executable, str(TESTS / "contract_sources.py"), name, str(killed), str(user_dir)], env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not list(killed.glob("*.done.json")):
        time.sleep(0.02)
    assert proc.poll() is None, f"{name}: the build ended before it could be killed (rc {proc.returncode})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "manifest.json").exists()
    resumed = _build(source, killed, workers=2)
    assert resumed.skipped >= 1 and resumed.built >= 1
    assert _files(killed) == ref, f"{name}: a resumed build differs from a clean one"


def test_function_source_block_split_matches_the_block(tmp_path: Path) -> None:
    """per_block: record i of a block is row i of the block function's arrays, bit for bit."""
    from cachebuild import block_rng

    source = cs.make("fn_block")
    records = [r for block in source.blocks(3, 2, 10, 22) for r in block]
    assert [int(r["idx"]) for r in records] == list(range(10, 22))
    first = cs._block(block_rng(3, 2, 0), 10, 15, width=3)
    np.testing.assert_array_equal(np.stack([r["x"] for r in records[:5]]), first["x"])
