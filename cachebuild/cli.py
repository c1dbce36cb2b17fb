"""The ``cachebuild`` command line: parses, calls one library function, prints a summary."""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from cachebuild import __version__
from cachebuild.causal.config import FAMILIES, MECHANISMS, NOISE_CHOICES
from cachebuild.errors import CacheBuildError, ConfigError

__all__ = ["main"]


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn cachebuild's own errors into one 'error: ...' line and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CacheBuildError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted: rerun the same command to resume", err=True)
            sys.exit(130)

    return wrapper


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
    """Print a warning as ``warning: <message>`` on stderr: no source file, line number or code line."""
    click.echo("warning: " + " ".join(str(message).split()), err=True)


def _install_one_line_warnings(ctx: click.Context) -> None:
    """One-line warnings for the command's duration only (library users keep Python's format)."""
    ctx.with_resource(warnings.catch_warnings())
    warnings.showwarning = _one_line_warning


class _Group(click.Group):
    """The CLI's group: a usage error (unknown flag, bad flag value) is one ``error:`` line, like every
    other error, with a pointer to ``--help`` instead of click's three-line usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            rv = super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # plain `cachebuild`: the help itself
                click.echo(exc.format_message(), err=True)
                sys.exit(exc.exit_code)
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="cachebuild")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Pre-generate training data into zstd-compressed tar shards, offline and in parallel,
    and check, inspect or benchmark the caches.

    \b
    Quick start:
      cachebuild generate --graphs 100000          # causal graphs -> cache/causal
      cachebuild verify cache/causal               # checksums + decode every record
      cachebuild inspect cache/causal              # sizes, schemas, one record
    """
    _install_one_line_warnings(ctx)


def _workers_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--workers", "-j", type=click.IntRange(min=1), default=None, help="Parallel worker processes (default: all cores).")(fn)


def _check_cluster_flags(backend: str, scheduler: str | None = None, address: str | None = None) -> None:
    """A cluster address is only read by its own backend: refuse one that would be silently ignored."""
    if scheduler is not None and backend != "dask":
        raise ConfigError(f"--scheduler {scheduler} is a Dask address: add --backend dask (the backend is {backend})")
    if address is not None and backend not in ("dask", "ray"):
        raise ConfigError(f"--address {address} is a cluster address: add --backend ray (or dask) (the backend is {backend})")


