"""A download writes into the very file its reservation made (the local cache's limit holds at every moment),
and the processes of a node download a shard once.

Found by the acceptance audit of issue 6: 2 gloo ranks x 2 DataLoader workers streaming from a real
``http.server`` through one 20 MB ``cache_dir``, sampled under the folder's own lock, held 20.8 MB
(7 shards, no download in flight) in 1 of 4 runs. A download removed its reserved ``.part-`` file
and made it again before writing (``open_tmp``); another process reserving in that moment did not
count it, so two downloads were let in where one fit. Real HTTP server on 127.0.0.1; the
reservation gets a second (hard) link, which shows whether the bytes went into the reserved file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from loaders.localcache import LocalShardCache
from loaders.remote import RemoteOptions, ShardFetcher, fetch_manifest
from remote_fixtures import serve_folder, serve_hostile

REPO = Path(__file__).resolve().parent.parent


class _LinkedReservations(LocalShardCache):
    """The real cache; each reservation also gets a hard link in ``side`` (the file itself, not a copy)."""

    side: Path

    def reserve(self, name: str, size: int, keep: set[str]) -> Path:
        tmp = super().reserve(name, size, keep)
        os.link(tmp, self.side / name)
        return tmp

    def claim(self, name: str, size: int, keep: set[str]) -> Path | None:
        tmp = super().claim(name, size, keep)
        if tmp is not None:
            os.link(tmp, self.side / name)
        return tmp


def test_a_download_fills_the_file_its_reservation_made(toy_cache: Path, tmp_path: Path) -> None:
    opts = RemoteOptions(cache_dir=str(tmp_path / "local"), cache_limit_bytes=1 << 30, prefetch=0, timeout_s=5.0, retries=0)
    with serve_folder(toy_cache) as (url, _):
        m = fetch_manifest(url, opts)
        f = ShardFetcher(url, m, opts)
        cache = _LinkedReservations(f.cache.folder, f.cache.limit)
        cache.side = tmp_path / "side"
        cache.side.mkdir()
        f.cache = cache
        tar, idx = f.get(0)
        f.close()
    for local in (tar, idx):
        reserved = cache.side / local.name
        assert os.stat(reserved).st_ino == os.stat(local).st_ino, f"{local.name}: written into another file than the one reserved"
        assert reserved.read_bytes() == (toy_cache / local.name.split("-", 1)[1]).read_bytes()


FETCH_ONE = """
import sys, time
from pathlib import Path
from loaders.remote import RemoteOptions, ShardFetcher, fetch_manifest
url, cache_dir, go = sys.argv[1:4]
opts = RemoteOptions(cache_dir=cache_dir, cache_limit_bytes=1 << 30, prefetch=0, timeout_s=10.0, retries=0)
m = fetch_manifest(url, opts)
f = ShardFetcher(url, m, opts)
while not Path(go).exists():
    time.sleep(0.005)
tar, _ = f.get(0)
print(tar, flush=True)
"""


def _slow(path: Path, delay_s: float):
    """A trick: wait ``delay_s``, then send the file (a download that takes a while)."""
    body = path.read_bytes()

    def trick(h) -> None:
        time.sleep(delay_s)
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return trick


def test_processes_of_a_node_download_a_shard_once(toy_cache: Path, tmp_path: Path) -> None:
    """Two processes (two ranks, or two DataLoader workers) needing the same shard at the same time: one
    download, which the other waits for (2 ranks x 2 workers fetched a 23-shard cache 47-65 times)."""
    asked: list[str] = []
    tar_name = "shard-00000.tar"
    slow = _slow(toy_cache / tar_name, 1.0)

    def counted(h) -> None:
        asked.append(h.path)
        slow(h)

    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with serve_hostile(toy_cache, {tar_name: counted}) as url:
        procs = [subprocess.Popen([sys.executable, "-c", FETCH_ONE, url, str(tmp_path / "local"), str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        time.sleep(0.5)  # (both have read the manifest: they ask for the shard within milliseconds)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and Path(paths.pop()).read_bytes() == (toy_cache / tar_name).read_bytes()
    assert len(asked) == 1, asked
