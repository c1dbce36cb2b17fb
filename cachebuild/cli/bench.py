"""``cachebuild bench``: a thin click command over :func:`loaders.bench.run_bench`.

The only command that uses the loader: :mod:`loaders` is imported when it runs,
so the rest of the CLI (and the builder) never imports it.
"""

from __future__ import annotations

from pathlib import Path

import click

from cachebuild.cli.params import LOCAL_FOLDER
from cachebuild.cli.errors import friendly

__all__ = ["bench_command"]

_VIEWS = "graphs, twins (causal), mel, mel_files (mel), records (any)"


@click.command("bench")
@click.argument("cache", type=LOCAL_FOLDER)
@click.option("--view", default=None, help=f"View to drain: {_VIEWS} [default: by cache kind: causal -> graphs, mel -> mel, else records].")
@click.option("--batch-size", "-b", type=int, default=None, help="Rows per batch [default: graphs 256, twins 4096, mel 8192, mel_files 64, records 256].")
@click.option("--workers", "-j", type=click.IntRange(min=0), default=1, show_default=True, help="Loader worker processes (0: build batches in this process).")
@click.option("--seconds", type=float, default=None, help="Stop after this many seconds [default: 10 unless --batches is given].")
@click.option("--batches", type=int, default=None, help="Stop after this many batches (the first is warm-up); with --seconds, whichever comes first.")
@click.option("--step-ms", type=float, default=0.0, show_default=True, help="Synthetic consumer: sleep this long per batch (a GPU step that leaves the CPU free).")
@click.option(
    "--consumer",
    type=click.Choice(["none", "sleep", "model"]),
    default=None,
    help="What takes the batches: nothing, a sleep of --step-ms, or a small MLP on the GPU (needs CUDA) [default: sleep if --step-ms, else none].",
)
@click.option("--device", default="auto", show_default=True, help="auto (CUDA if present), cpu, cuda, cuda:N.")
@click.option("--compare", is_flag=True, help="Also drain the same shards with the plain WebDataset reader (per-sample .zst decode + np.load).")
@click.option("--sample", type=click.IntRange(min=1), default=8, show_default=True, help="Batches timed stage by stage (read, decompress, assemble, pin, copy).")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed of the loader.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Also draw the wait per step and the throughput over steps to this PNG (needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: the loaders.bench module docstring) instead of the table.")
@friendly
def bench_command(
    cache: Path,
    view: str | None,
    batch_size: int | None,
    workers: int,
    seconds: float | None,
    batches: int | None,
    step_ms: float,
    consumer: str | None,
    device: str,
    compare: bool,
    sample: int,
    seed: int,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Drain CACHE through the loader and report records/s, samples/s, payload MB/s,
    time to first batch, the consumer's wait fraction and per-stage times.

    \b
    Examples:
      cachebuild bench cache/causal                          # graphs view, 10 s, no consumer
      cachebuild bench cache/causal --view twins --step-ms 20 --workers 2
      cachebuild bench cache/mel --compare --json            # + plain WebDataset, as JSON
      cachebuild bench cache/causal --plot stalls.png        # + wait and throughput over steps
    """
    from loaders.bench import format_table, run_bench

    result = run_bench(
        cache,
        view=view,
        batch_size=batch_size,
        workers=workers,
        seconds=seconds,
        batches=batches,
        step_ms=step_ms,
        consumer=consumer,
        device=device,
        compare=compare,
        sample=sample,
        seed=seed,
        plot=plot,
    )
    if as_json:
        click.echo(result.to_json())
    else:
        for line in format_table(result):
            click.echo(line)
        if plot is not None:
            click.echo(f"plot: {plot}")
