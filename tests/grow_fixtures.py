"""Helpers of the growing-cache tests: a toy recipe, CLI runs, and a folder's bytes for "nothing changed"."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TOY_RECIPE = """\
kind = "grow_fixtures:toy_source"
seed = 5
records = 200
[params]
n_min = 4
n_max = 4
[build]
shard_mb = 0.02
codec = "zstd"
"""


def toy_source(n_min: int = 4, n_max: int = 4) -> object:
    """The recipe's source factory (``kind = "grow_fixtures:toy_source"``)."""
    from cachebuild.testing import ToySource

    return ToySource(n_min=n_min, n_max=n_max)


def toy_recipe(folder: Path, **params: int) -> Path:
    """A recipe file of the toy source (fixed 4x4 matrices: batch shapes never change); ``params`` override."""
    text = TOY_RECIPE
    for key, value in params.items():
        text = text.replace(f"{key} = {4}", f"{key} = {value}")
    path = folder / "toy.toml"
    path.write_text(text)
    return path


def cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cachebuild ARGS`` in a fresh process (the real command line)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-m", "cachebuild.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"cachebuild {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def folder_bytes(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256), the build lock excepted."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != ".cachebuild-build.lock":
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def shard_files(root: Path) -> dict[str, str]:
    """The tar and index files of a cache (name -> sha256)."""
    return {k: v for k, v in folder_bytes(root).items() if k.startswith("shard-") and not k.endswith(".done.json")}
