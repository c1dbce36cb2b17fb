"""Shards from remote storage (``http(s)://``, ``s3://``, any fsspec URL) through a
bounded local cache directory.

Each process fetches only the shards its plan needs, in the order it needs them,
a few ahead of use on background threads, into a local folder (NVMe or tmpfs)
whose total size never exceeds its limit: before a download reserves room, the
least recently used complete shards are evicted, under an exclusive file lock
shared by every process on the node. A download lands under a temporary name,
its sha256 is checked against the manifest, and only then is it renamed into
place, so a partial or corrupt download is never used. Network faults are
retried with backoff, then raised as :class:`RemoteError` naming the URL;
every request has a timeout, so a dead server is an error, never a hang.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, TypeVar, cast

from cachebuild.errors import CacheBuildError, ConfigError, RemoteError, ShardCorruptError
from cachebuild.format.limits import MAX_MANIFEST_BYTES
from cachebuild.format.manifest import MANIFEST_NAME, Manifest
from loaders.fetchpool import DaemonPool
from loaders.localcache import LocalShardCache, open_reserved
from loaders.old_layout import sweep_old_layout

T = TypeVar("T")

__all__ = ["is_remote", "RemoteOptions", "check_remote_options", "fetch_manifest", "LocalShardCache", "ShardFetcher"]

_CHUNK = 4 << 20
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"  # reserved characters and existing %-escapes stay as they are
_PROGRESS_BYTES = 1 << 20  # a download must receive this much within each timeout_s
_CLIENT_MODULES = frozenset({"botocore", "aiobotocore", "s3fs", "fsspec", "gcsfs", "adlfs", "aiohttp", "google", "azure"})
"""Packages whose exceptions are a storage client's faults (not OSErrors: botocore's are its own), retried then a ``RemoteError``."""


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for URLs the loader fetches (anything with a scheme other than file://)."""
    s = str(location)
    return "://" in s and not s.startswith("file://")


@dataclass(frozen=True)
class RemoteOptions:
    """How to read a remote cache.

    ``cache_dir``: local folder for fetched shards (default ``$CACHEBUILD_CACHE_DIR``,
    else ``/dev/shm/cachebuild-remote-<uid>`` when /dev/shm exists, else the same name in
    the temp folder: one per user, so users of a node never share or block each other's);
    ``cache_limit_bytes``: the most that folder may hold; ``prefetch``: shards
    fetched ahead of use; ``timeout_s`` per request, and the longest a download may go
    without receiving ``_PROGRESS_BYTES`` (1 MiB; a server trickling bytes is a stall);
    ``retries`` per file.
    """

    cache_dir: str | None = None
    cache_limit_bytes: int = 16 << 30
    prefetch: int = 2
    timeout_s: float = 30.0
    retries: int = 3
    storage_options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        for key, value, ok, allowed in (
            ("cache_limit_bytes", self.cache_limit_bytes, isinstance(self.cache_limit_bytes, int) and self.cache_limit_bytes > 0, "a whole number of bytes > 0"),
            ("prefetch", self.prefetch, isinstance(self.prefetch, int) and self.prefetch >= 0, "a whole number >= 0"),
            ("timeout_s", self.timeout_s, isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0, "seconds > 0"),
            ("retries", self.retries, isinstance(self.retries, int) and self.retries >= 0, "a whole number >= 0"),
        ):
            if not ok or isinstance(value, bool):
                raise ConfigError.bad_value(f"RemoteOptions.{key}", value, allowed)

    def resolved_cache_dir(self, url: str = "") -> Path:
        """The folder fetched files land in: ``<cache_dir>/shards``, the same for every URL.

        One folder under one limit whatever is read through it (a mixture of remote caches, one
        cache under two URLs): files are named after their sha256 (:meth:`ShardFetcher.local_name`),
        so different caches never collide and the same file is fetched once. (Until 2026-11-24 each
        URL had its own ``<16 hex>/`` subfolder, each with the whole limit; :mod:`loaders.old_layout`
        removes those.)"""
        base = self.cache_dir or os.environ.get("CACHEBUILD_CACHE_DIR")
        if not base:
            name = f"cachebuild-remote-{os.getuid()}"
            base = f"/dev/shm/{name}" if Path("/dev/shm").is_dir() else str(Path(tempfile.gettempdir()) / name)
        return Path(base) / "shards"


