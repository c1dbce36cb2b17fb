"""Run shard jobs on loky (local processes) or threads of the calling process, on a Dask cluster, or on Ray.

Threads: a pool of the build's own that, when a shard fails or the build is interrupted, drops
the shards not started, tells those being written to stop at their next block without publishing
(as on Dask), and waits for them before the error leaves the build
(joblib's threading backend returned at once while its threads went on writing shards, outside
the build lock, with the process's GC threshold still raised for them: :mod:`cachebuild.builder.collector`).

Dask: with an address, the build connects to that scheduler; without one, a
``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1 is started for
the build and closed after it (its HTTP server on a free port: the default 8787 may be
another cluster's, and Dask then warns; its scheduler's and workers' local directory a
temporary folder of the build's own, removed after it: Dask's default
``$TMPDIR/dask-scratch-space`` stayed behind). The shards are submitted to the cluster
directly, not through joblib's Dask backend, which runs every job in the calling
process when the cluster has a single worker thread. Each job travels as cloudpickle
bytes: Dask pickles a task with the standard pickle first, which names a user's module
instead of shipping it by value (as loky does, see ``cachebuild.sources``), and a
scheduler that cannot import that module drops the task graph with a log line while
the build waits forever. Before the shards are sent, one probe task loads a job on a
worker, so a cluster that cannot load it (no cachebuild there, an installed module
missing) is one error naming the module, and a cluster that runs nothing is an error
after ``PROBE_TIMEOUT_S``. A build that stops (a shard failed, Ctrl-C) cancels the tasks not
started and waits for the running ones, which stop between blocks and never publish
their shard (:func:`_stop_dask_jobs`, :mod:`cachebuild.builder.stop`); a wait of more than
``QUIET_WAIT_S`` is announced in one line, and Ctrl-C ends it. The build's own cluster's
worker processes ignore Ctrl-C (:func:`_children_ignore_ctrl_c`): a terminal sends it to
every process of the build, and they died with two tracebacks, their tasks never ended,
and the build waited silently for ``STOP_WAIT_S``; the build stops them itself.

Ray: ``ray.init(address)`` (or a local Ray) and one Ray task per shard, not Ray's joblib
backend (:mod:`cachebuild.builder.ray_jobs` says why). The build checks the address before it
touches its output (:mod:`cachebuild.builder.cluster_check`); ``ray.init`` then runs with Ray's
connection retries bounded, so a port that accepts TCP but is no Ray fails in about 40 s instead
of retrying for many minutes. A build that stops submits no more shards and waits for those
running (at most ``workers``), which finish and are published whole (:mod:`cachebuild.builder.ray_jobs`).

loky: a stopped build ends its worker processes at once (joblib terminates them); a shard they
were writing leaves only its temporary file, which the next build of the folder removes. A
worker whose build was killed (``kill -9``, the OOM killer) exits within ``ORPHAN_CHECK_S``
(:mod:`cachebuild.builder.orphan`); loky's own workers would finish their shard and wait for
work for 5 minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Generator, Iterator, Sequence

from cachebuild.builder.orphan import exit_with_parent
from cachebuild.builder.stop import QUIET_WAIT_S, BuildStopped, announce_wait, stop_check
from cachebuild.errors import CacheBuildError, ConfigError

__all__ = ["BACKENDS", "run_jobs"]

BACKENDS = ("loky", "threading", "dask", "ray")
PROBE_TIMEOUT_S = 120.0
STOP_WAIT_S = 120.0
"""How long a stopped Dask build waits for its running shard tasks to end (:func:`_stop_dask_jobs`)."""


@contextlib.contextmanager
def _dask_client(address: str | None, workers: int) -> Iterator[Any]:
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ConfigError("backend 'dask' needs the dask extra: pip install 'cachebuild[dask]'") from exc
    if address:
        try:
            client = Client(address, set_as_default=False)
        except OSError as exc:  # unreachable, refused, timed out: dask's own traceback helps no one
            raise ConfigError(f"cannot reach the Dask scheduler at {address}: {' '.join(str(exc).split())}") from None
        try:
            yield client
        finally:
            client.close()
        return
    with _own_scratch() as scratch:
        with _quiet_worker_asyncio(), _children_ignore_ctrl_c():
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=":0",
                silence_logs=logging.CRITICAL,
                local_directory=scratch,
                scheduler_kwargs={"local_directory": scratch},
            )
        try:
            with Client(cluster, set_as_default=False) as client:
                yield client
        finally:
            _close_own_cluster(cluster)


CLOSE_S = 30.0
"""How long the build's own Dask cluster may take to close before its worker processes are killed."""


