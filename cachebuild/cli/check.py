"""``cachebuild verify`` and ``cachebuild inspect``: thin commands over the cache tools."""

from __future__ import annotations

from pathlib import Path

import click

from cachebuild.cli.params import LOCAL_FOLDER
from cachebuild.cli.errors import EXIT_FAULTS, fail, friendly

__all__ = ["verify_command", "inspect_command"]


@click.command("verify")
@click.argument("cache", type=LOCAL_FOLDER)
@click.option("--no-decode", is_flag=True, help="Only check sizes and checksums, do not decode every record.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@friendly
def verify_command(cache: Path, no_decode: bool, quiet: bool) -> None:
    """Check every shard's checksum and decode every record of CACHE.

    Prints each fault (shard, record, field) and exits with status 3 if any.
    """
    from cachebuild.tools.verify import verify_cache

    report = verify_cache(cache, decode=not no_decode, progress=not quiet)
    for fault in report.faults:
        click.echo(f"FAULT {fault}", err=True)
    if not report.ok:
        fail(f"error: {len(report.faults)} fault(s) in {cache}", EXIT_FAULTS)
    what = f"{report.records} records decoded" if not no_decode else "checksums only"
    click.echo(f"ok: {cache}: {report.shards} shard{'' if report.shards == 1 else 's'} verified, {what}{_generation_note(cache)}")


def _generation_note(cache: Path) -> str:
    """`` (generation 3, the newest ...)`` for a grown cache: verify checks the generation manifest.json commits."""
    from cachebuild.format.generations import generation_of
    from cachebuild.format.manifest import read_manifest

    g = generation_of(read_manifest(cache))
    return f" (generation {g}, the newest: older generations' snapshots are not re-verified)" if g else ""


@click.command("inspect")
@click.argument("cache", type=LOCAL_FOLDER)
@click.option(
    "--record",
    type=int,
    default=0,
    show_default=True,
    help="Which record to summarise: its position among the records the cache lists (the loader's record_id; a pruned cache's tar keys start later).",
)
@friendly
def inspect_command(cache: Path, record: int) -> None:
    """Print counts, sizes, compression ratio, the recipe, field schemas and one record of CACHE."""
    from cachebuild.tools.inspect import inspect_cache

    for line in inspect_cache(cache, record):
        click.echo(line)
