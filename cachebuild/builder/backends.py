"""Run shard jobs on a joblib backend: loky (local processes), threading, Dask or Ray.

Dask: with an address, joblib's Dask backend connects to that scheduler; without
one, a ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1 is
started for the build and closed after it (its HTTP server on a free port: the
default 8787 may be another cluster's, and Dask then warns). Ray: ``ray.init(address)`` (or a
local Ray) and Ray's joblib backend.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Sequence

from cachebuild.errors import ConfigError

__all__ = ["BACKENDS", "run_jobs"]

BACKENDS = ("loky", "threading", "dask", "ray")
PROBE_TIMEOUT_S = 120.0


@contextlib.contextmanager
def _dask_client(address: str | None, workers: int) -> Iterator[Any]:
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ConfigError("backend 'dask' needs the dask extra: pip install 'cachebuild[dask]'") from exc
    if address:
        client = Client(address, set_as_default=False)
        try:
            yield client
        finally:
            client.close()
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client


def _run_pickled(blob: bytes) -> Any:
    """Run a job that came as cloudpickle bytes: ``(fn, item, args)`` -> ``fn(item, *args)``."""
    import pickle

    fn, item, args = pickle.loads(blob)
    return fn(item, *args)


def _probe_dask_workers(client: Any, blob: bytes, address: str | None) -> None:
    """Unpickle one job on one worker; a failure or no answer is one ConfigError."""
    import pickle

    where = f"the Dask cluster at {address}" if address else "the local Dask cluster"
    future = client.submit(pickle.loads, blob, pure=False)
    try:
        future.result(timeout=PROBE_TIMEOUT_S)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"the workers of {where} cannot load the build's job: {type(exc).__name__}: {exc} (install cachebuild and your source's module on every worker, e.g. on their PYTHONPATH)"
        ) from None
    except TimeoutError:
        raise ConfigError(f"no worker of {where} ran a probe task within {PROBE_TIMEOUT_S:.0f} s: does the cluster have workers?") from None
    finally:
        future.release()


@contextlib.contextmanager
def _ray_session(address: str | None) -> Iterator[None]:
    try:
        import ray
        from ray.util.joblib import register_ray
    except ImportError as exc:
        raise ConfigError("backend 'ray' needs the ray extra: pip install 'cachebuild[ray]'") from exc
    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started = True
    register_ray()
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_jobs(fn: Callable[..., Any], items: Sequence[Any], args: tuple, backend: str, workers: int | None, address: str | None = None) -> Iterator[Any]:
    """Yield ``fn(item, *args)`` for every item, in completion order."""
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
    jobs = (delayed(fn)(item, *args) for item in items)
    if backend == "dask":
        import cloudpickle

        blobs = (cloudpickle.dumps((fn, item, args)) for item in items)
        with _dask_client(address, n) as client, parallel_config(backend="dask", client=client):
            _probe_dask_workers(client, cloudpickle.dumps((fn, items[0], args)), address)
            yield from Parallel(n_jobs=-1, return_as="generator_unordered")(delayed(_run_pickled)(b) for b in blobs)
    elif backend == "ray":
        # Ray's joblib backend cannot stream results: they arrive when all are done.
        with _ray_session(address), parallel_config(backend="ray", n_jobs=n):
            yield from Parallel(return_as="list")(jobs)
    else:
        with parallel_config(backend=backend, n_jobs=n):
            yield from Parallel(return_as="generator_unordered")(jobs)
