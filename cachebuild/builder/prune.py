"""Delete what no generation in use needs: ``--keep N`` after an append, and ``cachebuild prune``.

What is needed: the shards ``manifest.json`` lists (the newest generation),
plus those of every older generation a reader holds a lease on
(:mod:`cachebuild.format.generations`). An older generation's snapshot is kept
while it is held or while all its shards are still needed (so a checkpoint of
it can still resume exactly); otherwise it goes, with its lease file.

The protocol with readers: for each older generation, prune tries an
exclusive, non-blocking ``flock`` on its lease file; a reader's shared lock
makes that fail, and the generation is kept whole. Prune keeps the exclusive
locks it got until it has deleted everything, so a reader arriving meanwhile
waits, then finds its generation gone and says so (it never opens half a
generation). Anything else named ``shard-*`` that no needed generation lists
is deleted too: shards of an unfinished append, which is discarded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cachebuild.builder.generation_manifest import APPEND_RECORD, listed_generations, shard_files
from cachebuild.builder.lock import build_lock
from cachebuild.builder.markers import BUILD_RECORD
from cachebuild.errors import ConfigError, ManifestError
from cachebuild.format.generations import GENERATIONS_DIR, generation_of, lease_path, read_generation, snapshot_path, try_exclusive
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, read_manifest

__all__ = ["PruneReport", "prune_cache", "prune_unlocked"]


@dataclass
class PruneReport:
    """What a prune did: files deleted, generations still on disk, those kept because a reader holds them."""

    root: Path
    generation: int = 0
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    on_disk: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)

    def lines(self) -> list[str]:
        held = f"; kept for readers: {', '.join(map(str, self.held))}" if self.held else ""
        return [
            f"pruned {self.root}: {len(self.removed)} files deleted ({self.freed_bytes / 1e6:.1f} MB), newest generation {self.generation}",
            f"generations on disk: {', '.join(map(str, self.on_disk))}{held}",
        ]


def _snapshots(root: Path) -> list[int]:
    folder = root / GENERATIONS_DIR
    return sorted(int(p.stem[4:]) for p in folder.glob("gen-*.json") if p.stem[4:].isdigit()) if folder.is_dir() else []


def _names(m: Manifest) -> set[str]:
    return {n for s in m.shards for n in shard_files(s)}


def prune_unlocked(root: str | Path) -> PruneReport:
    """Prune the cache at ``root``; the caller holds its build lock (see the module docstring)."""
    root = Path(root)
    current = read_manifest(root)
    report = PruneReport(root, generation_of(current))
    locked: dict[int, int] = {}
    try:
        needed = _names(current)
        olds = [g for g in _snapshots(root) if g < report.generation]
        for g in olds:
            fd = try_exclusive(root, g)
            if fd is None:
                report.held.append(g)
                needed |= _names(read_generation(root, g))
            else:
                locked[g] = fd
        for g in olds:
            if g in locked and not _names(read_generation(root, g)) <= needed:
                _remove(snapshot_path(root, g), report)
                _remove(lease_path(root, g), report)  # while still locked: a waiting reader sees it replaced
        for path in sorted(root.glob("shard-*")):
            if path.name not in needed:
                _remove(path, report)
        if (root / APPEND_RECORD).exists():
            _remove(root / APPEND_RECORD, report)
    finally:
        for fd in locked.values():
            os.close(fd)
    report.on_disk = sorted({g for g in _snapshots(root)} | set(listed_generations(current)) | {report.generation})
    report.on_disk = [g for g in report.on_disk if g == report.generation or snapshot_path(root, g).is_file()]
    return report


def _remove(path: Path, report: PruneReport) -> None:
    if path.is_dir() and not path.is_symlink():
        return  # cachebuild makes no folder named shard-*: a user's, kept
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return
    report.removed.append(path.name)
    report.freed_bytes += size


def prune_cache(root: str | Path) -> PruneReport:
    """``cachebuild prune``: take the build lock, then prune (an unfinished append is discarded)."""
    root = Path(root)
    if not (root / MANIFEST_NAME).is_file():
        if (root / BUILD_RECORD).is_file():  # a first build running, or interrupted: nothing to prune yet
            raise ConfigError(f"prune: {root} holds an unfinished build (finish it first: rerun it)")
        raise ManifestError(f"prune: {root} is not a cachebuild cache (no {MANIFEST_NAME})")  # exit 3, as verify's
    with build_lock(root):
        return prune_unlocked(root)
