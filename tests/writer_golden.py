"""Small builds whose shard bytes are pinned: the writer may get faster, never different.

``golden_builds(root)`` builds a fixed set of caches (causal graphs and a source of
awkward fields: 0-d, empty, non-contiguous, every dtype kind, payloads on and around
the 512-byte block edge, JSON with unicode), each with zstd and without, and returns
``{build/file: sha256}`` for every shard and index plus the manifest without its
environment lines. ``tests/data/writer_golden.json`` holds the values the writer of
main's commit 1d3ec8c gave; regenerate with (on that commit's code)::

    PYTHONPATH=<checkout>:tests python tests/writer_golden.py > tests/data/writer_golden.json
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cachebuild.builder import BuildOptions, build_cache
from cachebuild.builder.causal_source import CausalSource
from cachebuild.builder.determinism import numpy_simd_features
from cachebuild.causal import CausalConfig
from cachebuild.format.codec import Codec
from cachebuild.function_source import FunctionSource

AWKWARD_FIELDS = {
    "scalar": "float64",
    "empty": "int32",
    "strided": "float32",
    "flags": "bool",
    "half": "float16",
    "edge": "uint8",
    "wide": "int64",
    "meta": "json",
}


def awkward_record(rng: np.random.Generator, index: int) -> dict[str, Any]:
    """One record whose members hit the writer's edge cases (padding 0, empty payloads, strides)."""
    n = int(rng.integers(0, 40))
    base = rng.standard_normal((n + 1, 6)).astype(np.float32)
    edge_len = (512 - 128, 512 - 128 + 1, 1024 - 128, 7)[index % 4]  # .npy header is 128 bytes: payload 512, 513, 1024
    return {
        "scalar": np.float64(rng.standard_normal()) * np.ones((), np.float64),
        "empty": np.zeros((0, n), np.int32),
        "strided": base[:, ::2],  # not C-contiguous
        "flags": rng.integers(0, 2, size=(n,)).astype(bool),
        "half": rng.standard_normal((2, n)).astype(np.float16),
        "edge": rng.integers(0, 4, size=edge_len, dtype=np.uint8),
        "wide": rng.integers(-(2**40), 2**40, size=(3, 1, n)),
        "meta": {"i": index, "name": "grün\u2603" * (index % 3), "xs": rng.standard_normal(index % 5).tolist(), "nested": {"b": [1, None, True]}},
    }


def _hashes(folder: Path, tag: str) -> dict[str, str]:
    out = {}
    for p in sorted(folder.iterdir()):
        if p.suffix == ".tar" or p.name.endswith(".idx.npy"):
            out[f"{tag}/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("created_by", None)
    manifest["build"].pop("environment", None)
    out[f"{tag}/manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return out


def golden_builds(root: Path, workers: int = 1) -> dict[str, str]:
    """Build every pinned cache under ``root``; ``{build/file: sha256}``."""
    out: dict[str, str] = {}
    for codec in (Codec("zstd", 1), Codec("none", 0)):
        causal = root / f"causal-{codec.name}"
        opts = BuildOptions(out=causal, records=700, seed=3, codec=codec, shard_bytes=4 << 20, workers=workers, progress=False, sync=False)
        build_cache(CausalSource(CausalConfig()), opts, unit="graphs")
        out.update(_hashes(causal, causal.name))
        awkward = root / f"awkward-{codec.name}"
        source = FunctionSource.per_record(awkward_record, AWKWARD_FIELDS, block_records=50)
        opts = BuildOptions(out=awkward, records=230, seed=5, codec=codec, shard_bytes=40_000, workers=workers, progress=False, sync=False)
        build_cache(source, opts)
        out.update(_hashes(awkward, awkward.name))
    return out


def environment() -> dict[str, Any]:
    """What the pinned bytes depend on besides the writer: numpy (and its SIMD kernels), zstd."""
    import zstandard

    return {"numpy": np.__version__, "numpy_simd": numpy_simd_features(), "zstd": ".".join(map(str, zstandard.ZSTD_VERSION))}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        hashes = golden_builds(Path(tmp))
    json.dump({"environment": environment(), "hashes": hashes}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