def check_remote_options(value: object) -> RemoteOptions | None:
    """``ShardStream(..., remote=value)`` checked where it enters: a :class:`RemoteOptions` or None, else
    one ``TypeError`` line (a dict or a cache folder string failed later, deep in a fetch, as an
    ``AttributeError``)."""
    if value is None or isinstance(value, RemoteOptions):
        return value
    fix = "RemoteOptions(**that dict)" if isinstance(value, dict) else "RemoteOptions(cache_dir=...)"
    raise TypeError(f"remote must be a loaders.remote.RemoteOptions or None, got {type(value).__name__} {value!r}: pass remote={fix}")


def _open_url(url: str, opts: RemoteOptions) -> BinaryIO:
    if url.startswith(("http://", "https://")):
        url = urllib.parse.quote(url, safe=_URL_SAFE)  # a space or a non-ASCII letter in the path: escaped, as browsers do
        return cast(BinaryIO, urllib.request.urlopen(url, timeout=opts.timeout_s))  # noqa: S310 - user-given URL
    import fsspec

    return cast(BinaryIO, fsspec.open(url, "rb", **dict(opts.storage_options)).open())


def _with_retries(url: str, opts: RemoteOptions, action: Callable[[], T]) -> T:
    delay = 0.2
    for attempt in range(opts.retries + 1):
        try:
            return action()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (404, 403, 401) or attempt == opts.retries:
                raise RemoteError(_one_line(f"cannot fetch {url}: HTTP {exc.code} {exc.reason}")) from exc
        except (FileNotFoundError, PermissionError) as exc:  # fsspec's 404 / 403 (s3fs): a retry changes nothing
            what = "not found" if isinstance(exc, FileNotFoundError) else "permission denied"
            raise RemoteError(f"cannot fetch {url}: {what} ({exc})") from exc
        except (OSError, TimeoutError, http.client.HTTPException) as exc:  # HTTPException: a broken server (bad status line, ...)
            if attempt == opts.retries:
                what = _one_line(str(exc)) or type(exc).__name__
                raise RemoteError(f"cannot fetch {url} after {opts.retries + 1} attempts: {what}") from exc
        except (ValueError, ImportError) as exc:  # a malformed URL, an fsspec protocol unknown or not installed: final
            if isinstance(exc, CacheBuildError):  # ShardCorruptError: the download's own check
                raise
            raise RemoteError(_one_line(f"cannot fetch {url}: {exc}")) from exc
        except Exception as exc:  # a storage client's own types: botocore's EndpointConnectionError, NoCredentialsError, ...
            if isinstance(exc, CacheBuildError) or type(exc).__module__.split(".")[0] not in _CLIENT_MODULES:
                raise
            if attempt == opts.retries:
                raise RemoteError(f"cannot fetch {url} after {opts.retries + 1} attempts: {type(exc).__name__}: {_one_line(str(exc))}") from exc
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _one_line(text: str) -> str:
    """A server's or library's message on one line (urllib's redirect-loop reason spans three)."""
    return " ".join(text.split())


def _check_http_url(url: str) -> None:
    """Refuse an http(s) cache URL that ``<URL>/<name>`` cannot extend: a ?query or #fragment would swallow the name."""
    if not url.startswith(("http://", "https://")):
        return
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise ConfigError.bad_value("remote cache URL", url, f"a valid URL ({exc})") from exc
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ConfigError.bad_value("remote cache URL", url, "a URL without ?query or #fragment (the files are fetched as <URL>/<name>)")


