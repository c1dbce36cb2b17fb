"""Builds on Ray run one task per shard (``cachebuild.builder.ray_jobs``): results stream in as shards finish,
and a build that stops (a shard fails, Ctrl-C) cancels its tasks, waits for them, and leaves nothing that
writes after it returned; a rerun then equals a build that never stopped. All on a real local Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachebuild.builder.markers import file_sha256
from cachebuild.format.atomic import is_tmp_name

pytest.importorskip("ray")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
EXIT_SOURCE, EXIT_INTERRUPTED = 6, 130

USER_CODE = """
import os
import time
from pathlib import Path

import numpy as np
from cachebuild import FunctionSource

FAIL_AT = 150  # in shard 1, half-way: shard 0 is being written on the other worker then


def _slow(rng, index, flag=""):
    if index == FAIL_AT and flag and Path(flag).exists():
        raise ValueError(f"record {index} is bad")
    time.sleep(0.005)
    return {"x": rng.standard_normal(8).astype(np.float32)}


def make(flag=""):
    return FunctionSource.per_record(_slow, {"x": "float32"}, params={"flag": flag}, block_records=10)


def _dies(rng, index):
    if index == 300:
        os._exit(3)  # the worker process dies (as killed by the OOM killer or a lost node)
    return {"x": np.zeros(2, np.float32)}


def dies():
    return FunctionSource.per_record(_dies, {"x": "float32"})


def job(item, gate):
    # item 0 returns at once; item 1 only once the caller has seen item 0's result (or after 60 s)
    if item == 1:
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return item, time.monotonic()
"""

RECIPE = 'kind = "rayuser:make"\nrecords = 1200\n[params]\nflag = "{flag}"\n[build]\nshard_mb = 0.0016\n'


def _user(tmp_path: Path, flag: Path) -> Path:
    user = tmp_path / "user"
    user.mkdir(exist_ok=True)
    (user / "rayuser.py").write_text(USER_CODE)
    (user / "recipe.toml").write_text(RECIPE.format(flag=flag))
    return user


def _cli(user: Path, out: Path, backend: str) -> list[str]:
    return [sys.executable, "-m", "cachebuild.cli", "build", "-c", "recipe.toml", "-o", str(out), "-q", "--backend", backend, "-j", "2"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}


def _files(out: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file()}


def _nothing_after_return(out: Path) -> None:
    """Right after the build returned: no temporary file, and the folder does not change (a shard takes ~1 s)."""
    files = _files(out)
    assert not [n for n in files if is_tmp_name(Path(n))], files
    time.sleep(1.5)
    assert _files(out) == files


@pytest.fixture(scope="module")
def clean_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The recipe's flag file (absent: no record fails) and the files of a build of the recipe that never
    stopped (threads, in this machine's processes); every test's recipe names the same flag."""
    home = tmp_path_factory.mktemp("clean")
    flag = home / "fail"
    user = _user(home, flag)
    clean = subprocess.run(_cli(user, home / "out", "threading"), cwd=user, env=_env(), capture_output=True, text=True, timeout=240)
    assert clean.returncode == 0, clean.stderr[-4000:]
    return flag, _files(home / "out")


def _same_as_a_clean_build(user: Path, out: Path, clean: dict[str, str]) -> None:
    """The rerun on Ray finishes the cache, keeping what the stopped build published; every byte equals a
    build that never stopped."""
    kept = {n for n in _files(out) if n.endswith(".done.json")}
    assert kept, "the stopped build published no shard: the test did not stop it mid-build"
    res = subprocess.run(_cli(user, out, "ray"), cwd=user, env=_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    assert _files(out) == clean


@pytest.mark.timeout(300)
def test_a_failed_shard_stops_the_ray_tasks(tmp_path: Path, clean_build: tuple[Path, dict[str, str]]) -> None:
    flag, clean = clean_build
    user, out = _user(tmp_path, flag), tmp_path / "out"
    flag.touch()
    try:
        res = subprocess.run(_cli(user, out, "ray"), cwd=user, env=_env(), capture_output=True, text=True, timeout=240)
    finally:
        flag.unlink()
    assert res.returncode == EXIT_SOURCE, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "record 150 raised ValueError: record 150 is bad" in last and "Traceback" not in res.stderr, res.stderr[-4000:]
    _nothing_after_return(out)
    _same_as_a_clean_build(user, out, clean)


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_ray_tasks(tmp_path: Path, clean_build: tuple[Path, dict[str, str]]) -> None:
    flag, clean = clean_build
    user, out = _user(tmp_path, flag), tmp_path / "out"
    proc = subprocess.Popen(_cli(user, out, "ray"), cwd=user, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # Ctrl-C once a shard is complete, mid-build
            if out.is_dir() and any(p.name.endswith(".done.json") for p in out.iterdir()):
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, err[-4000:]
    assert "interrupted: rerun the same command to resume" in err, err[-4000:]
    _nothing_after_return(out)
    _same_as_a_clean_build(user, out, clean)


@pytest.mark.timeout(180)
def test_ray_results_arrive_as_shards_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second job waits until the caller has the first one's result: with results held back until every job
    is done (Ray's joblib backend, the progress bar jumping at the end), it would wait its full 60 s."""
    from cachebuild.builder.backends import run_jobs
    from cachebuild.sources import load_attribute

    user = _user(tmp_path, tmp_path / "never")
    gate = tmp_path / "gate"
    monkeypatch.chdir(user)  # (load_attribute reads the module from the current folder and ships it by value)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    job = load_attribute("rayuser:job")
    t0 = time.monotonic()
    got = []
    for item, _ in run_jobs(job, [0, 1], (str(gate),), "ray", 2):
        got.append(item)
        gate.touch()
    took = time.monotonic() - t0
    assert got == [0, 1] and took < 45, (got, took)


@pytest.mark.timeout(240)
def test_a_ray_worker_that_dies_is_one_line_naming_the_shard(tmp_path: Path) -> None:
    user = _user(tmp_path, tmp_path / "never")
    (user / "recipe.toml").write_text('kind = "rayuser:dies"\nrecords = 600\n[build]\nshard_mb = 0.001\n')
    res = subprocess.run(_cli(user, tmp_path / "out", "ray"), cwd=user, env=_env(), capture_output=True, text=True, timeout=200)
    assert res.returncode == 1, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the Ray task building shard-") and "(rerun the same command to resume)" in last, res.stderr[-4000:]
    assert "Traceback" not in res.stderr, res.stderr[-4000:]