def _close_own_cluster(cluster: Any) -> None:
    """Close the build's own ``LocalCluster``, at most :data:`CLOSE_S`; then kill its worker processes that are
    left. A cluster whose worker a task had killed (``os._exit``, the OOM killer) once waited for ever in
    ``close()`` for the restarted worker to answer (CI run 42: the build hung after its one-line error was due)."""
    import multiprocessing

    try:
        cluster.close(timeout=CLOSE_S)
    except Exception:  # (distributed's TimeoutError, or a close that failed half-way)
        for child in multiprocessing.active_children():  # the workers are this process's children (Nanny)
            with contextlib.suppress(Exception):
                child.kill()


@contextlib.contextmanager
def _own_scratch() -> Iterator[str]:
    """A folder of the build's own for its own cluster's local directory (scheduler and workers), removed
    when the cluster has closed (the build's end, an error, Ctrl-C). Dask's default, shared
    ``$TMPDIR/dask-scratch-space``, kept its lock files after every build. Made where Dask's
    ``temporary-directory`` setting says (a user's fast local disk), else in ``$TMPDIR``."""
    import dask

    where = dask.config.get("temporary-directory", None) or None
    with tempfile.TemporaryDirectory(prefix="cachebuild-dask-", dir=where, ignore_cleanup_errors=True) as scratch:
        yield scratch


@contextlib.contextmanager
def _children_ignore_ctrl_c() -> Iterator[None]:
    """Processes started in the block ignore SIGINT (an ignored signal stays ignored across fork and exec,
    and Python then installs no ``KeyboardInterrupt`` handler): the build's own Dask workers, which a
    terminal's Ctrl-C reached with the build. This process ignores it too meanwhile (the cluster's few
    seconds of start-up); only the main thread can change it, so from another thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _quiet_worker_asyncio() -> Iterator[None]:
    """The build's own local Dask workers start with asyncio's logger at CRITICAL (read from the environment
    when they import dask): a worker closing on a loaded machine can time out flushing its comm and print
    asyncio's "Future exception was never retrieved ... TimeoutError" to the user's stderr, beside the
    build's one-line error. A user's own ``DASK_LOGGING__ASYNCIO`` is kept."""
    key = "DASK_LOGGING__ASYNCIO"
    if key in os.environ:
        yield
        return
    os.environ[key] = "critical"
    try:
        yield
    finally:
        os.environ.pop(key, None)


class _JobError:
    """An exception a job raised, returned as its value: a failed Dask task logs its traceback on the worker."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Stopped:
    """What a job returns when its build had stopped: it wrote nothing (or removed what it had begun)."""


def _run_pickled(blob: bytes, token: str) -> Any:
    """Run a job that came as cloudpickle bytes: ``(fn, item, args)`` -> ``fn(item, *args)``, unless its build
    has stopped: the job asks the build's ``Event`` (named ``token``) between blocks (the first time
    ``CHECK_EVERY_S`` after it began) and right before its shard is renamed into place
    (:mod:`cachebuild.builder.stop`): one round trip to the scheduler for a short shard."""
    import pickle

    from distributed import Event

    stop = Event(token)
    fn, item, args = pickle.loads(blob)
    try:
        with stop_check(stop.is_set):
            return fn(item, *args)
    except BuildStopped:
        return _Stopped()
    except Exception as exc:
        return _JobError(exc)


def _load_pickled(blob: bytes) -> None:
    """Load a job without running it (the probe)."""
    import pickle

    pickle.loads(blob)


