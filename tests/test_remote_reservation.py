"""A download writes into the very file its reservation made: the local cache's limit holds at every moment.

Found by the acceptance audit of issue 6: 2 gloo ranks x 2 DataLoader workers streaming from a real
``http.server`` through one 20 MB ``cache_dir``, sampled under the folder's own lock, held 20.8 MB
(7 shards, no download in flight) in 1 of 4 runs. A download removed its reserved ``.part-`` file
and made it again before writing (``open_tmp``); another process reserving in that moment did not
count it, so two downloads were let in where one fit. Real HTTP server on 127.0.0.1; the
reservation gets a second (hard) link, which shows whether the bytes went into the reserved file.
"""

from __future__ import annotations

import os
from pathlib import Path

from loaders.localcache import LocalShardCache
from loaders.remote import RemoteOptions, ShardFetcher, fetch_manifest
from remote_fixtures import serve_folder


class _LinkedReservations(LocalShardCache):
    """The real cache; each reservation also gets a hard link in ``side`` (the file itself, not a copy)."""

    side: Path

    def reserve(self, name: str, size: int, keep: set[str]) -> Path:
        tmp = super().reserve(name, size, keep)
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
