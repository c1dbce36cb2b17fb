"""Numbers at the CLI edge and the build lock: one-line refusals, an existing cache left byte-identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.builder.markers import file_sha256
from cachebuild.cli import main
from cachebuild.tools.verify import verify_cache

CLI = [sys.executable, "-m", "cachebuild.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edges") / "c"
    r = CliRunner().invoke(main, ["generate", "--graphs", "300", "--out", str(out), "--shard-mb", "2", "--workers", "1", "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


CASES = [
    (["generate", "--graphs", "100000000000000000000"], "graphs"),
    (["generate", "--graphs", "10000000000"], "shards, more than"),
    (["generate", "--graphs", "100", "--shard-mb", "nan"], "shard_mb"),
    (["generate", "--graphs", "100", "--shard-mb", "inf"], "shard_mb"),
    (["generate", "--graphs", "0"], "graphs"),
    (["generate", "--graphs", "100", "--seed", "-1"], "seed"),
    (["generate", "--graphs", "100", "--samples", "100000000000"], "one record would take about"),
    (["mel", "--synthetic", "100000000000000000000"], "--synthetic"),
    (["bench", "{cache}", "--seconds", "nan"], "--seconds"),
    (["bench", "{cache}", "--seconds", "inf"], "--seconds"),
    (["bench", "{cache}", "--batch-size", "0"], "--batch-size"),
    (["bench", "{cache}", "--step-ms", "nan"], "--step-ms"),
    (["inspect", "{cache}", "--record", "-1"], "out of range"),
    (["inspect", "{cache}", "--record", str(10**30)], "out of range"),
    (["inspect", "{cache}", "--record", "300"], "out of range"),
]


@pytest.mark.parametrize("args,names", CASES, ids=[" ".join(a[:1] + a[2:]) for a, _ in CASES])
def test_bad_numbers_are_refused_in_one_line(cache, args, names):
    before = _hashes(cache)
    argv = [a.format(cache=cache) for a in args]
    if argv[0] in ("generate", "mel"):
        argv += ["--out", str(cache), "-q"]
    r = CliRunner().invoke(main, argv, catch_exceptions=False)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], r.output
    assert _hashes(cache) == before


def _build_cmd(out: Path, graphs: int) -> list[str]:
    return [*CLI, "generate", "--graphs", str(graphs), "--out", str(out), "--shard-mb", "1", "--workers", "1", "-q"]


HOLDER = "import sys; from cachebuild.builder.lock import build_lock\nwith build_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()"


def test_a_second_builder_is_refused_naming_the_holder_and_the_cache_stays_identical(tmp_path, cache):
    out = tmp_path / "c"
    out.mkdir()
    for p in cache.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    before = _hashes(out)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run([*CLI, "generate", "--graphs", "300", "--out", str(out), "--overwrite", "-q"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        holder.communicate("", timeout=30)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 5 and len(lines) == 1, r.stderr
    assert "being built by another cachebuild" in lines[0] and f"pid {holder.pid} on " in lines[0], r.stderr
    assert _hashes(out) == before


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_two_real_builders_at_once_give_one_cache_and_a_clear_refusal(tmp_path):
    out = tmp_path / "c"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen(_build_cmd(out, 3000), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    for rc, _, err in results:  # each one built (or found complete) the cache, or was refused by the lock
        assert rc == 0 or (rc == 5 and "being built by another cachebuild (pid " in err and len(err.strip().splitlines()) == 1), err
    assert any(rc == 0 for rc, _, _ in results)
    assert verify_cache(out).ok and not (out / LOCK_NAME).exists()


def test_a_lock_left_by_a_dead_build_is_taken_over(tmp_path, cache):
    out = tmp_path / "c"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (out / LOCK_NAME).write_text(json.dumps({"pid": int(dead), "host": "h", "started": "then"}))
    r = CliRunner().invoke(main, ["generate", "--graphs", "300", "--out", str(out), "--shard-mb", "2", "--workers", "1", "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert not (out / LOCK_NAME).exists()
    assert _hashes(out) == _hashes(cache)  # the same recipe: byte-identical to a build without the stale lock


@pytest.mark.filterwarnings("default:build.level")  # the CLI prints it: that is what is tested
def test_a_level_with_codec_none_is_a_one_line_warning(tmp_path):
    """--level means nothing for raw members: say so (one line), and build anyway."""
    from click.testing import CliRunner

    from cachebuild.cli import main

    r = CliRunner().invoke(main, ["generate", "--graphs", "20", "--codec", "none", "--level", "5", "--out", str(tmp_path / "c"), "-q"])
    assert r.exit_code == 0, r.output
    warned = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert warned == ["warning: build.level = 5 has no effect: build.codec is 'none' (members are stored uncompressed; use --codec zstd to compress)"]
