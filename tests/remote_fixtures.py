"""Remote-cache test helpers: a real HTTP server on 127.0.0.1 serving a folder, a moto S3
server on 127.0.0.1, and the body of a DDP rank that streams a remote cache.

The rank body lives here so that ``torch.multiprocessing.spawn`` children can import it.
"""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from gloo_rank import gloo_rank
from ports import free_port


class _QuietHandler(SimpleHTTPRequestHandler):
    requests: list[str] | None = None

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        if self.requests is not None:
            self.requests.append(self.path)
        super().do_GET()


@contextmanager
def serve_folder(folder: Path, requests: list[str] | None = None) -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """Serve ``folder`` over HTTP on a free loopback port; yields (base URL, server).

    ``requests``: a list the server appends each GET's path to (what was fetched).
    """
    handler = functools.partial(type("_Handler", (_QuietHandler,), {"requests": requests}), directory=str(folder))
    with _running(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}", server


@contextmanager
def _running(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """``server`` serving on a daemon thread until the block ends (then shut down and closed)."""
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def moto_s3(bucket: str = "cachebuild-test") -> Iterator[tuple[Any, dict]]:
    """A moto S3 server on 127.0.0.1 with ``bucket``; yields (s3fs filesystem, its storage options).

    The options are explicit (key, secret, endpoint) so that worker processes need no environment.
    """
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        import s3fs

        options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"}}
        fs = s3fs.S3FileSystem(**options)
        fs.call_s3("create_bucket", Bucket=bucket)  # (fs.mkdir would send us-east-1 as a location constraint)
        fs.invalidate_cache()
        yield fs, options
    finally:
        proc.terminate()
        proc.wait(10)


def remote_rank_main(rank: int, world: int, port: int, url: str, out_dir: str, remote: Any, batch_size: int, num_workers: int) -> None:
    """One DDP rank (gloo on loopback) streaming the remote cache ``url`` (graphs view, epoch 1),
    with an all_reduce per step. Writes ``out_dir/rank{r}.json``: ids, pad flags and digest of every batch, steps, len."""
    import hashlib

    import torch
    import torch.distributed as dist

    from loaders import ShardStream, make_loader

    with gloo_rank(rank, world, port, out_dir) as result:
        stream = ShardStream(url, view="graphs", batch_size=batch_size, shuffle=True, seed=3, remote=remote)
        # fork: a spawned rank's default start method is spawn, which re-imports torch per worker
        loader = make_loader(stream, num_workers=num_workers, prefetch_factor=2, multiprocessing_context="fork" if num_workers else None)
        loader.set_epoch(1)
        batches, steps = [], 0
        for batch in loader:
            h = hashlib.sha256()
            for k, v in batch.items():
                h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
                h.update(v.numpy().tobytes())
            batches.append((batch["record_id"].tolist(), batch["is_pad"].tolist(), h.hexdigest()))
            t = torch.tensor([float(batch["is_pad"].logical_not().sum())])
            dist.all_reduce(t)  # a rank with fewer steps would hang here
            steps += 1
        result.update({"batches": batches, "steps": steps, "len": len(loader)})


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client that hangs up on a trick is expected
        pass


class _HostileHandler(SimpleHTTPRequestHandler):
    """Serves a folder, except for paths whose last part ``tricks`` maps to a misbehaviour."""

    tricks: dict[str, Any] = {}

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        trick = self.tricks.get(name)
        if trick is None:
            return super().do_GET()
        trick(self)


@contextmanager
def serve_hostile(folder: Path, tricks: dict[str, Any]) -> Iterator[str]:
    """Like :func:`serve_folder`, but a GET whose file name is a key of ``tricks`` is answered by
    ``tricks[name](handler)`` (a misbehaving server: errors, cut bodies, wrong bytes, stalls, redirects).
    ``tricks`` may be changed while the server runs."""
    handler = functools.partial(type("_Hostile", (_HostileHandler,), {"tricks": tricks}), directory=str(folder))
    with _running(_QuietServer(("127.0.0.1", 0), handler)) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


def send_bytes(body: bytes, length: int | None = None, status: int = 200, headers: dict[str, str] | None = None):
    """A trick: answer ``status`` with ``body`` and a Content-Length of ``length`` (default: the body's)."""

    def trick(h: SimpleHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()
        h.close_connection = True

    return trick
