"""Acceptance audit of issue 11 (your own data): the mistakes a new user made, each one line.

Every test runs the real command line in a folder outside the package, with a user's module
written there, as the README's "Your own data" tells a user to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_run import tails

REPO = Path(__file__).resolve().parent.parent

USER_CODE = """
import time
import numpy as np
from cachebuild import FunctionSource

FIELDS = {"states": "float32", "label": "int16"}

def good(rng, index):
    return {"states": rng.standard_normal((int(rng.integers(0, 5)), 3)).astype(np.float32), "label": np.int16(index % 7)}

def typo(rng, index):
    return {"stats": np.zeros((2, 3), np.float32), "label": np.int16(0)}

def global_rng(rng, index):
    return {"states": np.random.standard_normal((2, 3)).astype(np.float32), "label": np.int16(0)}

def clock(rng, index):
    return {"states": np.zeros((1, 3), np.float32), "label": np.int16(time.perf_counter_ns() % 30000)}

def global_block(rng, start, stop):
    n = stop - start
    return {"states": [np.zeros((1, 3), np.float32)] * n, "label": np.random.randint(0, 30000, n).astype(np.int16)}

def nan_inside(rng, index):
    return {"states": np.full((1, 3), np.nan, np.float32), "label": np.int16(0)}

good_source = FunctionSource.per_record(good, FIELDS)
typo_source = FunctionSource.per_record(typo, FIELDS)
global_rng_source = FunctionSource.per_record(global_rng, FIELDS)
clock_source = FunctionSource.per_record(clock, FIELDS)
global_block_source = FunctionSource.per_block(global_block, FIELDS)
nan_source = FunctionSource.per_record(nan_inside, FIELDS)
"""


def _cli(args: list[str], cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    """The real command line, in ``cwd`` (PYTHONPATH: the package, and ``extra_path``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), extra_path) if p)}
    return subprocess.run([sys.executable, "-m", "cachebuild.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _recipe(folder: Path, kind: str, name: str = "r.toml") -> str:
    (folder / name).write_text(f'kind = "{kind}"\nrecords = 300\n[build]\nshard_mb = 0.01\n')
    return name


def _one_error_line(res: subprocess.CompletedProcess, code: int) -> str:
    assert res.returncode == code, tails(res)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), tails(res)
    return lines[0]


@pytest.fixture()
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "mine.py").write_text(USER_CODE)
    return tmp_path


def test_a_misspelt_field_names_the_name_the_record_used(user_folder: Path) -> None:
    line = _one_error_line(_cli(["build", "-c", _recipe(user_folder, "mine:typo_source"), "-o", "c", "-q", "-j", "1"], user_folder), 6)
    assert "field 'states': missing" in line and "'stats'" in line, line


@pytest.mark.parametrize("kind", ["mine:global_rng_source", "mine:clock_source", "mine:global_block_source"])
def test_a_source_that_does_not_draw_from_its_rng_is_refused_before_anything_is_built(user_folder: Path, kind: str) -> None:
    """Same (seed, shard, block) must give the same bytes: a function drawing from np.random or the
    clock would make a resumed or re-run cache a silent mix of two different draws."""
    line = _one_error_line(_cli(["build", "-c", _recipe(user_folder, kind), "-o", "c", "-q", "-j", "2"], user_folder), 6)
    field = "label" if "clock" in kind or "block" in kind else "states"
    assert "not deterministic" in line and f"field {field!r}" in line and "rng" in line, line
    assert not (user_folder / "c" / "manifest.json").exists()
    assert not list(user_folder.glob("c/*.tar"))


def test_nan_in_an_array_is_stored_as_made_and_a_good_source_still_builds(user_folder: Path) -> None:
    """A NaN may be data (a missing value): stored as is, the README says so; the determinism probe
    compares bytes, so a NaN is not taken for a non-deterministic value."""
    for kind, out in (("mine:nan_source", "n"), ("mine:good_source", "g")):
        res = _cli(["build", "-c", _recipe(user_folder, kind), "-o", out, "-q", "-j", "1"], user_folder)
        assert res.returncode == 0, tails(res)
        assert _cli(["verify", out, "-q"], user_folder).returncode == 0


def test_a_module_whose_own_import_fails_names_the_missing_package_not_the_path(user_folder: Path) -> None:
    (user_folder / "needs_dep.py").write_text("import numpy\nimport not_installed_dep_xyz\n")
    line = _one_error_line(_cli(["build", "-c", _recipe(user_folder, "needs_dep:make"), "-o", "c", "-q"], user_folder), 2)
    assert "'needs_dep'" in line and "not_installed_dep_xyz" in line and "current folder" not in line, line


@pytest.mark.parametrize(
    "target,words",
    [("ep_mod:no_such_attribute", ["'no_such_attribute'"]), ("ep_missing_dep:make", ["not_installed_dep_xyz"])],
    ids=["missing-attribute", "missing-dependency"],
)
def test_a_broken_entry_point_is_one_line(user_folder: Path, target: str, words: list[str]) -> None:
    """A package registering a kind under `cachebuild.sources` whose target does not load."""
    site = user_folder / "site"
    dist = site / "ep_pkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[cachebuild.sources]\nbroken-kind = {target}\n")
    (site / "ep_mod.py").write_text(USER_CODE)
    (site / "ep_missing_dep.py").write_text("import not_installed_dep_xyz\n")
    res = _cli(["build", "-c", _recipe(user_folder, "broken-kind"), "-o", "c", "-q"], user_folder, extra_path=str(site))
    line = _one_error_line(res, 2)
    assert "'broken-kind'" in line and target in line, line
    for word in words:
        assert word in line, line
