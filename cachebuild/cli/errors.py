"""The one place where the CLI turns errors into a message and an exit status.

Every command is wrapped by :func:`friendly`: cachebuild's own errors
(:class:`~cachebuild.errors.CacheBuildError` subclasses) print one
``error: ...`` line and exit with their class's ``exit_code``; Ctrl-C prints a
hint and exits 130. Click's usage errors are handled by the group
(:class:`cachebuild.cli.group.Group`).

Exit statuses::

    0  ok
    1  CacheBuildError (base), click abort
    2  ConfigError, SharedMemoryError, usage error (unknown flag or command, bad flag value)
    3  ShardCorruptError, ManifestError, ``verify`` found faults
    4  CacheMismatchError
    5  OutputError
    6  SourceError
    7  RemoteError
    130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NoReturn, TypeVar

import click

from cachebuild.errors import CacheBuildError

__all__ = ["friendly", "fail", "EXIT_FAULTS", "EXIT_INTERRUPTED"]

EXIT_FAULTS = 3
"""``cachebuild verify`` found faults (the same status as a corrupt shard)."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), like a shell."""

RESUMING = frozenset({"generate", "build", "mel", "stage", "prune"})
"""Commands whose rerun picks up where an interrupted one stopped (builds, a stage's copy)."""

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int) -> NoReturn:
    """Print ``message`` on stderr and exit with ``code``."""
    click.echo(message, err=True)
    sys.exit(code)


def friendly(fn: F) -> F:
    """Turn cachebuild's own errors into one 'error: ...' line and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CacheBuildError as exc:
            fail(f"error: {exc}", exc.exit_code)
        except KeyboardInterrupt:
            ctx = click.get_current_context(silent=True)
            resumes = ctx is None or ctx.info_name in RESUMING  # verify, inspect, bench: nothing to resume
            fail("interrupted: rerun the same command to resume" if resumes else "interrupted", EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]
