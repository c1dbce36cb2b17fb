"""Shared bits of the example trainers: device choice, opening the cache, monitor summary printing."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from cachebuild.errors import CacheBuildError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # the users' own pipeline lives there (for --baseline)


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def open_stream(cache: str, view: str, build_hint: str, **options):
    """``ShardStream(cache, view, ...)``, or one line and exit 2 when ``cache`` is missing or of
    the wrong kind (a traceback is no way to tell a new user to build the cache first)."""
    from loaders import ShardStream

    try:
        return ShardStream(cache, view=view, **options)
    except (CacheBuildError, ValueError) as exc:
        print(f"error: {exc}\na cache for this example: {build_hint}", file=sys.stderr)
        raise SystemExit(2) from None


def print_summary(title: str, summary, extra: dict | None = None) -> dict:
    """Print the stall monitor's epoch summary as aligned lines; return it as a dict."""
    d = summary.to_dict()
    d.update(extra or {})
    print(f"== {title}")
    for key in (
        "steps",
        "samples",
        "wall_s",
        "first_batch_s",
        "wait_fraction",
        "wait_p50_ms",
        "wait_p95_ms",
        "batches_per_s",
        "samples_per_s",
        "gpu_idle_fraction",
        "gpu_idle_ms_per_step",
        "gpu_util_mean",
        "cpu_percent",
        "ram_used_gb",
    ):
        if key in d and d[key] is not None:
            v = d[key]
            print(f"   {key:<16} {v:.4g}" if isinstance(v, float) else f"   {key:<16} {v}")
    for k, v in (extra or {}).items():
        print(f"   {k:<16} {v:.4g}" if isinstance(v, float) else f"   {k:<16} {v}")
    return d
