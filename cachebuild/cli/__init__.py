"""The ``cachebuild`` command line: parses, calls one library function, prints a summary.

One module per command group, each a set of thin click commands over one
library call: :mod:`~cachebuild.cli.build` (``generate``, ``mel``, ``build``),
:mod:`~cachebuild.cli.check` (``verify``, ``inspect``),
:mod:`~cachebuild.cli.stage` (``stage``, ``unstage``), :mod:`~cachebuild.cli.prune`
(``prune``) and
:mod:`~cachebuild.cli.bench` (``bench``; imports :mod:`loaders` only when it
runs). :mod:`~cachebuild.cli.errors` maps errors to exit statuses and
:mod:`~cachebuild.cli.group` holds the click group. Command modules import
neither this package nor each other, so there is no import circle.
"""

from __future__ import annotations

from cachebuild.cli.bench import bench_command
from cachebuild.cli.build import build_command, generate_command, mel_command
from cachebuild.cli.check import inspect_command, verify_command
from cachebuild.cli.group import main
from cachebuild.cli.prune import prune_command
from cachebuild.cli.stage import stage_command, unstage_command

__all__ = ["main"]

for _command in (generate_command, mel_command, verify_command, inspect_command, stage_command, unstage_command, bench_command, build_command, prune_command):
    main.add_command(_command)
del _command
