"""``--overwrite`` that never loses the old cache before the new one is complete: stage, then swap.

A build with ``--overwrite`` onto a local folder that holds a cache (or an
unfinished build with finished shards) of another recipe does not delete it.
It builds the new cache in the staging folder :data:`STAGING_DIR`
(``<cache>/.overwrite/``), inside the cache folder (nothing is written
outside it, and renames stay on one filesystem), as an ordinary resumable
build: its own build record, done markers and manifest. Meanwhile the old
cache stays complete, with its manifest in place: loaders and ``verify`` keep
using it, and a rerun of the old command finds it complete.

Only when the staged cache is complete (its manifest written) is it swapped
in, one filesystem step at a time (:func:`swap_steps`):

1. ``.overwrite/swap.json`` is written: from here on the swap only goes
   forward;
2. the old ``manifest.json`` is removed (the folder stops being a complete cache);
3. every file the staged manifest lists (tar, index, done marker) is renamed
   into the cache folder, replacing a file of the same name;
4. the old cache's other files (shards the new one has not, ``build.json``,
   ``generations/``) are removed;
5. the staged manifest is renamed to ``manifest.json`` (the new cache is complete);
6. the staging folder is removed.

A crash (SIGKILL, power loss) before step 1 leaves the old cache complete and
the staged build resumable: rerunning the same ``--overwrite`` command resumes
it (or swaps it in when it was complete). A crash after step 1 leaves
``swap.json``: every later build of this folder (any recipe, under the build
lock) first finishes the swap (:func:`finish_swap`), so the folder ends up
holding the complete new cache, byte for byte what an uninterrupted build
writes.

The staged work is deleted only by the swap itself, by an ``--overwrite`` of
yet another recipe (which replaces it), by a build that finds the cache
already complete with the staged recipe (redundant), or by a staged build
that failed before finishing any shard. A rerun of the old command keeps it
and says so. Disk space: until the swap, the folder holds both caches.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.builder.markers import BUILD_RECORD, STAGING_DIR, done_name, is_ours, manifest_damaged, read_json, write_json
from cachebuild.builder.output import LocalOutput
from cachebuild.format.atomic import fsync_dir, is_tmp_name, output_error
from cachebuild.format.manifest import MANIFEST_NAME, Manifest

__all__ = ["STAGING_DIR", "SWAP_RECORD", "staged_fingerprint", "staged_note", "open_staging", "drop_redundant_staging", "discard_unstarted", "swap_in", "swap_steps", "finish_swap"]

SWAP_RECORD = "swap.json"
"""Written into the staging folder when a swap starts: its presence means "finish the swap first"."""


def _staging(root: Path) -> Path:
    return Path(root) / STAGING_DIR


def staged_fingerprint(root: Path) -> str | None:
    """The build fingerprint of the cache staged under ``root`` (complete or not), or None."""
    staging = _staging(root)
    manifest = read_json(staging / MANIFEST_NAME)
    if manifest is not None:
        return (manifest.get("build") or {}).get("fingerprint")
    record = read_json(staging / BUILD_RECORD)
    return record.get("fingerprint") if record is not None else None


def staged_note(root: Path) -> str:
    """One sentence on the staged build (for a refusal or a "nothing to do"), or "" when there is none."""
    staging = _staging(root)
    if (staging / MANIFEST_NAME).is_file():
        return f"a complete --overwrite build waits in {staging} to replace this cache: rerun that command to swap it in, or delete the folder"
    record = read_json(staging / BUILD_RECORD)
    if record is None:
        return ""
    try:
        total = f" of {-(-int(record['records']) // int(record['records_per_shard']))}"
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        total = ""
    done = sum(1 for p in staging.glob("*.done.json"))
    return f"an unfinished --overwrite build is staged in {staging} ({done}{total} shards done): rerun that command to finish it, or delete the folder"


def open_staging(root: Path, fingerprint: str, probe: Callable[[], None] | None, sync: bool = True) -> tuple[LocalOutput, bool]:
    """The staging output for the build ``fingerprint``, and whether it already holds that cache complete.

    A staged build of the same fingerprint is resumed (its temporary files
    removed, a damaged staged manifest dropped); one of another recipe is
    replaced, after ``probe`` checked the source's first block.
    """
    staging = LocalOutput(_staging(root))
    try:
        if staged_fingerprint(root) == fingerprint:
            manifest = staging.read_json(MANIFEST_NAME)
            if manifest is not None and not manifest_damaged(staging, manifest):
                return staging, True
            staging.remove(MANIFEST_NAME)
            for name in staging.names():
                if is_tmp_name(Path(name)):
                    staging.remove(name)
            return staging, False
        if probe is not None:
            probe()  # a source that fails at once leaves the folder as it was
        if staging.path.exists():
            shutil.rmtree(staging.path)  # the staged build of another recipe: this --overwrite replaces it
        staging.path.mkdir()
        if sync:
            fsync_dir(staging.path.parent)
    except OSError as exc:
        raise output_error(staging.path, exc) from exc
    return staging, False


def drop_redundant_staging(root: Path, fingerprint: str) -> None:
    """Remove a staged build of ``fingerprint`` when ``root`` already holds that cache complete."""
    staging = _staging(root)
    if staging.is_dir() and not (staging / SWAP_RECORD).exists() and staged_fingerprint(root) == fingerprint:
        shutil.rmtree(staging)


def discard_unstarted(root: Path) -> None:
    """After a failed staged build: remove the staging folder if it holds no finished shard (nothing to keep)."""
    staging = _staging(root)
    if staging.is_dir() and not any(staging.glob("*.done.json")) and not (staging / MANIFEST_NAME).exists():
        shutil.rmtree(staging, ignore_errors=True)


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _move_in(root: Path, staging: Path) -> Iterator[str]:
    """Steps 2-5 of the swap (module docstring); each is idempotent, so a rerun after a crash repeats none wrongly."""
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    fsync_dir(root)
    yield "old manifest removed"
    manifest = Manifest.from_json((staging / MANIFEST_NAME).read_bytes(), str(staging))
    new = {name for s in manifest.shards for name in (s.name, s.index, done_name(s.name))}
    for name in sorted(new):
        if (staging / name).exists():  # else moved before a crash
            os.replace(staging / name, root / name)
            yield f"moved {name}"
    keep = new | {MANIFEST_NAME, LOCK_NAME, STAGING_DIR}
    for path in sorted(root.iterdir()):
        if is_ours(path.name) and path.name not in keep:
            _remove(path)
            yield f"removed {path.name}"
    fsync_dir(root)
    os.replace(staging / MANIFEST_NAME, root / MANIFEST_NAME)
    fsync_dir(root)
    yield "manifest in place"


def swap_steps(root: Path) -> Iterator[str]:
    """Swap the complete staged cache into ``root``, yielding after each filesystem step (the module
    docstring's 1-6). Stopping the iteration anywhere leaves what a crash there would."""
    staging = _staging(root)
    if not (staging / SWAP_RECORD).exists():
        write_json(staging / SWAP_RECORD, {"fingerprint": staged_fingerprint(root)})
        yield "swap started"
    if (staging / MANIFEST_NAME).exists():
        yield from _move_in(root, staging)
    shutil.rmtree(staging)
    yield "staging removed"


def swap_in(root: Path) -> None:
    """Run (or finish) the swap of the staged cache into ``root``; one ``OutputError`` line if the filesystem refuses."""
    try:
        for _ in swap_steps(root):
            pass
    except OSError as exc:
        raise output_error(Path(root), exc) from exc


def finish_swap(root: Path) -> bool:
    """Finish a swap a crash interrupted (run under the build lock before anything reads the folder); True if there was one."""
    if not (_staging(root) / SWAP_RECORD).exists():
        return False
    swap_in(root)
    return True
