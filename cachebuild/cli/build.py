"""``cachebuild generate``, ``cachebuild mel`` and ``cachebuild build``: thin commands over the builders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from cachebuild.builder.backends import BACKENDS
from cachebuild.causal.config import FAMILIES, MECHANISMS, NOISE_CHOICES
from cachebuild.cli.errors import friendly
from cachebuild.errors import ConfigError

__all__ = ["generate_command", "mel_command", "build_command"]


OVERWRITE_HELP = (
    "Replace a cache at --out that was built with another config. The new cache is built inside it, in .overwrite/, "
    "and swapped in only when complete: the old one stays readable until then, a rerun resumes, and the disk (or bucket) "
    "needs room for both caches meanwhile."
)
QUIET_HELP = "No progress bar, and no log lines of the cluster (Ray: errors only); the summary, warnings and errors stay."
BACKEND_HELP = "What runs the shards: loky (local processes), threading, dask (one task per shard on the cluster) or ray."
WORKERS_HELP = (
    "Parallel worker processes (default: all cores); --backend dask: the workers of the cluster it starts (not used with "
    "--scheduler: that cluster runs a shard per worker thread); --backend ray: shards at a time (default: the cluster's CPUs)."
)


def _workers_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--workers", "-j", type=click.IntRange(min=1), default=None, help=WORKERS_HELP)(fn)


def _check_cluster_flags(backend: str, scheduler: str | None = None, address: str | None = None) -> None:
    """A cluster address is only read by its own backend: refuse one that would be silently ignored."""
    if scheduler is not None and backend != "dask":
        raise ConfigError(f"--scheduler {scheduler} is a Dask address: add --backend dask (the backend is {backend})")
    if address is not None and backend not in ("dask", "ray"):
        raise ConfigError(f"--address {address} is a cluster address: add --backend ray (or dask) (the backend is {backend})")


@click.command("generate")
@click.option("--graphs", "-n", type=int, default=None, help="Number of graphs (records) to build [default: recipe's 'graphs', else 10000].")
@click.option("--out", "-o", type=str, default="cache/causal", show_default=True, help="Cache folder (created) or fsspec URL (s3://bucket/prefix, file:///path).")
@click.option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML recipe (see configs/); flags override it. Default: the built-in defaults, equal to configs/causal-users-2026-01-15.toml (the users' newest generator).",
)
@click.option("--seed", type=int, default=None, help="Base seed [default: recipe's, else 0; with --append: the cache's own]. Shard i is seeded from (seed, i).")
@_workers_option
@click.option("--codec", type=click.Choice(["zstd", "none"]), default=None, help="Per-member codec: zstd, or none (raw, for tmpfs) [default: zstd; with --append: the cache's own].")
@click.option("--level", type=int, default=None, help="zstd level [default: 1: as small as level 3 on causal data, faster; with --append: the cache's own].")
@click.option(
    "--pack",
    type=int,
    default=None,
    metavar="N",
    help="Records per tar member (build.pack) [default: 1 (one member per record and field: plain WebDataset reads it) for records of 8 KiB and more, such as causal graphs; for smaller ones 256 to 4096, about 4 MB per member (2 KB records: 1024), fewer if that passes 16 MB; a rerun or --append: the cache's own].",
)
@click.option("--shard-mb", type=float, default=None, help="Target raw shard size in MB [default: 256].")
@click.option("--family", type=click.Choice(FAMILIES), default=None, help="Graph family (graph.family).")
@click.option("--n-min", type=int, default=None, help="Smallest graph size (graph.n_min).")
@click.option("--n-max", type=int, default=None, help="Largest graph size (graph.n_max).")
@click.option("--edge-prob", type=float, default=None, help="Edge probability for the topo family (graph.edge_prob).")
@click.option("--mechanism", type=click.Choice(MECHANISMS), default=None, help="Edge functions (mechanism.kind).")
@click.option("--noise", type=click.Choice(NOISE_CHOICES), default=None, help="Noise distribution; mixed draws one of noise.kinds per graph (noise.kind).")
@click.option("--samples", type=int, default=None, help="Rows per world: base and each intervention (samples.base).")
@click.option("--twin/--no-twin", default=None, help="Intervened rows share the base rows' noise (default) or draw fresh noise.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any recipe key, e.g. --set interventions.intervention_prob=0.3 (repeatable).")
@click.option("--backend", type=click.Choice(BACKENDS), default="loky", show_default=True, help=BACKEND_HELP)
@click.option("--scheduler", type=str, default=None, help="Dask scheduler address (with --backend dask; default: a local cluster).")
@click.option(
    "--address",
    type=str,
    default=None,
    help="Ray cluster address with --backend ray: HOST:PORT, ray://HOST:PORT, auto or local [default: RAY_ADDRESS if set, else a local Ray]; checked before the build starts.",
)
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@click.option("--append", is_flag=True, help="Add --graphs fresh graphs to the cache at --out as its next generation (same recipe, checked; see docs/growing-caches.md).")
@click.option("--keep", type=int, default=None, metavar="N", help="With --append: list only the newest N generations; older shards no reader holds are deleted.")
@click.option("--quiet", "-q", is_flag=True, help=QUIET_HELP)
@friendly
def generate_command(**o: Any) -> None:
    """Build a cache of random causal graphs with observational, interventional and
    twin-world samples.

    Default recipe: the users' generator of 2026-01-15
    (configs/causal-users-2026-01-15.toml; interaction nodes drawn once per graph so
    twin worlds stay exact). Others: configs/causal-users-2026-01-06.toml,
    configs/causal-users-2026-01-06-clipped.toml, configs/causal-users-2026-01-14.toml,
    configs/causal-rich.toml, configs/causal-linear.toml.

    Parallel over shards, deterministic (same recipe, seed, numpy version and CPU
    kind give byte-identical shards for any --workers or backend) and resumable:
    rerun the same command after an interruption and it finishes the cache,
    skipping shards that verify.
    """
    from cachebuild.jobs import run_causal_build

    _check_cluster_flags(o["backend"], scheduler=o["scheduler"], address=o["address"])
    keys = {"seed": "seed", "graphs": "graphs", "codec": "build.codec", "level": "build.level", "pack": "build.pack", "shard_mb": "build.shard_mb", "family": "graph.family", "n_min": "graph.n_min", "n_max": "graph.n_max",
            "edge_prob": "graph.edge_prob", "mechanism": "mechanism.kind", "noise": "noise.kind", "samples": "samples.base", "twin": "samples.twin"}  # fmt: skip
    values = {key: o[flag] for flag, key in keys.items()}
    if o["samples"] is not None:
        values["samples.per_intervention"] = o["samples"]
    where = o["scheduler"] or o["address"]
    summary = run_causal_build(o["config_path"], o["overrides"], values, o["out"], o["workers"], o["backend"], where, o["overwrite"], not o["quiet"], o["append"], o["keep"])
    for line in summary.lines("graphs"):
        click.echo(line)


@click.command("mel")
@click.option(
    "--from-h5", "from_h5", type=click.Path(path_type=Path, dir_okay=False), default=None, help="HDF5 file in the users' layout (labels, segments_mel and/or segments_waveform, label2id_json)."
)
@click.option(
    "--from-wav",
    "from_wav",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder of WAV files in label subfolders (LEAK/, NOLEAK/, ...); .flac/.ogg/.mp3 too when soundfile is installed.",
)
@click.option("--synthetic", type=int, default=None, metavar="N", help="N synthetic leak / no-leak clips (try the pipeline with no data).")
@click.option("--out", "-o", type=str, default="cache/mel", show_default=True, help="Cache folder (created) or fsspec URL (s3://bucket/prefix, file:///path).")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path, dir_okay=False), default=None, help="TOML recipe (see configs/mel-leak.toml; built-in defaults are the same values).")
@click.option("--seed", type=int, default=None, help="Seed (synthetic clip i depends only on (seed, i)) [default: 0].")
@_workers_option
@click.option("--codec", type=click.Choice(["zstd", "none"]), default=None, help="Per-member codec [default: none: mel compresses ~1.2x while zstd halves read speed; zstd for remote storage].")
@click.option("--level", type=int, default=None, help="zstd level [default: 1].")
@click.option(
    "--pack",
    type=int,
    default=None,
    metavar="N",
    help="Records per tar member (build.pack) [default: 1 (one member per file and field: plain WebDataset reads it) for records (a file's mel, label and any waveform) of 8 KiB and more, as the default 40x2x64 mel; 256 to 4096 for smaller ones (about 4 MB per member); a rerun: the cache's own].",
)
@click.option("--shard-mb", type=float, default=None, help="Target raw shard size in MB [default: 256].")
@click.option("--h5-dataset", "h5_datasets", multiple=True, metavar="ROLE=NAME", help="Rename an HDF5 dataset: labels=..., mel=..., waveform=... (repeatable).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any recipe key, e.g. --set n_mels=128 (repeatable).")
@click.option("--backend", type=click.Choice(BACKENDS), default="loky", show_default=True, help=BACKEND_HELP)
@click.option("--scheduler", "--address", "address", type=str, default=None, help="Dask scheduler / Ray cluster address (default: a local one).")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@click.option("--quiet", "-q", is_flag=True, help=QUIET_HELP)
@friendly
def mel_command(from_h5, from_wav, synthetic, out, config_path, seed, workers, codec, level, pack, shard_mb, h5_datasets, overrides, backend, address, overwrite, quiet) -> None:
    """Build a cache of log-mel segments, one record per audio file.

    Exactly one source: --from-h5 FILE, --from-wav DIR or --synthetic N. Each
    record holds the label, mel segments [num_long, num_short, n_mels, t]
    (float16), optionally the waveform segments, and the file's id, path and mel
    parameters. Parallel, deterministic and resumable like `generate`.
    """
    from cachebuild.jobs import run_mel_build

    _check_cluster_flags(backend, address=address)
    if h5_datasets and from_h5 is None:  # was ignored without a word
        raise ConfigError(f"--h5-dataset {h5_datasets[0]!r} names a dataset of the HDF5 file: it applies only with --from-h5 FILE")
    datasets = {}
    for item in h5_datasets:
        role, sep, name = item.partition("=")
        if not sep or role.strip() not in ("labels", "mel", "waveform"):
            raise ConfigError(f"--h5-dataset {item!r}: expected ROLE=NAME with ROLE one of labels, mel, waveform")
        datasets[role.strip()] = name.strip()
    values = {"seed": seed, "build.codec": codec, "build.level": level, "build.pack": pack, "build.shard_mb": shard_mb}
    summary = run_mel_build(config_path, overrides, values, out, from_h5, from_wav, synthetic, datasets or None, workers, backend, address, overwrite, not quiet)
    for line in summary.lines("files"):
        click.echo(line)


@click.command("build")
@click.option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="TOML recipe; its 'kind' picks the source: causal (default), mel, or module:attribute for your own.",
)
@click.option("--out", "-o", type=str, required=True, help="Cache folder (created) or fsspec URL.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any recipe key, e.g. --set params.length=128 (repeatable).")
@click.option("--records", "-n", type=click.IntRange(min=1), default=None, help="Number of records [default: the recipe's count key: graphs, records; mel: one per input, fixed by its [source]].")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Base seed [default: the recipe's, else 0; with --append: the cache's own].")
@click.option("--workers", "-j", type=click.IntRange(min=1), default=None, help=WORKERS_HELP)
@click.option(
    "--pack",
    type=int,
    default=None,
    metavar="N",
    help="Records per tar member (build.pack) [default: the recipe's, else 1 for records of 8 KiB and more (one member per record and field: plain WebDataset reads it), 256 to 4096 for smaller ones (about 4 MB per member), fewer if that passes 16 MB; a rerun or --append: the cache's own].",
)
@click.option(
    "--codec",
    type=click.Choice(["zstd", "none"]),
    default=None,
    help="Per-member codec (build.codec): zstd, or none (raw, for tmpfs) [default: the recipe's, else zstd (mel: none); with --append: the cache's own].",
)
@click.option("--level", type=int, default=None, help="zstd level (build.level) [default: the recipe's, else 1; with --append: the cache's own].")
@click.option("--shard-mb", type=float, default=None, help="Target raw shard size in MB (build.shard_mb) [default: the recipe's, else 256].")
@click.option("--backend", type=click.Choice(BACKENDS), default="loky", show_default=True, help=BACKEND_HELP)
@click.option("--address", "--scheduler", "address", type=str, default=None, help="Dask scheduler / Ray cluster address (default: a local one).")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@click.option("--append", is_flag=True, help="Add --records fresh records to the cache at --out as its next generation (same recipe, checked).")
@click.option("--keep", type=int, default=None, metavar="N", help="With --append: list only the newest N generations; older shards no reader holds are deleted.")
@click.option("--quiet", "-q", is_flag=True, help=QUIET_HELP)
@friendly
def build_command(
    config_path: Path,
    out: str,
    overrides: tuple[str, ...],
    records: int | None,
    seed: int | None,
    workers: int | None,
    pack: int | None,
    codec: str | None,
    level: int | None,
    shard_mb: float | None,
    backend: str,
    address: str | None,
    overwrite: bool,
    append: bool,
    keep: int | None,
    quiet: bool,
) -> None:
    """Build the cache a TOML recipe describes, whatever its kind.

    \b
    kind = "causal"            random causal graphs (same as `cachebuild generate`)
    kind = "mel"               log-mel segments; needs [source] h5 = FILE | wav = DIR | synthetic = N
    kind = "mymod:make"        your own source: a RecordSource, or a factory called with [params]

    How the shards are stored comes from the recipe's [build] table (or --set; the flags
    --shard-mb, --codec, --level and --pack set the same keys and win over both, as in
    `generate`): shard_mb (256), codec (zstd, or none; mel: none), level (1), pack (records
    per tar member: 1 for records of 8 KiB and more, 256 to 4096 for smaller ones (about 4 MB
    per member), fewer if that passes 16 MB; a rerun or --append: the cache's own), share
    (packed zstd: small consecutive entries share one zstd frame of at most this many decoded
    bytes, format v4; 1024, 0 for one frame per entry; a rerun or --append: the cache's own),
    workers.

    Parallel, deterministic (byte-identical shards for any --workers or backend)
    and resumable: rerun the same command after an interruption to finish it.
    """
    from cachebuild.api import build_recipe

    values = {"build.pack": pack, "build.codec": codec, "build.level": level, "build.shard_mb": shard_mb}  # each flag is its recipe key, as in `generate` and `mel`
    summary, unit = build_recipe(
        config_path,
        out,
        overrides=overrides,
        records=records,
        seed=seed,
        workers=workers,
        backend=backend,
        address=address,
        overwrite=overwrite,
        progress=not quiet,
        append=append,
        keep=keep,
        build_values=values,
    )
    for line in summary.lines(unit):
        click.echo(line)
