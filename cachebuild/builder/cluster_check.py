"""Check a cluster's address before a build touches its output: a wrong one fails in seconds.

``ray.init`` given a closed port or an unknown host retries inside Ray for minutes (every attempt
waits out 5 + 5 + 30 s of gRPC timeouts, 20 attempts), a Ray Client address (``ray://``) for
35 s, and a malformed one is a traceback, each after the build has written its ``build.json``
(and, with ``--overwrite``, removed the old cache; the same for an unreachable Dask scheduler,
after Dask's 30 s). So the address the build would hand to Ray is checked first, the way Ray
reads it:

- none (``--address`` not given) or ``local``: a local Ray is started; nothing to check.
  ``RAY_ADDRESS``, when set, stands in for none and for ``auto``, as in ``ray.init``.
- ``auto``: the cluster ``ray start`` last recorded on this machine (Ray's own lookup).
- ``HOST:PORT`` (a cluster's GCS, port 6379 by default on the head) or ``ray://HOST:PORT``
  (Ray Client, port 10001 by default): the port must be a number, the host must resolve within
  ``RESOLVE_TIMEOUT_S`` and accept a TCP connection within ``CONNECT_TIMEOUT_S``.

A Dask scheduler address (``[tcp://|tls://]HOST:PORT``) gets the same resolve and connect.
A failure is one :class:`~cachebuild.errors.ConfigError` (exit code 2, as Dask's always was: the
fix is the flag's value, and exit code 7 is about remote caches) naming the address, where it
came from and what failed. A port that accepts connections but is no Ray (another service) is
still left to Ray; :func:`ray_connect_env` bounds that wait to about 40 s (Ray's own settings).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import threading
from typing import Any

from cachebuild.errors import ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "RESOLVE_TIMEOUT_S", "check_cluster", "check_dask_address", "check_ray_address", "ray_connect_env", "ray_connects", "ray_target"]

CONNECT_TIMEOUT_S = 3.0
RESOLVE_TIMEOUT_S = 5.0
GCS_CONNECT_ATTEMPTS = 2
"""Ray's attempts at a GCS that accepted the TCP connection (Ray's default: 20, each up to ~40 s)."""
GCS_ANSWER_TIMEOUT_S = 10
"""How long one attempt waits for the GCS's first answer (Ray's default: 30 s)."""
FORMS = "HOST:PORT (the head's GCS, port 6379 by default), ray://HOST:PORT (Ray Client, port 10001 by default), auto or local"
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]/\s]+)):(?P<port>[^:]*)$")


def _where(address: str, origin: str) -> str:
    return f"{address} (from {origin})" if origin != "--address" else address


def ray_target(address: str | None) -> tuple[str, str] | None:
    """``(address, origin)`` that ``ray.init(address)`` would connect to, or None for a new local Ray.

    ``origin`` says where the address came from: ``--address``, ``RAY_ADDRESS`` or ``auto``.
    """
    env = os.environ.get("RAY_ADDRESS", "")
    if address in (None, "auto") and env:
        return env, "RAY_ADDRESS"
    if address is None or address == "local":
        return None
    if address == "auto":
        return _auto_address(), "auto"
    return address, "--address"


def _auto_address() -> str:
    """The address ``auto`` means here: the cluster ``ray start`` recorded (Ray's own lookup, fast)."""
    from ray._private import services  # Ray's reading of "auto"; no public equivalent

    try:
        found = services.canonicalize_bootstrap_address("auto")
    except ConnectionError as exc:
        raise ConfigError(f"--address auto found no running Ray cluster on this machine: {' '.join(str(exc).split())}") from None
    if found is None:  # pragma: no cover - Ray returns None only for a local start
        raise ConfigError("--address auto found no running Ray cluster on this machine")
    return str(found)


def _split(address: str, origin: str) -> tuple[str, int]:
    """``(host, port)`` of a ``HOST:PORT`` or ``ray://HOST:PORT`` address, or a ConfigError naming the form."""
    rest = address
    if "://" in address:
        scheme, rest = address.split("://", 1)
        if scheme != "ray":
            raise ConfigError(f"bad Ray address {_where(address, origin)}: scheme '{scheme}://' is not supported; expected {FORMS}")
    m = _HOST_PORT.match(rest.rstrip("/"))
    if m is None:
        raise ConfigError(f"bad Ray address {_where(address, origin)}: expected {FORMS}")
    port = m.group("port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"bad Ray address {_where(address, origin)}: port {port!r} is not a number from 1 to 65535; expected {FORMS}")
    return m.group("v6") or m.group("host"), int(port)


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` bounded by ``RESOLVE_TIMEOUT_S`` (a stuck resolver would block for minutes)."""
    found: list[Any] = []

    def look() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            found.append(exc)

    worker = threading.Thread(target=look, name="cachebuild-resolve", daemon=True)
    worker.start()
    worker.join(RESOLVE_TIMEOUT_S)
    if not found:
        raise TimeoutError(f"cannot resolve host '{host}' within {RESOLVE_TIMEOUT_S:g} s")
    if isinstance(found[0], OSError):
        raise OSError(f"cannot resolve host '{host}': {found[0].strerror or found[0]}")
    return list(found[0])


def _connect(host: str, port: int) -> None:
    """One TCP connection to ``host:port`` (each resolved address tried for ``CONNECT_TIMEOUT_S``), closed at once."""
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(host, port)[:4]:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(sockaddr)
                return
            except TimeoutError:
                last = TimeoutError(f"no answer to a TCP connection within {CONNECT_TIMEOUT_S:g} s")
            except OSError as exc:
                last = OSError(f"TCP connection to {sockaddr[0]} port {port}: {(exc.strerror or str(exc)).lower()}")
    raise last or OSError(f"host '{host}' resolved to no address")


def check_cluster(backend: str, address: str | None) -> None:
    """Raise one ConfigError, before any output is written, if ``backend`` cannot run: Ray or Dask not
    installed, or the cluster at its address unreachable (:func:`check_ray_address`, :func:`check_dask_address`)."""
    if backend not in ("ray", "dask"):
        return
    module, extra = ("ray", "ray") if backend == "ray" else ("distributed", "dask")
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"backend '{backend}' needs the {extra} extra: pip install 'cachebuild[{extra}]'")
    if backend == "ray":
        check_ray_address(address)
    elif address:
        check_dask_address(address)


def check_dask_address(address: str) -> None:
    """A Dask scheduler at ``[tcp://|tls://]HOST:PORT`` must accept a TCP connection (Dask's own wait is 30 s,
    after ``--overwrite`` removed the old cache); other protocols (``ucx://``, ``inproc://``) are Dask's to check."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp", "tls"):
        return
    m = _HOST_PORT.match(rest.rstrip("/"))
    if m is None or not m.group("port").isdigit() or not 1 <= int(m.group("port")) <= 65535:
        raise ConfigError(f"bad Dask scheduler address {address}: expected [tcp://]HOST:PORT, e.g. tcp://10.0.0.5:8786")
    try:
        _connect(m.group("v6") or m.group("host"), int(m.group("port")))
    except OSError as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def check_ray_address(address: str | None) -> None:
    """Raise one ConfigError if the Ray cluster the build would use cannot be reached (see the module docstring)."""
    target = ray_target(address)
    if target is None:
        return
    where, origin = target
    host, port = _split(where, origin)
    try:
        _connect(host, port)
    except OSError as exc:  # TimeoutError too
        raise ConfigError(f"cannot reach the Ray cluster at {_where(where, origin)}: {exc}") from None


def ray_connects(address: str | None) -> bool:
    """Whether ``ray.init(address)`` connects to a running cluster rather than starting a local Ray."""
    return bool(os.environ.get("RAY_ADDRESS")) if address is None else address != "local"


def ray_connect_env() -> dict[str, str]:
    """Settings that bound ``ray.init``'s wait for a GCS that accepted the TCP check but does not answer as
    Ray (Ray's defaults: 20 attempts of up to 40 s). Ray reads ``py_gcs_connect_timeout_s`` when it is
    imported and the attempts in ``ray.init``; a value the user set is kept."""
    wanted = {"RAY_gcs_server_port_wait_time_s": str(GCS_CONNECT_ATTEMPTS), "RAY_py_gcs_connect_timeout_s": str(GCS_ANSWER_TIMEOUT_S)}
    return {key: value for key, value in wanted.items() if key not in os.environ}