def _probe_dask_workers(client: Any, blob: bytes, address: str | None) -> None:
    """Load one job on one worker; a failure or no answer is one ConfigError."""
    where = f"the Dask cluster at {address}" if address else "the local Dask cluster"
    future = client.submit(_load_pickled, blob, pure=False)
    try:
        future.result(timeout=PROBE_TIMEOUT_S)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"the workers of {where} cannot load the build's job: {type(exc).__name__}: {exc} (install cachebuild and your source's module on every worker, e.g. on their PYTHONPATH)"
        ) from None
    except TimeoutError:
        raise ConfigError(f"no worker of {where} ran a probe task within {PROBE_TIMEOUT_S:.0f} s: does the cluster have workers, and cachebuild installed on its scheduler and workers?") from None
    finally:
        future.release()


def _dask_jobs(fn: Callable[..., Any], items: Sequence[Any], args: tuple, address: str | None, workers: int) -> Iterator[Any]:
    """``fn(item, *args)`` for every item as one Dask task each, yielded as they finish."""
    import cloudpickle
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    with _dask_client(address, workers) as client:
        _probe_dask_workers(client, cloudpickle.dumps((fn, items[0], args)), address)
        token = f"cachebuild-build-{uuid.uuid4().hex}"
        futures = [client.submit(_run_pickled, cloudpickle.dumps((fn, item, args)), token, pure=False) for item in items]
        try:
            item_of = {f.key: item for f, item in zip(futures, items)}
            for future in as_completed(futures, loop=client.loop):
                try:
                    result = future.result()
                except KilledWorker as exc:  # every worker that ran it died (memory, a crash in native code)
                    name = getattr(item_of[future.key], "name", "a shard")
                    raise CacheBuildError(
                        f"the Dask task building {name} killed every worker that ran it ({' '.join(str(exc).split()[:12])} ...): out of memory, or a crash in native code? (rerun the same command to resume)"
                    ) from None
                if isinstance(result, _JobError):
                    raise result.exc
                yield result
        finally:
            if not all(f.done() for f in futures):  # an error, an interrupt, a caller that left early
                with contextlib.suppress(OSError):  # (the scheduler is gone, and its tasks with it: the first error stands)
                    _stop_dask_jobs(client, futures, token)


def _stop_dask_jobs(client: Any, futures: list[Any], token: str) -> None:
    """Stop the build's tasks on the cluster: nothing they write may appear after the build returns.

    Cancelling a Dask future drops a task that has not started, but one already
    running on a worker runs to its end (Dask cannot interrupt a thread) and
    would write its shard after the build returned. So the build's ``Event`` is
    set first; the tasks the scheduler has not handed to a worker are
    cancelled; those it has (running, or next in a worker's queue) are waited
    for, at most :data:`STOP_WAIT_S`: a running one stops at its next block (or
    before its shard is renamed into place) and removes its temporary file, one
    not started returns at once. A task handed out after the scheduler was
    asked found the event already set when it started. A second Ctrl-C ends the
    wait at once (the tasks still never publish a shard).
    """
    from distributed import Event

    Event(token, client=client).set()
    handed = {key for keys in client.processing().values() for key in keys}
    client.cancel([f for f in futures if f.key not in handed])
    running = [f for f in futures if f.key in handed and not f.done()]
    try:
        if not _all_done(client, running, QUIET_WAIT_S):
            announce_wait(_executing(client, running) or sum(not f.done() for f in running), "to stop at their next block on the Dask cluster (they publish nothing)")
            if not _all_done(client, running, STOP_WAIT_S):
                left = sum(not f.done() for f in running)
                warnings.warn(f"{left} shard task(s) still running on the Dask cluster {STOP_WAIT_S:.0f} s after the build stopped; they will not publish their shards", RuntimeWarning, stacklevel=3)
    except KeyboardInterrupt:  # Ctrl-C (a second one, if the first stopped the build): stop waiting; the error that stopped the build stands
        pass
    finally:
        client.cancel(running)


