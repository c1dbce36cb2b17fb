"""``cachebuild build --records N`` on a recipe whose inputs fix the count is refused, not ignored.

The review of 2026-11-24 (thirteenth session) ran ``cachebuild build --config mel.toml
--records 5`` on a recipe with ``[source] synthetic = 20``: it built 20 files and said nothing,
though ``--help`` says ``--records`` is the number of records. A mel source makes one record
per input (an HDF5 file's rows, a folder's WAV files, N synthetic clips), so a different count
is now one line naming both numbers (exit 2) and nothing is written; the same count is accepted.
Likewise ``cachebuild mel --h5-dataset`` without ``--from-h5`` (it was ignored).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    recipe = tmp_path / "mel.toml"
    recipe.write_text('kind = "mel"\n[source]\nsynthetic = 6\n')
    return subprocess.run(
        [sys.executable, "-m", "cachebuild", "build", "--config", str(recipe), "--out", str(tmp_path / "out"), "-q", "-j", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_another_count_for_a_fixed_set_of_inputs_is_refused(tmp_path):
    done = _build(tmp_path, "--records", "3")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "6 files" in line and "3" in line and "synthetic = N" in line, line
    assert not (tmp_path / "out").exists()


def test_the_same_count_builds(tmp_path):
    done = _build(tmp_path, "--records", "6")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"built {tmp_path / 'out'}: 6 files")


def test_h5_dataset_without_an_h5_file_is_refused(tmp_path):
    """``cachebuild mel --synthetic 6 --h5-dataset mel=foo`` built, ignoring the flag."""
    done = subprocess.run(
        [sys.executable, "-m", "cachebuild", "mel", "--synthetic", "6", "--h5-dataset", "mel=foo", "--out", str(tmp_path / "out"), "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: --h5-dataset 'mel=foo' names a dataset of the HDF5 file: it applies only with --from-h5 FILE"
    assert not (tmp_path / "out").exists()
