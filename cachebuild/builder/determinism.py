"""What a cache's bytes depend on besides the recipe, seed and plan, recorded in every manifest.

The contract (README, "Deterministic"): the same recipe, seed, record count and
codec give byte-identical shards for any worker count or backend, **on the same
numpy version and CPU kind**. Two things beyond the recipe change the bytes:

* the generator's block size (records per generator call, e.g. causal graphs in
  blocks of 2048 seeded from ``(seed, shard, block)``), which a source declares
  with a ``determinism()`` method;
* numpy: its version (random streams and math kernels may change between
  releases) and the CPU's SIMD features, because numpy picks float32
  ``exp``/``log``/``log1p``/``sin``/... kernels at run time (AVX2, AVX-512, ...)
  and they may differ in the last bits (e.g. float32 ``log1p`` up to 2 ulp on
  0.5% of values with AVX-512 disabled).

The block size and the numpy version are part of the build fingerprint (a
resumed or repeated build with another numpy refuses to mix shards). The SIMD
features are recorded in the manifest only: the machines of one distributed
build may differ there, and a cache built on them is valid, just not
bit-identical to a build on one machine. So is the zstd library version: it
may change the compressed bytes of a zstd shard, never the records in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["source_determinism", "numpy_simd_features", "build_environment"]


def numpy_simd_features() -> list[str]:
    """The SIMD features numpy's run-time dispatch may use on this CPU (sorted); [] if unknown."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # type: ignore[no-redef]
        except ImportError:
            return []
    return sorted(name for name in __cpu_dispatch__ if __cpu_features__.get(name))


def source_determinism(source: Any, default_block_records: int) -> dict[str, Any]:
    """What the shard bytes depend on beyond (config, seed, plan): part of the fingerprint.

    A source may declare its own (``source.determinism()`` -> dict, e.g. its
    block size); otherwise the builder's default block size is recorded.
    """
    own = getattr(source, "determinism", None)
    doc = dict(own()) if callable(own) else {"block_records": default_block_records}
    doc["numpy"] = np.__version__
    return doc


def _zstd_version() -> str | None:
    try:
        import zstandard
    except ImportError:
        return None
    return ".".join(str(v) for v in zstandard.ZSTD_VERSION)


def build_environment() -> dict[str, Any]:
    """Facts about the building host that may change bytes but not records' meaning (manifest only)."""
    return {"numpy_simd": numpy_simd_features(), "zstd": _zstd_version()}
