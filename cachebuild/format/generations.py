"""Generations of a growing cache: numbering, snapshots and readers' leases.

A cache grows by *generations* (``cachebuild generate --append``): generation
0 is the first build, and each append adds shards with fresh seeds and commits
generation g+1 by replacing ``manifest.json`` atomically (the commit point).
A manifest without a ``build.generation`` key is generation 0, so every cache
built before generations existed reads as one.

Besides ``manifest.json`` (the newest generation), a grown cache keeps, in the
folder ``generations/``:

* ``gen-NNNNN.json``: the manifest of generation NNNNN, byte for byte as it
  was committed (written before ``manifest.json`` is replaced, never changed
  after). A loader that planned an epoch on generation g, or resumes a state
  saved on it, reads g's shard list from here even when newer ones exist;
* ``gen-NNNNN.lock``: the *lease* file of generation NNNNN. A reader holds a
  shared ``flock`` on it for as long as it may open that generation's shards;
  pruning (``--keep N``, ``cachebuild prune``) takes an exclusive, non-blocking
  ``flock`` before it deletes anything of a generation, and skips a generation
  some reader holds. The kernel drops a ``flock`` when its holder dies, so a
  crashed reader never blocks pruning for ever, and a lease needs no clean-up.
  A lease is only ever released by closing its descriptor (never ``LOCK_UN``):
  a forked DataLoader worker shares its parent's open file, and an explicit
  unlock there would drop the parent's lease too.

Remote caches (``s3://``, ``http://``) have no leases: they are read at the
generation they had when the stream opened them.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import numpy as np

from cachebuild.errors import ManifestError
from cachebuild.format.limits import MAX_MANIFEST_BYTES
from cachebuild.format.manifest import Manifest, confined_file, read_manifest

__all__ = [
    "GENERATIONS_DIR",
    "generations_dir",
    "GROWN_VERSION",
    "generation_of",
    "generation_seed",
    "snapshot_path",
    "lease_path",
    "read_generation",
    "Lease",
    "take_lease",
    "try_exclusive",
    "newest_generation",
]

GENERATIONS_DIR = "generations"
GROWN_VERSION = 2
"""Format version of a manifest of generation >= 1 (readers that predate generations refuse it clearly)."""

_TAG_SEED = 0x67656E  # "gen": keeps generation seeds apart from any other use of (seed, g)


def generation_of(manifest: Manifest) -> int:
    """The manifest's generation (0 for caches that never grew)."""
    build = manifest.build if isinstance(manifest.build, dict) else {}
    return int(build.get("generation", 0))


def generation_seed(seed: int, generation: int) -> int:
    """The seed of generation ``generation``'s shards: ``seed`` itself for generation 0, then a
    pure function of ``(seed, generation)`` (63 bits), so an append's bytes are determined."""
    if generation == 0:
        return int(seed)
    words = np.random.SeedSequence([int(seed), int(generation), _TAG_SEED]).generate_state(2, np.uint32)
    return int((int(words[0]) << 32 | int(words[1])) & ((1 << 63) - 1))


def generations_dir(root: str | Path) -> Path:
    """``root/generations``; a symbolic link there (a stranger's cache) is refused: snapshots and leases are
    read and made inside the cache, never through a link to elsewhere."""
    folder = Path(root) / GENERATIONS_DIR
    if folder.is_symlink():
        raise ManifestError(f"{folder} is a symbolic link, not the cache's own folder of generations: delete it")
    return folder


def snapshot_path(root: str | Path, generation: int) -> Path:
    """``root/generations/gen-NNNNN.json``: generation ``generation``'s manifest as committed."""
    return generations_dir(root) / f"gen-{generation:05d}.json"


def lease_path(root: str | Path, generation: int) -> Path:
    """``root/generations/gen-NNNNN.lock``: the file readers of that generation hold a shared lock on."""
    return generations_dir(root) / f"gen-{generation:05d}.lock"


def read_generation(root: str | Path, generation: int) -> Manifest:
    """The manifest of generation ``generation`` of the local cache at ``root``.

    The newest generation is ``manifest.json``; older ones come from their
    snapshot. A generation that is no longer on disk (pruned) is a
    :class:`ManifestError` naming it and the generations there are.
    """
    current = read_manifest(root)
    if generation_of(current) == generation:
        return current
    path = confined_file(Path(root), str(snapshot_path(root, generation).relative_to(root)), ManifestError)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        kept = sorted(int(p.stem[4:]) for p in path.parent.glob("gen-*.json") if p.stem[4:].isdigit())
        raise ManifestError(
            f"generation {generation} of the cache {root} is not on disk any more (pruned; generations there: {', '.join(map(str, kept)) or generation_of(current)}, newest {generation_of(current)})"
        ) from None
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    manifest = Manifest.from_json(data, str(root))
    if generation_of(manifest) != generation:
        raise ManifestError(f"{path}: holds generation {generation_of(manifest)}, not {generation} (a replaced file?)")
    return manifest


class Lease:
    """A shared ``flock`` on one generation's lease file, held until :meth:`close` (or the process ends)."""

    def __init__(self, generation: int, fd: int | None):
        self.generation = generation
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Let go (by closing the descriptor: never ``LOCK_UN``, see the module docstring)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict[str, Any]:  # a pickled copy (spawned worker) holds nothing
        return {"generation": self.generation, "_fd": None}

    def __del__(self) -> None:
        self.close()


def take_lease(root: str | Path, generation: int) -> Lease:
    """Hold generation ``generation`` of the cache at ``root`` so pruning keeps its files.

    Waits while a prune holds the generation, then checks the generation is
    still there (its snapshot, or ``manifest.json`` at that generation); a
    pruned one is a :class:`ManifestError`. A cache folder this process cannot
    write (a read-only copy) gets an empty lease: nothing can prune it either. So
    does a full disk (no room for the lease file or ``generations/``): the cache is
    read all the same, unprotected from a prune run once space is freed.
    """
    path = lease_path(root, generation)
    try:
        path.parent.mkdir(exist_ok=True)
        fd = _open_lease(path)
    except ManifestError:
        raise
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            return Lease(generation, None)  # read-only, or a full disk: read it all the same, unleased
        raise ManifestError(f"cannot create the lease {path}: {exc.strerror}") from exc
    fcntl.flock(fd, fcntl.LOCK_SH)  # a prune holds it exclusively only while it deletes
    try:
        stale = os.fstat(fd).st_ino != os.stat(path).st_ino  # pruned (and unlinked) while we waited
    except FileNotFoundError:
        stale = True
    if stale or not _present(root, generation):
        os.close(fd)
        read_generation(root, generation)  # raises the clear "not on disk any more" error
        return take_lease(root, generation)  # present after all (a new lease file): hold that one
    return Lease(generation, fd)


def _present(root: str | Path, generation: int) -> bool:
    if snapshot_path(root, generation).is_file():
        return True
    try:
        return generation_of(read_manifest(root)) == generation
    except ManifestError:
        return False


def _open_lease(path: Path) -> int:
    """The lease file, created if needed; a symbolic link there (a stranger's cache) is refused, never followed."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ManifestError(f"{path} is a symbolic link, not a lease file (a plain file cachebuild makes): delete it") from exc
        raise


def try_exclusive(root: str | Path, generation: int) -> int | None:
    """An exclusive lock on the generation's lease file if no reader holds it (a descriptor), else None."""
    path = lease_path(root, generation)
    fd = _open_lease(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def newest_generation(root: str | Path) -> int:
    """The generation ``manifest.json`` holds now."""
    return generation_of(read_manifest(root))
