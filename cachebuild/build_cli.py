"""``cachebuild build --config recipe.toml --out DIR``: build a cache of any recipe kind."""

from __future__ import annotations

from pathlib import Path

import click

from cachebuild.builder.backends import BACKENDS

__all__ = ["build_command"]


@click.command("build")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path, dir_okay=False), required=True, help="TOML recipe; its 'kind' picks the source: causal (default), mel, or module:attribute for your own.")
@click.option("--out", "-o", type=str, required=True, help="Cache folder (created) or fsspec URL.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any recipe key, e.g. --set params.length=128 (repeatable).")
@click.option("--records", "-n", type=click.IntRange(min=1), default=None, help="Number of records [default: the recipe's count key: graphs, records].")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Base seed [default: the recipe's, else 0].")
@click.option("--workers", "-j", type=click.IntRange(min=1), default=None, help="Parallel worker processes (default: all cores).")
@click.option("--backend", type=click.Choice(BACKENDS), default="loky", show_default=True, help="joblib backend that runs the shards.")
@click.option("--address", "--scheduler", "address", type=str, default=None, help="Dask scheduler / Ray cluster address (default: a local one).")
@click.option("--overwrite", is_flag=True, help="Replace a cache at --out that was built with another config.")
@click.option("--append", is_flag=True, help="Add --records fresh records to the cache at --out as its next generation (same recipe, checked).")
@click.option("--keep", type=int, default=None, metavar="N", help="With --append: list only the newest N generations; older shards no reader holds are deleted.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def build_command(config_path: Path, out: str, overrides: tuple[str, ...], records: int | None, seed: int | None, workers: int | None, backend: str, address: str | None, overwrite: bool, append: bool, keep: int | None, quiet: bool) -> None:
    """Build the cache a TOML recipe describes, whatever its kind.

    \b
    kind = "causal"            random causal graphs (same as `cachebuild generate`)
    kind = "mel"               log-mel segments; needs [source] h5 = FILE | wav = DIR | synthetic = N
    kind = "mymod:make"        your own source: a RecordSource, or a factory called with [params]

    Parallel, deterministic (byte-identical shards for any --workers or backend)
    and resumable: rerun the same command after an interruption to finish it.
    """
    from cachebuild.api import build_recipe
    from cachebuild.cli import _friendly

    def run() -> None:
        summary, unit = build_recipe(config_path, out, overrides=overrides, records=records, seed=seed, workers=workers, backend=backend, address=address, overwrite=overwrite, progress=not quiet, append=append, keep=keep)
        for line in summary.lines(unit):
            click.echo(line)

    _friendly(run)()
