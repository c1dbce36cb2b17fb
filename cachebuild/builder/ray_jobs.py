"""Run shard jobs as Ray tasks: one task per shard, at most ``workers`` at a time, yielded as they finish.

Why tasks and not Ray's joblib backend (which the build used before):

* Ray's joblib backend runs jobs on a ``ray.util.multiprocessing.Pool`` of actors. In Ray
  2.60, a process that ran a local Ray, shut it down and then connected to a cluster by
  address got actors that die before they start ("all references to the actor were
  removed"), so a second build in the same process (a notebook building a local cache,
  then one on the cluster) failed with a traceback. Plain tasks run there.
* Its results arrived only when every shard was done (the progress bar jumped at the end);
  here each shard's result comes back when it is written.
* A build that stops (a shard failed, Ctrl-C, a caller that left early) submits nothing more
  (at most ``workers`` tasks are ever submitted at once, so none waits in Ray's queue) and
  waits for its running tasks, at most :data:`STOP_WAIT_S`, saying so in one line
  (:func:`cachebuild.builder.stop.announce_wait`: at 256 MB a shard takes about a minute):
  nothing it started writes after it returns. A running shard finishes and is published
  whole (the rerun keeps it); one still running after the wait, or at a Ctrl-C during it, is
  killed (``force=True``) and publishes nothing (its temporary file stays until the next build
  of the folder removes it; renames are atomic, so no half shard is ever under a final name).
  They are not cancelled with Ray's ``KeyboardInterrupt``: in Ray 2.60 cancelling a task as it
  completes crashed the driver ("Tried to complete task that was not pending"), seen once in
  three interrupted builds.
* A Ctrl-C while the build's local Ray starts (``ray.init``, seconds) or while a task is being
  submitted is held back until that step is done, then raised
  (:func:`cachebuild.builder.stop.ctrl_c_held`; at a start the build says so, and a second Ctrl-C
  leaves at once): a ``KeyboardInterrupt`` half-way through ``ray.init`` sometimes ended the build
  with SIGSEGV, death by SIGINT or a traceback (``docs/DECISIONS.md`` has the rates), and a task
  submitted but not yet counted would have been neither waited for nor killed. A connection to a
  running cluster stays interruptible (it may retry for 40 s).

Ray's own log lines in this process (``ray.init``'s "Started a local Ray instance", "Connecting to
existing Ray cluster", the note that token authentication is on for the local Ray it starts) are
not the user's business: Ray's logger is set to WARNING (ERROR with ``quiet``, the CLI's ``-q``),
and the token note is dropped for a Ray the build starts and stops itself. Task output stays in
Ray's log files (``log_to_driver=False``), and no dashboard is started.

Each job travels as cloudpickle bytes, as on Dask (``cachebuild.sources`` registers a user's
module to be pickled by value with the standalone ``cloudpickle``, which Ray's vendored copy
would not see). A job's exception comes back as a value and is raised here as it was raised
there (not wrapped in a ``RayTaskError``). The connection (address check, bounded retries,
``RAY_ADDRESS``) is :mod:`cachebuild.builder.cluster_check`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

from cachebuild.builder.cluster_check import ray_connect_env, ray_connects
from cachebuild.builder.stop import QUIET_WAIT_S, announce_wait, ctrl_c_held
from cachebuild.errors import CacheBuildError, ConfigError

__all__ = ["CPU_CHECK_S", "MAX_RETRIES", "STOP_WAIT_S", "ray_jobs"]

STOP_WAIT_S = 120.0
"""How long a stopped Ray build waits for its running tasks to end before killing them."""
_TOKEN_NOTE = "Token authentication is enabled for this Ray cluster"
_STARTING = "stopping: the build's local Ray is starting; the build stops once it has (a few seconds); press Ctrl-C again to leave now."
CPU_CHECK_S = 5.0
"""With ``workers=None``: how often a build looks at the cluster's CPUs again while no shard finishes
(a head with no CPUs of its own runs one shard until worker nodes join; then as many as they have)."""
MAX_RETRIES = 1
"""Ray's retries of a shard task whose process or node died (a shard is rebuilt from scratch: idempotent);
a task that dies again fails the build in one line."""


class _RayJobError:
    """An exception a job raised, returned as its value (raised again, unwrapped, by the build)."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def _run_blob(blob: bytes) -> Any:
    """Run a job that came as cloudpickle bytes: ``(fn, item, args)`` -> ``fn(item, *args)``."""
    import pickle

    fn, item, args = pickle.loads(blob)
    try:
        return fn(item, *args)
    except Exception as exc:  # (KeyboardInterrupt, Ray's cancel, is left to Ray)
        return _RayJobError(exc)


@contextlib.contextmanager
def _connect_settings(address: str | None) -> Iterator[None]:
    """Ray's connection settings of :func:`ray_connect_env` while Ray is imported and connects to a cluster
    (Ray reads some at import, some in ``ray.init``), the environment as it was afterwards."""
    settings = ray_connect_env() if ray_connects(address) else {}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key in settings:
            os.environ.pop(key, None)