@main.command()
@click.option("--graphs", "-n", type=int, default=None, help="Number of graphs (records) to build [default: recipe's 'graphs', else 10000].")
@click.option("--out", "-o", type=str, default="cache/causal", show_default=True, help="Cache folder (created) or fsspec URL (s3://bucket/prefix, file:///path).")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path, dir_okay=False), default=None, help="TOML recipe (see configs/); flags override it. Default: the built-in defaults, equal to configs/causal-users-2026-01-15.toml (the users' newest generator).")
@click.option("--seed", type=int, default=None, help="Base seed [default: recipe's, else 0]. Shard i is seeded from (seed, i).")
@_workers_option
@click.option("--codec", type=click.Choice(["zstd", "none"]), default=None, help="Per-member codec: zstd, or none (raw, for tmpfs) [default: zstd].")
@click.option("--level", type=int, default=None, help="zstd level [default: 1: as small as level 3 on causal data, faster].")
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
@click.option("--backend", type=click.Choice(["loky", "dask", "ray"]), default="loky", show_default=True, help="joblib backend that runs the shards.")
@click.option("--scheduler", type=str, default=None, help="Dask scheduler address (with --backend dask; default: a local cluster).")
@click.option("--address", type=str, default=None, help="Ray cluster address (with --backend ray; default: a local Ray).")
@click.option("--overwrite", is_flag=True, help="Replace a cache at --out that was built with another config.")
@click.option("--append", is_flag=True, help="Add --graphs fresh graphs to the cache at --out as its next generation (same recipe, checked; see docs/growing-caches.md).")
@click.option("--keep", type=int, default=None, metavar="N", help="With --append: list only the newest N generations; older shards no reader holds are deleted.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_friendly
def generate(graphs, out, config_path, seed, workers, codec, level, shard_mb, family, n_min, n_max, edge_prob, mechanism, noise, samples, twin, overrides, backend, scheduler, address, overwrite, append, keep, quiet) -> None:
    """Build a cache of random causal graphs with observational, interventional and
    twin-world samples.

    Default recipe: the users' generator of 2026-01-15
    (configs/causal-users-2026-01-15.toml; interaction nodes drawn once per graph so
    twin worlds stay exact). Others: configs/causal-users-2026-01-06.toml,
    configs/causal-rich.toml, configs/causal-linear.toml.

    Parallel over shards, deterministic (same recipe, seed, numpy version and CPU
    kind give byte-identical shards for any --workers or backend) and resumable:
    rerun the same command after an interruption and it finishes the cache,
    skipping shards that verify.
    """
    from cachebuild.jobs import run_causal_build

    _check_cluster_flags(backend, scheduler=scheduler, address=address)
    values = {
        "seed": seed, "graphs": graphs, "build.codec": codec, "build.level": level, "build.shard_mb": shard_mb,
        "graph.family": family, "graph.n_min": n_min, "graph.n_max": n_max, "graph.edge_prob": edge_prob,
        "mechanism.kind": mechanism, "noise.kind": noise, "samples.base": samples, "samples.twin": twin,
    }
    if samples is not None:
        values["samples.per_intervention"] = samples
    summary = run_causal_build(config_path, overrides, values, out, workers, backend, scheduler or address, overwrite, not quiet, append, keep)
    for line in summary.lines("graphs"):
        click.echo(line)


@main.command()
@click.option("--from-h5", "from_h5", type=click.Path(path_type=Path, dir_okay=False), default=None, help="HDF5 file in the users' layout (labels, segments_mel and/or segments_waveform, label2id_json).")
@click.option("--from-wav", "from_wav", type=click.Path(path_type=Path, file_okay=False), default=None, help="Folder of WAV files in label subfolders (LEAK/, NOLEAK/, ...); .flac/.ogg/.mp3 too when soundfile is installed.")
@click.option("--synthetic", type=int, default=None, metavar="N", help="N synthetic leak / no-leak clips (try the pipeline with no data).")
@click.option("--out", "-o", type=str, default="cache/mel", show_default=True, help="Cache folder (created) or fsspec URL (s3://bucket/prefix, file:///path).")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path, dir_okay=False), default=None, help="TOML recipe (see configs/mel-leak.toml; built-in defaults are the same values).")
@click.option("--seed", type=int, default=None, help="Seed (synthetic clip i depends only on (seed, i)) [default: 0].")
@_workers_option
@click.option("--codec", type=click.Choice(["zstd", "none"]), default=None, help="Per-member codec [default: none: mel compresses ~1.2x while zstd halves read speed; zstd for remote storage].")
@click.option("--level", type=int, default=None, help="zstd level [default: 1].")
@click.option("--shard-mb", type=float, default=None, help="Target raw shard size in MB [default: 256].")
@click.option("--h5-dataset", "h5_datasets", multiple=True, metavar="ROLE=NAME", help="Rename an HDF5 dataset: labels=..., mel=..., waveform=... (repeatable).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any recipe key, e.g. --set n_mels=128 (repeatable).")
@click.option("--backend", type=click.Choice(["loky", "dask", "ray"]), default="loky", show_default=True, help="joblib backend that runs the shards.")
@click.option("--scheduler", "--address", "address", type=str, default=None, help="Dask scheduler / Ray cluster address (default: a local one).")
@click.option("--overwrite", is_flag=True, help="Replace a cache at --out that was built with another config.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_friendly
def mel(from_h5, from_wav, synthetic, out, config_path, seed, workers, codec, level, shard_mb, h5_datasets, overrides, backend, address, overwrite, quiet) -> None:
    """Build a cache of log-mel segments, one record per audio file.

    Exactly one source: --from-h5 FILE, --from-wav DIR or --synthetic N. Each
    record holds the label, mel segments [num_long, num_short, n_mels, t]
    (float16), optionally the waveform segments, and the file's id, path and mel
    parameters. Parallel, deterministic and resumable like `generate`.
    """
    from cachebuild.jobs import run_mel_build

    _check_cluster_flags(backend, address=address)
    datasets = {}
    for item in h5_datasets:
        role, sep, name = item.partition("=")
        if not sep or role.strip() not in ("labels", "mel", "waveform"):
            raise ConfigError(f"--h5-dataset {item!r}: expected ROLE=NAME with ROLE one of labels, mel, waveform")
        datasets[role.strip()] = name.strip()
    values = {"seed": seed, "build.codec": codec, "build.level": level, "build.shard_mb": shard_mb}
    summary = run_mel_build(config_path, overrides, values, out, from_h5, from_wav, synthetic, datasets or None, workers, backend, address, overwrite, not quiet)
    for line in summary.lines("files"):
        click.echo(line)


@main.command()
@click.argument("cache", type=click.Path(path_type=Path))
@click.option("--no-decode", is_flag=True, help="Only check sizes and checksums, do not decode every record.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_friendly
def verify(cache: Path, no_decode: bool, quiet: bool) -> None:
    """Check every shard's checksum and decode every record of CACHE.

    Prints each fault (shard, record, field) and exits with status 3 if any.
    """
    from cachebuild.verify import verify_cache

    report = verify_cache(cache, decode=not no_decode, progress=not quiet)
    for fault in report.faults:
        click.echo(f"FAULT {fault}", err=True)
    if not report.ok:
        click.echo(f"error: {len(report.faults)} fault(s) in {cache}", err=True)
        sys.exit(3)
    what = f"{report.records} records decoded" if not no_decode else "checksums only"
    click.echo(f"ok: {cache}: {report.shards} shard{'' if report.shards == 1 else 's'} verified, {what}{_generation_note(cache)}")


def _generation_note(cache: Path) -> str:
    """``, generation 3 (the newest; ...)`` for a grown cache: verify checks the generation manifest.json commits."""
    from cachebuild.format.generations import generation_of
    from cachebuild.format.manifest import read_manifest

    g = generation_of(read_manifest(cache))
    return f" (generation {g}, the newest: older generations' snapshots are not re-verified)" if g else ""


@main.command()
@click.argument("cache", type=click.Path(path_type=Path))
@click.option("--record", type=int, default=0, show_default=True, help="Which record to summarise.")
@_friendly
def inspect(cache: Path, record: int) -> None:
    """Print counts, sizes, compression ratio, the recipe, field schemas and one record of CACHE."""
    from cachebuild.inspect_cache import inspect_cache

    for line in inspect_cache(cache, record):
        click.echo(line)


def _register_extra_commands() -> None:
    from cachebuild.bench_cli import bench_command
    from cachebuild.build_cli import build_command
    from cachebuild.prune_cli import prune_command
    from cachebuild.stage_cli import stage_command, unstage_command

    main.add_command(stage_command)
    main.add_command(unstage_command)
    main.add_command(bench_command)
    main.add_command(build_command)
    main.add_command(prune_command)


_register_extra_commands()

if __name__ == "__main__":  # pragma: no cover
    main()