def _copy_bounded(src: BinaryIO, size: int, timeout_s: float, sink: Callable[[bytes], object]) -> int:
    """Pass at most ``size + 1`` bytes of ``src`` to ``sink``; return how many. A stall (under
    ``_PROGRESS_BYTES`` received within ``timeout_s``, a trickle included) raises TimeoutError:
    ``read1`` returns what arrived, where ``read(n)`` would wait for all n bytes one slow recv at a time."""
    read = src.read1 if isinstance(src, http.client.HTTPResponse) else src.read
    got, since, mark = 0, 0, time.monotonic()
    while got <= size and (chunk := read(min(_CHUNK, size + 1 - got))):
        sink(chunk)
        got += len(chunk)
        since += len(chunk)
        if since >= _PROGRESS_BYTES:
            mark, since = time.monotonic(), 0
        elif time.monotonic() - mark > timeout_s:
            raise TimeoutError(f"stalled: under {_PROGRESS_BYTES} bytes in {timeout_s} s ({got} of {size} bytes)")
    return got


def fetch_manifest(url: str, opts: RemoteOptions = RemoteOptions()) -> Manifest:
    """Download and parse ``URL/manifest.json`` (bounded size; every name in it is checked to be a
    plain file name, so shards are fetched only from under ``url`` and only into the local cache folder)."""
    _check_http_url(url)
    target = f"{url.rstrip('/')}/{MANIFEST_NAME}"

    def get() -> bytes:
        parts: list[bytes] = []
        with _open_url(target, opts) as fh:
            _copy_bounded(fh, MAX_MANIFEST_BYTES, opts.timeout_s, parts.append)  # more than the limit is refused by from_json
        return b"".join(parts)

    return Manifest.from_json(_with_retries(target, opts, get), url.rstrip("/"))