class _NoTokenNote(logging.Filter):
    """Drops Ray's note that the local Ray it starts has token authentication on (the build's own Ray,
    started and stopped by it: nothing for the user to do)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TOKEN_NOTE)


@contextlib.contextmanager
def _ray_session(address: str | None, quiet: bool = False) -> Iterator[Any]:
    """The ``ray`` module, connected (to ``address``, ``RAY_ADDRESS`` or a new local Ray); a connection
    this call opened is closed after, one that was already open is left as it was. Ray's log lines
    are kept to warnings and errors (errors only with ``quiet``)."""
    with _connect_settings(address):
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("backend 'ray' needs the ray extra: pip install 'cachebuild[ray]'") from exc
        started, came = False, []
        if not ray.is_initialized():
            note = logging.getLogger("ray._private.authentication.authentication_token_setup")
            quiet_note = _NoTokenNote()
            local = not ray_connects(address)
            if local:
                note.addFilter(quiet_note)
            try:
                with ctrl_c_held(local, _STARTING) as came:  # (a local start: seconds; a connection may retry for 40 s)
                    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR if quiet else logging.WARNING)
            except ConnectionError as exc:  # a port that accepted the TCP check but did not answer as Ray
                where = address or os.environ.get("RAY_ADDRESS") or "a new local Ray"
                raise ConfigError(f"cannot connect to the Ray cluster at {where}: {' '.join(str(exc).split())}{_token_hint(exc)}") from None
            finally:
                note.removeFilter(quiet_note)
            started = True
    try:
        if came:  # Ctrl-C while the local Ray started: raised now, with Ray whole, and shut down
            raise KeyboardInterrupt
        yield ray
    finally:
        if started:
            ray.shutdown()


def _token_hint(exc: BaseException) -> str:
    """What to do when the cluster refused this process's token (Ray's token authentication), else "".

    ``ray start --head`` turns token authentication on when ``~/.ray/auth_token`` exists (any local
    ``ray.init()``, a build with ``--backend ray`` and no address, writes one), and ``ray.init`` sends
    the token by itself only for ``auto``: an explicit ``HOST:PORT`` got "Failed to connect", with the
    reason only in Ray's log lines above it."""
    if "InvalidAuthToken" not in str(exc.__cause__ or exc.__context__ or ""):
        return ""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return (
            "; the cluster wants Ray's token authentication: set RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (Ray does this by itself only for --address auto)"
        )
    return "; the cluster refused this token: RAY_AUTH_TOKEN (or ~/.ray/auth_token) must hold the cluster's token"


def ray_jobs(fn: Callable[..., Any], items: Sequence[Any], args: tuple, address: str | None, workers: int | None, quiet: bool = False) -> Iterator[Any]:
    """``fn(item, *args)`` for every item as one Ray task each, yielded as they finish; at most ``workers``
    running (None: as many as the cluster has CPUs, counted again as shards finish and every
    :data:`CPU_CHECK_S`, so worker nodes that join a running build, as an autoscaler's do, are used).
    ``quiet``: Ray logs errors only."""
    import cloudpickle

    with _ray_session(address, quiet) as ray:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_run_blob)
        jobs = iter([(item, cloudpickle.dumps((fn, item, args))) for item in items])
        pending: list[Any] = []
        item_of: dict[Any, Any] = {}
        try:
            while True:
                limit = workers if workers is not None else _cluster_cpus(ray)  # (nodes that join, or leave, count as they do)
                with ctrl_c_held() as came:  # (a task submitted is counted before a Ctrl-C can leave: waited for, or killed)
                    while len(pending) < limit:
                        job = next(jobs, None)
                        if job is None:
                            break
                        ref = task.remote(job[1])
                        pending.append(ref)
                        item_of[ref] = job[0]
                if came:
                    raise KeyboardInterrupt
                if not pending:
                    return
                done, pending = ray.wait(pending, num_returns=1, timeout=None if workers is not None else CPU_CHECK_S)
                if not done:  # (only with workers=None: look at the cluster's CPUs again)
                    continue
                try:
                    result = ray.get(done[0])
                except ray.exceptions.RayError as exc:  # the task's process or node died (its own exceptions come back as values)
                    name = getattr(item_of[done[0]], "name", repr(item_of[done[0]]))
                    first = (str(exc).strip().splitlines() or [""])[0]
                    raise CacheBuildError(f"the Ray task building {name} failed: {type(exc).__name__}: {first} (rerun the same command to resume)") from None
                if isinstance(result, _RayJobError):
                    raise result.exc
                yield result
        finally:
            if pending:  # an error, an interrupt, a caller that left early
                _stop(ray, pending)


def _cluster_cpus(ray: Any) -> int:
    """The CPUs the cluster has now (at least 1: a head started with ``--num-cpus=0`` whose workers an
    autoscaler adds once there is work)."""
    return max(1, int(ray.cluster_resources().get("CPU", 0)))


def _stop(ray: Any, pending: list[Any]) -> None:
    """Wait for the build's running tasks to end (see the module's docstring), saying so if it takes longer
    than :data:`QUIET_WAIT_S`; kill those still running after :data:`STOP_WAIT_S` or at a Ctrl-C."""
    why = f"{STOP_WAIT_S:.0f} s after the build stopped"
    try:
        _, left = ray.wait(pending, num_returns=len(pending), timeout=QUIET_WAIT_S)
        if left:
            announce_wait(len(left), "to finish on Ray (they are kept)", " (they are lost then)")
            _, left = ray.wait(left, num_returns=len(left), timeout=STOP_WAIT_S)
    except KeyboardInterrupt:  # Ctrl-C (a second one, if the first stopped the build): stop waiting
        left, why = pending, "at Ctrl-C"
    if left:
        for ref in left:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        warnings.warn(
            f"{len(left)} shard task(s) still running on Ray {why} were killed; they publish nothing, and their temporary files stay until the next build of this folder", RuntimeWarning, stacklevel=3
        )
