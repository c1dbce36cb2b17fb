"""A wrong Ray address (or Dask scheduler) fails in seconds with one line, before the build touches its output.

It was Ray retrying inside ``ray.init`` for minutes (a closed port, an unknown host: > 200 s
measured), or a traceback after ``build.json`` was written (a malformed address). Real sockets:
a free port on 127.0.0.1 nobody listens on, a ``.invalid`` host (RFC 6761: never resolves),
a server that accepts TCP and never answers, and a real Ray head in another process.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from cachebuild.builder.cluster_check import check_dask_address, check_ray_address, ray_connect_env, ray_connects, ray_target
from cachebuild.errors import ConfigError
from conftest import build_toy
from ports import free_port
from ray_head import ray_head as start_ray_head

REPO = Path(__file__).resolve().parent.parent
FAST_S = 30.0
"""A generous bound for "fails fast": the checks take well under a second; Ray took minutes."""
NO_RAY_BOUND_S = 45.0
"""The bound on a port that accepts TCP but is no Ray, at 1 s timeouts: 2 attempts took 9 s (11 s on a
loaded machine), Ray's own 20 attempts 82 s."""


def _closed_port() -> int:
    port = free_port()
    with pytest.raises(OSError):  # nobody listens there (else the test would prove nothing)
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    return port


