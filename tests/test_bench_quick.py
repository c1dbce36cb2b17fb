"""`make bench` still runs end to end: every benchmark script in its quick mode (BENCH_QUICK=1).

The quick runs are marked ``bench_smoke``: benchmarks are not part of the test suite (`make test`
leaves them out), CI runs them after it (`make bench-smoke`), and a plain ``pytest`` runs everything.

Quick mode (benchmarks/_results.py) gives each script tiny inputs and short
measurements and records nothing in RESULTS.md; a peer whose package is missing
is skipped with a printed note. The scripts run as `make bench` runs them:
`python benchmarks/<name>.py` from the repository root, in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = ["bench_build", "bench_load", "bench_mel", "bench_feed", "bench_remote", "bench_mixture", "bench_small", "bench_pool_mixing", "peers"]
"""What `make bench-quick` runs (the BENCHES of the Makefile, and the peers' smoke run)."""


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BENCH_QUICK="1", PYTHONPATH=str(REPO))
    env.pop("PYTHONWARNINGS", None)
    results = (REPO / "benchmarks" / "RESULTS.md").read_bytes()
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert (REPO / "benchmarks" / "RESULTS.md").read_bytes() == results, "quick mode must not record"
    return r


def test_the_makefile_runs_these():
    text = (REPO / "Makefile").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("BENCHES ="))
    assert line.split("=", 1)[1].split() == QUICK[:-1]


@pytest.mark.slow
@pytest.mark.bench_smoke
@pytest.mark.parametrize("name", QUICK)
def test_quick_mode_runs(name):
    r = _run(name)
    assert r.returncode == 0, f"{name} failed in quick mode:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
    if name != "peers":
        assert "quick mode" in r.stdout, r.stdout[-2000:]


def test_quick_defaults_yield_to_given_flags():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import argparse

        import _results

        ap = argparse.ArgumentParser()
        ap.add_argument("--graphs", type=int, default=100_000)
        os.environ["BENCH_QUICK"] = "1"
        try:
            _results.quick_defaults(ap, graphs=10)
            assert ap.parse_args([]).graphs == 10 and ap.parse_args(["--graphs", "7"]).graphs == 7
        finally:
            del os.environ["BENCH_QUICK"]
        ap2 = argparse.ArgumentParser()
        ap2.add_argument("--graphs", type=int, default=100_000)
        _results.quick_defaults(ap2, graphs=10)
        assert ap2.parse_args([]).graphs == 100_000
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
