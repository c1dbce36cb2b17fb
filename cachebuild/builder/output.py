"""Where a build writes: a local folder, or any fsspec URL (``s3://``, ``file://``, ...).

Shards are always written into a local folder first (with temporary names and
atomic renames). For a local output that folder is the cache itself; for a URL
it is a private staging folder, and each finished file is uploaded whole
(``put``) before its completion marker, with the manifest uploaded last. An
object store's PUT is atomic, so a reader never sees half a shard.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cachebuild.builder.markers import file_sha256, read_json, write_json
from cachebuild.format.atomic import fsync_dir
from cachebuild.errors import CacheBuildError, ManifestError, OutputError
from cachebuild.format.limits import MAX_MANIFEST_BYTES
from cachebuild.format.manifest import confined_file

__all__ = ["Output", "LocalOutput", "RemoteOutput", "open_output", "is_url"]


def is_url(location: str | Path) -> bool:
    """True for ``scheme://...`` locations handled through fsspec."""
    return "://" in str(location)


class LocalOutput:
    """A cache folder on a local or shared filesystem."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.location = str(self.path)

    def __getstate__(self) -> dict[str, Any]:
        """What a worker gets: the absolute path (a running Dask or Ray cluster's workers have their own
        working folders, where a relative ``--out`` named another folder or none)."""
        path = self.path.absolute()
        return {"path": path, "location": str(path)}

    def staging(self) -> Path:
        return self.path

    def publish(self, names: list[str]) -> None:
        """Files written into ``staging()`` are already in place."""

    def close_staging(self) -> None:
        """Nothing to remove: ``staging()`` is the cache folder itself."""

    def names(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []

    def read_json(self, name: str) -> dict[str, Any] | None:
        return read_json(self.path / name)

    def write_json(self, name: str, doc: dict[str, Any], sync: bool = True) -> None:
        write_json(self.path / name, doc, sync)

    def write_bytes(self, name: str, data: bytes) -> None:
        from cachebuild.format.atomic import atomic_write_bytes

        atomic_write_bytes(self.path / name, data)

    def read_bytes(self, name: str) -> bytes:
        """``name``'s bytes: a link out of the folder or a FIFO is one line, and a JSON file (the manifest)
        is read to at most :data:`MAX_MANIFEST_BYTES` + 1, which its parser then refuses as too large."""
        with open(confined_file(self.path, name, ManifestError), "rb") as fh:
            return fh.read(MAX_MANIFEST_BYTES + 1) if name.endswith(".json") else fh.read()

    def remove(self, name: str) -> None:
        p = self.path / name
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)  # a link goes, never what it points to

    def size(self, name: str) -> int | None:
        try:
            return (self.path / name).stat().st_size
        except OSError:
            return None

    def sha256(self, name: str) -> str | None:
        try:
            return file_sha256(self.path / name)
        except OSError:
            return None

    def child(self, name: str) -> "LocalOutput":
        """The output of the folder ``name`` inside this one (``--overwrite``'s staging folder)."""
        return LocalOutput(self.path / name)

    def move_to(self, name: str, dst: Output) -> None:
        """Rename file ``name`` into ``dst`` (same filesystem: atomic, replacing a file of that name)."""
        if not isinstance(dst, LocalOutput):
            raise OutputError(f"cannot move {self.path / name} to {dst.location}: not a local folder")
        os.replace(self.path / name, dst.path / name)

    def flush(self) -> None:
        """Persist the renames and removals made in the folder so far."""
        fsync_dir(self.path)


def _remote_errors(cls: type) -> type:
    """Turn any failure of the storage client (botocore, aiohttp, fsspec: unreachable endpoint,
    denied, 501 from a server without PUT, ...) into one ``OutputError`` line naming the URL,
    instead of a page of client traceback."""

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def method(self: "RemoteOutput", *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except CacheBuildError:
                raise
            except Exception as exc:  # a storage client's own exception types
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise OutputError(f"cannot use the output {self.location} ({fn.__name__}): {type(exc).__name__}: {first}") from exc

        return method

    for name in ("publish", "names", "read_json", "write_bytes", "read_bytes", "remove", "size", "sha256", "move_to"):
        setattr(cls, name, wrap(getattr(cls, name)))
    return cls


@_remote_errors
class RemoteOutput:
    """A cache under an fsspec URL; shards are staged locally, then uploaded whole."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        import fsspec

        self.location = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.location, **self.storage_options)
        except (ImportError, ValueError) as exc:
            raise OutputError(f"cannot open output {url}: {exc}") from exc
        digest = hashlib.sha256(self.location.encode()).hexdigest()[:16]
        self._staging = Path(tempfile.gettempdir()) / "cachebuild-staging" / digest

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["location"], state["storage_options"])

    def _p(self, name: str) -> str:
        return f"{self.root}/{name}"

    def staging(self) -> Path:
        self._staging.mkdir(parents=True, exist_ok=True)
        return self._staging

    def close_staging(self) -> None:
        """Remove this node's staging folder, and ``cachebuild-staging`` above it, where empty (the build is
        done: every shard uploaded). A folder still holding files (another build's, a killed worker's) stays."""
        for folder in (self._staging, self._staging.parent):
            try:
                folder.rmdir()
            except OSError:  # not empty, or not there
                return

    def publish(self, names: list[str]) -> None:
        try:
            for name in names:
                self.fs.put_file(str(self._staging / name), self._p(name))
        except OSError as exc:
            raise OutputError(f"cannot upload to {self.location}: {exc}") from exc
        for name in names:
            (self._staging / name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.fs.cat_file(self._p(name)))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def write_json(self, name: str, doc: dict[str, Any], sync: bool = True) -> None:
        self.write_bytes(name, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())

    def write_bytes(self, name: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self._p(name), data)
        except OSError as exc:
            raise OutputError(f"cannot write {self.location}/{name}: {exc}") from exc

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(self._p(name))

    def remove(self, name: str) -> None:
        try:
            self.fs.rm(self._p(name), recursive=True)
        except FileNotFoundError:
            pass

    def size(self, name: str) -> int | None:
        try:
            return int(self.fs.info(self._p(name))["size"])
        except (OSError, KeyError):
            return None

    def child(self, name: str) -> "RemoteOutput":
        """The output of the prefix ``name`` under this one (``--overwrite``'s staging prefix)."""
        return RemoteOutput(f"{self.location}/{name}", self.storage_options)

    def move_to(self, name: str, dst: Output) -> None:
        """Copy object ``name`` to ``dst`` (server side, one atomic PUT), then delete it here: an object
        store has no rename, and a crash in between leaves both copies, which a rerun moves again."""
        if not isinstance(dst, RemoteOutput):
            raise OutputError(f"cannot move {self._p(name)} to {dst.location}: not the same store")
        self.fs.copy(self._p(name), dst._p(name))
        self.fs.rm(self._p(name))

    def flush(self) -> None:
        """Nothing to persist: each object store operation is durable when it returns."""

    def sha256(self, name: str) -> str | None:
        h = hashlib.sha256()
        try:
            with self.fs.open(self._p(name), "rb", block_size=8 << 20) as fh:
                while chunk := fh.read(8 << 20):
                    h.update(chunk)
        except OSError:
            return None
        return h.hexdigest()


Output = LocalOutput | RemoteOutput


def open_output(location: str | Path, storage_options: dict[str, Any] | None = None) -> "Output":
    """The output for a folder path or an fsspec URL (``file://`` URLs stay local)."""
    loc = str(location)
    if loc.startswith("file://"):
        return LocalOutput(loc[len("file://") :])
    if is_url(loc):
        return RemoteOutput(loc, storage_options)
    return LocalOutput(loc)
