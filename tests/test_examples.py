"""The example trainers run a few steps on CPU, with our loader and with --baseline (the users' pipeline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from fork_runner import ForkServer

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
"""The examples' environment (torch reads ``OMP_NUM_THREADS`` when imported, Python ``PYTHONWARNINGS`` at start)."""


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    """Runs an example (``[python, SCRIPT, ARGS...]``) in a fresh process forked from one started with
    :data:`ENV` that imported torch and ours once (tests/fork_runner.py): a new interpreter per run paid
    Python's start and torch's import each time (13 runs here)."""
    server = ForkServer(ENV, cwd=REPO)
    try:
        yield server
    finally:
        server.close()


def _run(forks: ForkServer, script: str, *args: str, timeout: float = 120) -> dict:
    r = forks.run([sys.executable, str(EXAMPLES / script), "--device", "cpu", "--json", *args], ENV, timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== " in r.stdout and "wait_fraction" in r.stdout  # the stall monitor's summary
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def causal_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_causal_build

    out = tmp_path_factory.mktemp("ex") / "causal"
    run_causal_build(None, [], {"graphs": 120, "build.shard_mb": 1}, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def mel_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_mel_build

    out = tmp_path_factory.mktemp("ex") / "mel"
    run_mel_build(None, [], {"build.shard_mb": 1}, out, synthetic=40, workers=1, progress=False)
    return out


@pytest.mark.parametrize("script", ["train_causal.py", "train_mel.py"])
def test_example_without_a_cache_says_how_to_build_one(tmp_path, script, causal_cache, mel_cache, forks):
    """A missing cache, or one of the other kind, is one error line and the command that builds one (exit 2), not a traceback."""
    other = mel_cache if script == "train_causal.py" else causal_cache
    for cache in (tmp_path / "nothing", other):
        r = forks.run([sys.executable, str(EXAMPLES / script), "--cache", str(cache), "--steps", "1", "--device", "cpu"], ENV, 120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: ") and f"--out {cache}" in r.stderr, r.stderr


def test_train_causal_ours(causal_cache, forks):
    d = _run(forks, "train_causal.py", "--cache", str(causal_cache), "--steps", "4", "--batch-size", "256", "--hidden", "32", "--workers", "0")
    assert d["steps"] == 3 and d["final_loss"] == d["final_loss"]  # 4 steps, 1 warm-up; loss not NaN


def test_train_causal_baseline(forks):
    d = _run(forks, "train_causal.py", "--baseline", "--steps", "3", "--batch-size", "256", "--hidden", "32", "--workers", "0")
    assert d["steps"] == 2


def test_train_mel_ours_with_file_eval(mel_cache, forks):
    d = _run(forks, "train_mel.py", "--cache", str(mel_cache), "--epochs", "2", "--steps", "3", "--batch-size", "256", "--eval-files", "16", "--workers", "0", "--width", "8")
    assert d["epoch"] == 1 and d["steps"] == 2
    assert d["files"] == 40 and 0.0 <= d["file_accuracy"] <= 1.0


def test_train_mel_baseline_from_cache(mel_cache, forks):
    d = _run(forks, "train_mel.py", "--cache", str(mel_cache), "--baseline", "--steps", "3", "--batch-size", "256", "--workers", "0", "--width", "8")
    assert d["steps"] == 2 and d["files"] == 40 and 0.0 <= d["file_accuracy"] <= 1.0


def test_train_mel_baseline_synthetic_h5(tmp_path, forks):
    d = _run(forks, "train_mel.py", "--cache", str(tmp_path / "none"), "--baseline", "--synthetic-files", "20", "--steps", "2", "--batch-size", "128", "--workers", "0", "--width", "8", "--no-eval")
    assert d["steps"] == 1 and "file_accuracy" not in d


def test_train_causal_resident_and_seconds(causal_cache, forks):
    """The benchmark modes: an ideal (resident) feed, and a run stopped by the clock."""
    d = _run(forks, "train_causal.py", "--cache", str(causal_cache), "--steps", "6", "--batch-size", "256", "--hidden", "32", "--workers", "0", "--resident", "2")
    assert d["steps"] == 5 and d["wait_fraction"] < 0.5
    d = _run(forks, "train_causal.py", "--cache", str(causal_cache), "--steps", "100000", "--seconds", "1.5", "--batch-size", "256", "--hidden", "32", "--workers", "0", "--handover", "0")
    assert 1 < d["steps"] < 100000 and d["total_s"] < 30


def test_train_mel_seconds_chains_epochs(mel_cache, forks):
    # 40 files x 80 segments / 256 = 13 batches per epoch: 1.5 s of training crosses several epochs under one summary
    d = _run(forks, "train_mel.py", "--cache", str(mel_cache), "--seconds", "1.5", "--batch-size", "256", "--workers", "0", "--width", "8")
    assert d["steps"] > 13 and "epoch" not in d and "file_accuracy" not in d
    d = _run(forks, "train_mel.py", "--cache", str(mel_cache), "--seconds", "1", "--batch-size", "256", "--workers", "0", "--width", "8", "--resident", "2")
    assert d["steps"] > 2


SCRIPTS = sorted(str(p.relative_to(REPO)) for p in [*(REPO / "benchmarks").glob("*.py"), *EXAMPLES.rglob("*.py")] if "__pycache__" not in p.parts)


def test_every_script_is_smoke_tested():
    assert "examples/sequences/train.py" in SCRIPTS and "examples/ssm/train.py" in SCRIPTS and "benchmarks/peers.py" in SCRIPTS


@pytest.fixture(scope="module")
def importer() -> Iterator[Callable[[str], dict]]:
    """Imports a script in a fresh process forked from one warm one (tests/script_importer.py says why and how)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "script_importer.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    assert server.stdin is not None and server.stdout is not None

    def run(path: str) -> dict:
        server.stdin.write(json.dumps({"path": str(REPO / path), "timeout": 120}) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, f"the import server died (exit code {server.poll()})"
        return json.loads(reply)

    try:
        yield run
    finally:
        server.stdin.close()
        server.wait(60)
        server.stdout.close()


@pytest.mark.parametrize("path", SCRIPTS)
def test_scripts_import(path, importer):
    """Every benchmark and example (sub-folders too) imports (catches a script left behind by a refactor); peers of the bench extra may be absent."""
    r = importer(path)
    optional = ("litdata", "streaming", "ffcv", "lightning_utilities", "obstore")
    if r["rc"] and any(f"No module named '{name}" in r["output"] for name in optional):
        pytest.skip(f"{path}: a peer of the bench extra is not installed")
    assert r["rc"] == 0, r["output"][-2000:]


def test_the_importer_fails_a_broken_script_and_isolates_scripts(tmp_path, importer):
    """The forked import fails as a fresh interpreter would (exit code, traceback), and one script's
    import leaves nothing behind for the next (each child is a copy of the warm server, not of the last child)."""
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_of_ours\n")
    r = importer(str(broken))
    assert r["rc"] == 1 and "ModuleNotFoundError: No module named 'no_such_module_of_ours'" in r["output"], r
    (tmp_path / "leaves.py").write_text("import sys\nsys.modules['left_by_a_script'] = sys\nsys.path.append('/left/by/a/script')\n")
    (tmp_path / "checks.py").write_text("import sys\nassert 'left_by_a_script' not in sys.modules and '/left/by/a/script' not in sys.path\nsys.exit(3)\n")
    assert importer(str(tmp_path / "leaves.py"))["rc"] == 0
    assert importer(str(tmp_path / "checks.py"))["rc"] == 3  # its assertion passed, then its own exit code
