"""What "deterministic" means for causal caches, and that the manifest records what the bytes depend on.

The claim (README, "Deterministic"): the same recipe, seed, record count and codec give
byte-identical shards for any worker count or backend, on the same numpy version and CPU
kind. The fingerprint covers the generator's block size and the numpy version; the
manifest also records the SIMD features numpy dispatches to on the building CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachebuild.builder import BuildOptions, build_cache
from cachebuild.builder.causal_source import CAUSAL_BLOCK, CausalSource
from cachebuild.builder.determinism import numpy_simd_features
from cachebuild.builder.markers import file_sha256
from cachebuild.causal import CausalConfig
from cachebuild.causal.sampler import sub_block_size
from cachebuild.errors import CacheMismatchError

ROOT = Path(__file__).resolve().parent.parent


def _build(out: Path, workers: int, graphs: int = 700, **kw):
    opts = BuildOptions(out=out, records=graphs, workers=workers, progress=False, sync=False, **kw)
    return build_cache(CausalSource(CausalConfig()), opts, unit="graphs")


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(root.iterdir())}


def test_default_recipe_same_bytes_for_one_or_two_workers(tmp_path: Path) -> None:
    _build(tmp_path / "one", workers=1)
    _build(tmp_path / "two", workers=2)
    a, b = _hashes(tmp_path / "one"), _hashes(tmp_path / "two")
    assert a == b and sum(name.endswith(".tar") for name in a) >= 2  # manifests too


def test_manifest_records_what_the_bytes_depend_on(tmp_path: Path) -> None:
    _build(tmp_path / "c", workers=1, graphs=300)
    build = json.loads((tmp_path / "c" / "manifest.json").read_text())["build"]
    det = build["determinism"]
    assert det["block_records"] == CAUSAL_BLOCK == 2048  # the block size the generator really uses
    assert det["sub_block_graphs"] == sub_block_size(CausalConfig())
    assert det["numpy"] == np.__version__
    assert build["environment"]["numpy_simd"] == numpy_simd_features()
    import zstandard

    assert build["environment"]["zstd"] == ".".join(map(str, zstandard.ZSTD_VERSION))


def test_another_numpy_version_refuses_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards made by another numpy may differ in the last bits: never mixed into one cache."""
    out = tmp_path / "c"
    _build(out, workers=1, graphs=300)
    assert _build(out, workers=1, graphs=300).already_complete
    monkeypatch.setattr(np, "__version__", "0.0.0-another")
    with pytest.raises(CacheMismatchError):
        _build(out, workers=1, graphs=300)


_CHILD = """
import json, sys
from cachebuild.builder import BuildOptions, build_cache
from cachebuild.builder.causal_source import CausalSource
from cachebuild.causal import CausalConfig
build_cache(CausalSource(CausalConfig()), BuildOptions(out=sys.argv[1], records=300, workers=1, progress=False, sync=False))
print(json.dumps(json.load(open(sys.argv[1] + "/manifest.json"))["build"]))
"""


@pytest.mark.skipif("X86_V4" not in numpy_simd_features(), reason="needs a CPU with AVX-512 (X86_V4) to turn it off")
def test_cpu_kind_is_recorded_but_not_fingerprinted(tmp_path: Path) -> None:
    """numpy without its AVX-512 kernels: the manifest says so; the fingerprint (shared by the
    machines of one distributed build) does not change."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR")
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "c")], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    child = json.loads(run.stdout.strip().splitlines()[-1])
    _build(tmp_path / "here", workers=1, graphs=300)
    here = json.loads((tmp_path / "here" / "manifest.json").read_text())["build"]
    assert "X86_V4" not in child["environment"]["numpy_simd"] and "X86_V4" in here["environment"]["numpy_simd"]
    assert child["fingerprint"] == here["fingerprint"] and child["determinism"] == here["determinism"]