class ShardFetcher:
    """Local paths of a remote cache's shards, fetched on demand and ahead of use."""

    def __init__(self, url: str, manifest: Manifest, opts: RemoteOptions = RemoteOptions()):
        self.url = url.rstrip("/")
        self.manifest = manifest
        self.opts = opts
        self.cache = LocalShardCache(opts.resolved_cache_dir(self.url), opts.cache_limit_bytes)
        sweep_old_layout(self.cache.folder.parent)  # the per-URL folders of before 2026-11-24 (loaders.old_layout)
        self._pool: DaemonPool | None = None
        self._pending: dict[str, Future[tuple[Path, Path]]] = {}
        self._guard = threading.Lock()
        self._wanted: list[int] = []
        self._pos = 0

    @staticmethod
    def local_name(name: str, sha256: str) -> str:
        """A fetched file's name in the local cache: the manifest's name after the start of its
        sha256, so a file of an older cache at the same URL (rebuilt or overwritten, same names
        and sizes) is never taken for this cache's file."""
        return f"{sha256[:16]}-{name}"

    def local_to_url(self, text: str) -> str:
        """``text`` with this fetcher's local paths replaced by the URLs they came from (the
        folder itself stays: "local cache FOLDER is full" is about that folder, not the server)."""
        for e in self.manifest.shards:
            for name, sha in ((e.name, e.sha256), (e.index, e.index_sha256)):
                text = text.replace(str(self.cache.folder / self.local_name(name, sha)), f"{self.url}/{name}")
        return text.replace(f"{self.cache.folder}{os.sep}", f"{self.url}/")

    def _download(self, name: str, size: int, sha256: str, keep: set[str]) -> Path:
        local = self.local_name(name, sha256)
        hit = self.cache.lookup(local, size)
        if hit is not None:
            return hit
        url = f"{self.url}/{name}"
        self.cache.check_fits(local, size)

        def get() -> Path:
            tmp = self.cache.claim(local, size, keep)
            if tmp is None:  # another process of the node is downloading it: its bytes, checked, not a second download
                hit = self.cache.wait_for(local, size, self.opts.timeout_s)
                if hit is not None:
                    return hit
                tmp = self.cache.reserve(local, size, keep)  # that download failed or stalled: our own
            try:
                h = hashlib.sha256()
                with _open_url(url, self.opts) as src, open_reserved(tmp) as dst:

                    def sink(chunk: bytes) -> None:
                        h.update(chunk)
                        dst.write(chunk)

                    got = _copy_bounded(src, size, self.opts.timeout_s, sink)
                    if got > size:
                        raise OSError(f"the server sent more bytes than the manifest's {size} (another file?)")
                    encoding = src.headers.get("Content-Encoding") if isinstance(src, http.client.HTTPResponse) else None
                if got != size:
                    why = f"the server sent it with Content-Encoding {encoding}; serve the files as they are" if encoding else "connection cut?"
                    raise OSError(f"got {got} bytes, manifest says {size} ({why})")
                if h.hexdigest() != sha256:
                    raise ShardCorruptError(f"{url}: sha256 of the downloaded file differs from the manifest (the cache at the URL changed since its manifest was read, or is corrupt there)")
                return self.cache.commit(tmp, local)
            finally:
                tmp.unlink(missing_ok=True)

        return _with_retries(url, self.opts, get)

    def _fetch_shard(self, i: int) -> tuple[Path, Path]:
        e = self.manifest.shards[i]
        keep = self._local_names(i) | self._keep_names()
        idx = self._download(e.index, self._index_size(i), e.index_sha256, keep)
        tar = self._download(e.name, e.bytes, e.sha256, keep)
        return tar, idx

    def _index_size(self, i: int) -> int:
        e = self.manifest.shards[i]
        if e.index_bytes:
            return e.index_bytes
        # Older manifests: an index's size follows exactly from its record count.
        import numpy as np

        from cachebuild.format.index import INDEX_DTYPE, index_bytes

        return len(index_bytes(np.zeros((e.records, len(self.manifest.fields)), INDEX_DTYPE)))

    def fetch_index(self, i: int) -> Path:
        """Local path of shard ``i``'s index alone (views that need only shapes read no tar)."""
        e = self.manifest.shards[i]
        return self._download(e.index, self._index_size(i), e.index_sha256, self._local_names(i) | self._keep_names())

    def _local_names(self, i: int) -> set[str]:
        e = self.manifest.shards[i]
        return {self.local_name(e.name, e.sha256), self.local_name(e.index, e.index_sha256)}

    def _keep_names(self) -> set[str]:
        """The shard in use and the next ones to be used: never evicted by this process."""
        names: set[str] = set()
        for j in self._wanted[self._pos : self._pos + self.opts.prefetch + 1]:
            names |= self._local_names(j)
        return names

    def _submit(self, i: int) -> Future[tuple[Path, Path]]:
        name = self.manifest.shards[i].name
        with self._guard:
            fut = self._pending.get(name)
            if fut is None:
                if self._pool is None:
                    self._pool = DaemonPool(max(1, self.opts.prefetch), "cachebuild-fetch", self.cache.folder)
                fut = self._pool.submit(functools.partial(self._fetch_shard, i))
                self._pending[name] = fut
            return fut

    def plan(self, shard_order: list[int]) -> None:
        """Tell the fetcher which shards will be needed, in order (starts prefetching)."""
        self._wanted = list(shard_order)
        self._pos = 0
        for i in self._wanted[: self.opts.prefetch]:
            self._submit(i)

    def get(self, i: int) -> tuple[Path, Path]:
        """Local (tar, index) paths of shard ``i``, downloading it if needed; prefetches the next ones."""
        if i in self._wanted:
            self._pos = self._wanted.index(i, self._pos) if i in self._wanted[self._pos :] else self._wanted.index(i)
            for j in self._wanted[self._pos + 1 : self._pos + 1 + self.opts.prefetch]:
                self._submit(j)
        fut = self._submit(i)
        try:
            return fut.result()
        finally:
            with self._guard:
                self._pending.pop(self.manifest.shards[i].name, None)

    def open(self, i: int, opener: Callable[[Path, Path], T]) -> T:
        """``opener(tar, index)`` on shard ``i``'s local files; if another process
        evicted them between fetch and open, fetch again (an open mmap is safe)."""
        for attempt in range(3):
            tar, idx = self.get(i)
            try:
                return opener(tar, idx)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "manifest": self.manifest, "opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ShardFetcher.__init__(self, state["url"], state["manifest"], state["opts"])
