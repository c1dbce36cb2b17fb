"""Helpers of the growing-cache tests: a toy recipe, CLI runs, and a folder's bytes for "nothing changed"."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from gloo_rank import gloo_rank

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


def ddp_grow_rank(rank: int, world: int, port: int, root: str, out_dir: str) -> None:
    """One gloo rank reading a cache that rank 1 grows just before an epoch (rank 0 may have looked already).

    Writes ``out_dir/rank{r}.json``: per epoch, the generation read and the ``ident`` of every real row.
    """
    import time

    import torch
    import torch.distributed as dist

    from cachebuild import build
    from loaders import ShardStream, make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        result.update({"epochs": []})
        loader = make_loader(ShardStream(root, view="records", batch_size=16, seed=1), num_workers=0)
        for epoch in range(3):
            if rank == 1 and epoch == 1:
                time.sleep(1.0)  # rank 0 has (most likely) read the manifest and waits in the broadcast
                build(toy_source(), root, records=40, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)
            ids, generation = [], None
            for batch in loader:
                generation = loader.state_dict()["generation"] if generation is None else generation
                ids += batch["ident"][~batch["is_pad"]].tolist()
                dist.all_reduce(torch.ones(1))  # a rank with fewer steps would hang here
            result["epochs"].append({"generation": generation, "ids": ids})


def ddp_mixture_grow_rank(rank: int, world: int, port: int, roots: dict, out_dir: str) -> None:
    """One gloo rank reading a mixture of two caches; rank 1 grows cache ``a`` just before epoch 1.

    Writes ``out_dir/rank{r}.json``: per epoch, the caches' generations and the (cache, ident) of every real row.
    """
    import time

    import torch
    import torch.distributed as dist

    from cachebuild import build
    from loaders import Mixture, ShardStream, make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        result.update({"epochs": []})
        stream = ShardStream(Mixture(roots), view="records", batch_size=16, seed=1)
        loader = make_loader(stream, num_workers=0)
        for epoch in range(3):
            if rank == 1 and epoch == 1:
                time.sleep(1.0)  # rank 0 has (most likely) read the manifests and waits in the broadcast
                build(toy_source(), roots["a"], records=40, seed=5, shard_mb=0.02, progress=False, workers=1, append=True)
            rows: list = []
            for batch in loader:
                real = ~batch["is_pad"]
                rows += [[int(c), int(i)] for c, i in zip(stream.mixture.cache_of(batch["record_id"][real].numpy()), batch["ident"][real].tolist())]
                dist.all_reduce(torch.ones(1))  # a rank with fewer steps would hang here
            result["epochs"].append({"generations": list(stream.generations), "rows": rows})
