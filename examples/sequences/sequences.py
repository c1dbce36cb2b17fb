"""Variable-length ``states`` trajectories, as in the users' multi-GPU trainer, as a cachebuild source.

Each record is one trajectory: ``states [n, dim]`` with n drawn per record
(mostly short, a few long), and a regression ``target`` (the trajectory's drift).
Stored at its own length; the loader pads a batch to its longest trajectory
(``loaders.ragged.trim_to_batch_max``) instead of the users' per-batch collate.
"""

from __future__ import annotations

import numpy as np

from cachebuild import FunctionSource

FIELDS = {"states": "float32", "target": "float32"}


def trajectory(rng: np.random.Generator, index: int, dim: int = 8, mean_length: float = 24.0, max_length: int = 128) -> dict:
    """One random walk with a per-trajectory drift (the target)."""
    n = min(max_length, 2 + int(rng.exponential(mean_length)))
    drift = rng.normal(0.0, 0.3, size=dim)
    states = np.cumsum(rng.normal(0.0, 1.0, size=(n, dim)) + drift, axis=0)
    return {"states": states.astype(np.float32), "target": drift.astype(np.float32)}


def make(dim: int = 8, mean_length: float = 24.0, max_length: int = 128) -> FunctionSource:
    """The recipe's factory: ``[params]`` of sequences.toml arrive here."""
    params = {"dim": dim, "mean_length": mean_length, "max_length": max_length}
    return FunctionSource.per_record(trajectory, FIELDS, params=params, kind="sequences", version="1")