def _generate(out: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    args = [sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", "40", "-o", str(out), "-q", *extra]
    t0 = time.perf_counter()
    res = subprocess.run(args, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, capture_output=True, text=True, timeout=300)
    return res, time.perf_counter() - t0


def _one_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, f"rc={res.returncode}\nstdout:\n{res.stdout[-2000:]}\nstderr:\n{res.stderr[-4000:]}"
    return lines[0]


def _hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


# --- the address as Ray reads it (no Ray needed) ---------------------------------------------


@pytest.mark.parametrize(
    "address, says",
    [
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:", "port '' is not a number"),
        ("127.0.0.1:notaport", "port 'notaport' is not a number"),
        ("127.0.0.1:70000", "port '70000' is not a number from 1 to 65535"),
        ("ray://127.0.0.1", "expected HOST:PORT"),
        ("http://127.0.0.1:8265", "scheme 'http://' is not supported"),
        ("a:b:c", "expected HOST:PORT"),
        ("[::1", "expected HOST:PORT"),
    ],
)
def test_a_malformed_address_names_the_form(address: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"^bad Ray address ") as err:
        check_ray_address(address)
    assert address in str(err.value) and says in str(err.value) and "ray://HOST:PORT" in str(err.value)


def test_closed_port_and_unknown_host_fail_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = _closed_port()
    for address, says in [
        (f"127.0.0.1:{port}", f"TCP connection to 127.0.0.1 port {port}: connection refused"),
        (f"ray://127.0.0.1:{port}", f"TCP connection to 127.0.0.1 port {port}: connection refused"),
        ("no-such-head.invalid:6379", "cannot resolve host 'no-such-head.invalid'"),
        ("ray://no-such-head.invalid:10001", "cannot resolve host 'no-such-head.invalid'"),
    ]:
        t0 = time.perf_counter()
        with pytest.raises(ConfigError) as err:
            check_ray_address(address)
        assert time.perf_counter() - t0 < FAST_S
        assert str(err.value).startswith(f"cannot reach the Ray cluster at {address}: {says}"), str(err.value)


def test_ray_address_stands_in_for_none_and_auto_as_in_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_target(None) is None and ray_target("local") is None and not ray_connects(None) and not ray_connects("local")
    assert ray_target("h:1") == ("h:1", "--address") and ray_connects("h:1")
    monkeypatch.setenv("RAY_ADDRESS", "envhost:6379")
    assert ray_target(None) == ray_target("auto") == ("envhost:6379", "RAY_ADDRESS") and ray_connects(None)
    assert ray_target("h:1") == ("h:1", "--address") and ray_target("local") is None  # an explicit address wins, as in Ray
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"^cannot reach the Ray cluster at 127\.0\.0\.1:{port} \(from RAY_ADDRESS\): "):
        check_ray_address(None)


def test_connect_settings_keep_the_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.setenv("RAY_py_gcs_connect_timeout_s", "99")
    assert ray_connect_env() == {"RAY_gcs_server_port_wait_time_s": "2"}


# --- the CLI, end to end ---------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_cli_wrong_address_is_one_line_in_seconds_and_the_old_cache_stays(tmp_path: Path) -> None:
    """--overwrite with another recipe would have removed the old cache before Ray was reached."""
    pytest.importorskip("ray")
    out = tmp_path / "cache"
    res, _ = _generate(out, "-j", "1")
    assert res.returncode == 0, res.stderr
    before = _hashes(out)
    port = _closed_port()
    cases = [
        (f"127.0.0.1:{port}", f"error: cannot reach the Ray cluster at 127.0.0.1:{port}: TCP connection to 127.0.0.1 port {port}: connection refused"),
        ("head.invalid:6379", "error: cannot reach the Ray cluster at head.invalid:6379: cannot resolve host 'head.invalid'"),
        ("head:port", "error: bad Ray address head:port: port 'port' is not a number"),
    ]
    for address, says in cases:
        res, took = _generate(out, "--seed", "7", "--overwrite", "--backend", "ray", "--address", address)
        assert _one_line(res).startswith(says), res.stderr
        assert took < FAST_S, f"{address}: {took:.1f} s"
        assert _hashes(out) == before, address
    res, took = _generate(tmp_path / "fresh", "--backend", "ray", env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert _one_line(res).startswith(f"error: cannot reach the Ray cluster at 127.0.0.1:{port} (from RAY_ADDRESS): "), res.stderr
    assert took < FAST_S and not (tmp_path / "fresh").exists()


@pytest.mark.timeout(240)
def test_cli_unreachable_dask_scheduler_keeps_the_old_cache(tmp_path: Path) -> None:
    """Dask's own 30 s wait came after --overwrite had removed the old cache."""
    pytest.importorskip("distributed")
    out = tmp_path / "cache"
    res, _ = _generate(out, "-j", "1")
    assert res.returncode == 0, res.stderr
    before = _hashes(out)
    port = _closed_port()
    for address, says in [(f"tcp://127.0.0.1:{port}", "TCP connection to 127.0.0.1 port"), ("tcp://sched.invalid:8786", "cannot resolve host"), ("127.0.0.1", "expected [tcp://]HOST:PORT")]:
        res, took = _generate(out, "--seed", "7", "--overwrite", "--backend", "dask", "--scheduler", address)
        line = _one_line(res)
        assert line.startswith((f"error: cannot reach the Dask scheduler at {address}: {says}", f"error: bad Dask scheduler address {address}: {says}")), line
        assert took < FAST_S and _hashes(out) == before, f"{address}: {took:.1f} s"


def test_dask_forms_it_does_not_know_are_left_to_dask() -> None:
    check_dask_address("inproc://whatever")  # not a TCP address: Dask checks it when it connects
    with pytest.raises(ConfigError, match=r"^bad Dask scheduler address tcp://h:x: "):
        check_dask_address("tcp://h:x")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (not Ray)."""
    server = socket.create_server(("0.0.0.0", free_port()))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_port_that_is_no_ray_is_bounded_and_one_line(tmp_path: Path, silent_server: int) -> None:
    """The TCP check passes; Ray's own wait is bounded (by default ~40 s: 2 attempts; Ray's default is 20 of
    ~40 s). The user's own ``RAY_py_gcs_connect_timeout_s`` is kept (``ray_connect_env``), and Ray's
    ``gcs_rpc_server_connect_timeout_s`` (5 s by default) is one the build never sets: this run shortens
    both to 1 s, so an attempt takes ~4 s (9 s in all, measured; 28 s with the build's default 10 s an
    attempt, 30 s with 3 s and Ray's 5 s). The attempts stay the build's own 2: with Ray's 20 the same run
    took 82 s, past ``NO_RAY_BOUND_S``. The default values and keeping the user's are checked by
    ``test_connect_settings_keep_the_users_own`` and the settings test below."""
    pytest.importorskip("ray")
    quick = {"RAY_py_gcs_connect_timeout_s": "1", "RAY_gcs_rpc_server_connect_timeout_s": "1"}
    res, took = _generate(tmp_path / "out", "--backend", "ray", "--address", f"127.0.0.1:{silent_server}", env=quick)
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    assert res.returncode == 2 and last.startswith(f"error: cannot connect to the Ray cluster at 127.0.0.1:{silent_server}: "), res.stderr[-4000:]
    assert "Traceback" not in res.stderr and took < NO_RAY_BOUND_S, f"{took:.1f} s\n{res.stderr[-4000:]}"


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[str]:
    """A real Ray head (``ray.init`` in another process, its own session), its GCS address; killed after."""
    pytest.importorskip("ray")
    with start_ray_head(tmp_path / "head.err", {**os.environ, "RAY_AUTH_MODE": "disabled"}, num_cpus=2) as address:
        yield address


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_real_ray_head_by_address_builds_the_same_bytes(tmp_path: Path, toy_cache: Path, ray_head: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check lets a real cluster through (by its address and by 127.0.0.1), and the bounded settings connect."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    check_ray_address(f"127.0.0.1:{ray_head.rsplit(':', 1)[1]}")
    settings = ray_connect_env()
    assert settings  # none of them set here: the build sets them while it connects
    summary = build_toy(tmp_path / "r", workers=2, backend="ray", address=ray_head)
    assert summary.built == summary.shards
    assert _hashes(tmp_path / "r") == _hashes(toy_cache)
    assert not set(settings) & set(os.environ)  # and takes them back
