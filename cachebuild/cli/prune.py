"""``cachebuild prune CACHE``: delete the files of generations no reader holds any more."""

from __future__ import annotations

from pathlib import Path

import click

from cachebuild.cli.params import LOCAL_FOLDER
from cachebuild.cli.errors import friendly

__all__ = ["prune_command"]


@click.command("prune")
@click.argument("cache", type=LOCAL_FOLDER)
@friendly
def prune_command(cache: Path) -> None:
    """Delete shards of CACHE that neither its newest generation nor a reader's generation lists.

    Generations that a running loader holds (a lease in CACHE/generations/) are
    kept; an unfinished `--append` is discarded. Takes the build lock, so it
    waits for no builder: it refuses while an append runs.
    """
    from cachebuild.builder.prune import prune_cache

    for line in prune_cache(cache).lines():
        click.echo(line)
