"""A free TCP port on 127.0.0.1 for a server a test starts in another process (a DDP rendezvous, moto, Lightning).

Why not ``bind(("", 0))``: that hands out a port from the kernel's ephemeral range,
the same range every *outgoing* connection takes its local port from. Between the
check and the server's own bind (a DDP rank starting up takes seconds), any
connection in the test process (a Dask cluster's heartbeats, an HTTP client) may
take that port, and the server fails with "address already in use" (or a rank
waits on a rendezvous nobody hosts). A port below the ephemeral range is only ever
taken by an explicit bind, so a random free one there stays free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port below the ephemeral range that nothing listens on now (random, so parallel runs differ)."""
    high = _ephemeral_low() - 1
    low = max(1024, min(20000, high - 4096))
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range: let the kernel pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