def _executing(client: Any, futures: list[Any]) -> int:
    """How many of ``futures`` are being run now: those handed to a worker, at most its threads each (the rest
    wait in its queue and end at once)."""
    left = {f.key for f in futures if not f.done()}
    threads = client.nthreads()
    return sum(min(sum(key in left for key in keys), threads.get(worker, 1)) for worker, keys in client.processing().items())


def _all_done(client: Any, futures: list[Any], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``futures`` to finish; whether they all did."""
    from distributed import as_completed

    try:
        for _ in as_completed(futures, loop=client.loop, timeout=timeout):
            pass
    except TimeoutError:
        return False
    return True


def _thread_jobs(fn: Callable[..., Any], items: Sequence[Any], args: tuple, n: int) -> Iterator[Any]:
    """``fn(item, *args)`` on ``n`` threads, in completion order; on an error (or the caller's
    interrupt, or the caller leaving early) the jobs not started are cancelled and the running
    ones stop at their next block without publishing (:mod:`cachebuild.builder.stop`; they used to
    finish their shard: a minute at 256 MB, in silence) and are waited for, so nothing writes after
    this returns."""
    stop = threading.Event()

    def job(item: Any) -> Any:
        with stop_check(stop.is_set):
            try:
                return fn(item, *args)
            except BuildStopped:
                return _Stopped()

    with ThreadPoolExecutor(n, thread_name_prefix="cachebuild-shard") as pool:
        futures = [pool.submit(job, item) for item in items]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            if not all(fut.done() for fut in futures):
                stop.set()
                started = [fut for fut in futures if not fut.cancel()]  # (a cancelled future counts as done for wait() only once a thread drew it)
                with contextlib.suppress(KeyboardInterrupt):  # (a second Ctrl-C: the threads stop at their next block anyway)
                    _, running = wait(started, timeout=QUIET_WAIT_S)
                    if running:
                        announce_wait(len(running), "to stop at their next block (they publish nothing)")
        # (leaving the with-block joins the threads: each stops at its next block)


def _loky_job(fn: Callable[..., Any], item: Any, *args: Any) -> Any:
    """``fn(item, *args)`` in a loky worker process that exits if the build's process dies (:mod:`cachebuild.builder.orphan`)."""
    exit_with_parent()
    return fn(item, *args)


def run_jobs(fn: Callable[..., Any], items: Sequence[Any], args: tuple, backend: str, workers: int | None, address: str | None = None, quiet: bool = False) -> Generator[Any, None, None]:
    """Yield ``fn(item, *args)`` for every item, in completion order (``quiet``: the cluster's own log lines,
    Ray's, errors only)."""
    from joblib import Parallel, delayed, parallel_config

    if backend not in BACKENDS:
        raise ConfigError.bad_value("backend", backend, f"must be one of {', '.join(BACKENDS)}")
    if not items:
        return
    n = min(workers or os.cpu_count() or 1, len(items))
    if backend == "loky" and n <= 1:
        for item in items:
            yield fn(item, *args)
        return
    if backend == "threading":
        yield from _thread_jobs(fn, items, args, n)
        return
    if backend == "dask":
        yield from _dask_jobs(fn, items, args, address, n)
    elif backend == "ray":
        from cachebuild.builder.ray_jobs import ray_jobs

        yield from ray_jobs(fn, items, args, address, min(workers, len(items)) if workers else None, quiet)
    else:
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        try:
            with parallel_config(backend=backend, n_jobs=n):
                yield from Parallel(return_as="generator_unordered")(delayed(_loky_job)(fn, item, *args) for item in items)
        except TerminatedWorkerError as exc:  # a worker process died (the OS killed it for memory, a crash in native code)
            codes = re.search(r"exit codes of the workers are (\{[^}]*\})", str(exc))
            raise CacheBuildError(
                f"a build worker process died while writing shards (exit codes {codes.group(1) if codes else 'unknown'}): out of memory (try fewer --workers), or a crash in native code; rerun the same command to resume"
            ) from None
