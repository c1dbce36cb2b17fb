"""``cachebuild stage`` and ``cachebuild unstage``: thin click commands over :mod:`cachebuild.tools.stage`."""

from __future__ import annotations

from pathlib import Path

import click

from cachebuild.cli.params import LOCAL_FOLDER
from cachebuild.cli.errors import friendly

__all__ = ["stage_command", "unstage_command"]


@click.command("stage")
@click.argument("src", type=LOCAL_FOLDER)
@click.argument("dst", type=LOCAL_FOLDER, required=False)
@click.option("--workers", "-j", type=click.IntRange(min=1), default=None, help="Parallel copy+verify threads [default: min(4, cores)].")
@click.option("--rehash", is_flag=True, help="Re-hash files already staged instead of trusting their size+mtime stamp.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@friendly
def stage_command(src: Path, dst: Path | None, workers: int | None, rehash: bool, quiet: bool) -> None:
    """Copy the cache SRC into RAM (DST, default /dev/shm/cachebuild/<name of SRC>) and verify it.

    Checks free space first, copies shards and indexes under temporary names,
    checks every sha256 against the manifest, and writes the manifest last, so a
    half-staged copy never looks complete. Staging again an unchanged cache
    copies nothing. Prints the path to pass to the loader.

    \b
    When /dev/shm is too small, mount a dedicated tmpfs:
      sudo mount -t tmpfs -o size=40G tmpfs /mnt/cache
      cachebuild stage cache/causal /mnt/cache/causal
    """
    from cachebuild.tools.stage import stage_cache

    result = stage_cache(src, dst, progress=not quiet, workers=workers, rehash=rehash)
    for line in result.lines():
        click.echo(line)


@click.command("unstage")
@click.argument("dst", type=LOCAL_FOLDER)
@friendly
def unstage_command(dst: Path) -> None:
    """Remove a cache staged by `cachebuild stage` from DST (refuses any other folder)."""
    from cachebuild.tools.stage import unstage_cache

    for line in unstage_cache(dst).lines():
        click.echo(line)
