"""The ``cachebuild`` click group: usage errors as one line, warnings as one line, the library's notes
(the ``cachebuild`` logger: a stopped build waiting for its running shards) as plain lines on stderr.

Commands live in their own modules (:mod:`cachebuild.cli.build`,
:mod:`~cachebuild.cli.check`, :mod:`~cachebuild.cli.stage`,
:mod:`~cachebuild.cli.bench`) and never import this one;
:mod:`cachebuild.cli` adds them to :data:`main`.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, TextIO

import click

from cachebuild._version import __version__
from cachebuild.cli.errors import fail

__all__ = ["Group", "main"]


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
    """Print a warning as ``warning: <message>`` on stderr: no source file, line number or code line."""
    click.echo("warning: " + " ".join(str(message).split()), err=True)


LOKY_TRACKER_QUIET = "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker"
"""A ``-W`` option for loky's resource-tracker process (it starts with this process's ``sys.warnoptions``):
when a failing build aborts its loky workers, the tracker could print "There appear to be 1 leaked
semlock objects to clean up at shutdown" under the build's one-line error (seen once in CI, on a loaded
machine). Those semaphores are loky's own, and the tracker removes them anyway."""


def _install_one_line_warnings(ctx: click.Context) -> None:
    """One-line warnings for the command's duration only (library users keep Python's format); loky's
    resource tracker, if this command starts one, silent about its own semaphores."""
    if LOKY_TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(LOKY_TRACKER_QUIET)
    ctx.with_resource(warnings.catch_warnings())
    warnings.showwarning = _one_line_warning


class _EchoNotes(logging.Handler):
    """The ``cachebuild`` logger's records, each its message alone on a line of stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(" ".join(self.format(record).split()), file=sys.stderr)  # (on a line of its own: a progress bar is cleared, then drawn again)


def _install_notes(ctx: click.Context) -> None:
    """The ``cachebuild`` logger prints its notes (WARNING and up) on stderr for the command's duration."""
    log, handler = logging.getLogger("cachebuild"), _EchoNotes(logging.WARNING)
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False

    def remove() -> None:
        log.removeHandler(handler)
        log.propagate = propagate

    ctx.call_on_close(remove)


class Group(click.Group):
    """The CLI's group: a usage error (unknown flag, bad flag value) is one ``error:`` line, like every
    other error, with a pointer to ``--help`` instead of click's three-line usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            rv = super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # plain `cachebuild`: the help itself
                fail(exc.format_message(), exc.exit_code)
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            fail(f"error: {exc.format_message()}{where}", exc.exit_code)
        except click.ClickException as exc:
            fail(f"error: {exc.format_message()}", exc.exit_code)
        except click.exceptions.Abort:
            fail("aborted", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    _install_notes(ctx)
