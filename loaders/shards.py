"""Where a remote cache's shards come from: :class:`RemoteFiles`, a locator for
:class:`cachebuild.format.reader.ShardSet`.

Opening and checking a shard (sizes, index sha256, index against manifest and
tar, member keys) and unmapping it live once, in :mod:`cachebuild.format.reader`;
this module only says where the files are. ``http(s)://``, ``s3://``, any fsspec
URL: each shard is fetched into a bounded local cache directory, checksummed on
arrival, by :class:`loaders.remote.ShardFetcher`, then opened like a local one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, TypeVar

from cachebuild.errors import CacheBuildError, RemoteError
from cachebuild.format.manifest import Manifest
from loaders.remote import RemoteOptions, ShardFetcher

__all__ = ["RemoteFiles"]

T = TypeVar("T")

_EVICTED_ATTEMPTS = 5  # x the fetcher's own 3 (loaders.remote.ShardFetcher.open)


class RemoteFiles:
    """Shards at a URL, fetched (ahead of use, in plan order) into a bounded local cache directory.

    Built in the process that reads (its fetcher's threads do not survive a fork).
    """

    remote = True

    def __init__(self, url: str, manifest: Manifest, options: RemoteOptions | None = None):
        self.root = str(url).rstrip("/")
        self.manifest = manifest
        self.fetcher = ShardFetcher(self.root, manifest, options or RemoteOptions())

    def open(self, s: int, opener: Callable[[Path, Path], T]) -> T:
        return self._evictable(s, lambda: self.fetcher.open(s, opener))

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T:
        """``reader(index)`` on shard ``s``'s index alone (fetched and checked, not its tar): what views' ``bind`` reads."""
        return self._evictable(s, lambda: reader(self.fetcher.fetch_index(s)))

    def _evictable(self, s: int, action: Callable[[], T]) -> T:
        """``action()``, again while another process sharing the local cache evicts the files between fetch and open."""
        for attempt in range(_EVICTED_ATTEMPTS):
            try:
                return action()
            except FileNotFoundError as exc:  # (first: a ManifestError for a missing file is one too)
                if attempt == _EVICTED_ATTEMPTS - 1:
                    cache = self.fetcher.cache
                    raise RemoteError(
                        f"{self.root}/{self.manifest.shards[s].name}: evicted from the local cache {cache.folder} before it could be "
                        f"opened, {_EVICTED_ATTEMPTS} times in a row; its limit ({cache.limit} bytes) is too small for the processes "
                        f"sharing it (allow at least processes x (prefetch + 1) x shard size)"
                    ) from exc
                time.sleep(0.02 * (attempt + 1))
            except CacheBuildError as exc:  # checked in the local copy: name the file by its URL
                if str(self.fetcher.cache.folder) not in str(exc):
                    raise
                raise type(exc)(self.fetcher.local_to_url(str(exc))) from exc
        raise AssertionError("unreachable")

    def plan(self, shard_order: list[int]) -> None:
        self.fetcher.plan(shard_order)

    def close(self) -> None:
        self.fetcher.close()
