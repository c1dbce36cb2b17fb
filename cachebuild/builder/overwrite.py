"""``--overwrite`` that never loses the old cache before the new one is complete: stage, then swap.

A build with ``--overwrite`` onto a folder (or URL) that holds a cache (or an
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

On an object store (``s3://``, any fsspec URL) a "rename" is a server-side
copy, then a delete of the source (each object still appears whole); a crash
between the two leaves both, and the rerun moves it again. Remote outputs
have no build lock: run one build per prefix, as always.

A crash (SIGKILL, power loss) before step 1 leaves the old cache complete and
the staged build resumable: rerunning the same ``--overwrite`` command resumes
it (or swaps it in when it was complete). A crash after step 1 leaves
``swap.json``: every later build of this folder (any recipe, under the build
lock where there is one) first finishes the swap (:func:`finish_swap`), so the folder ends up
holding the complete new cache, byte for byte what an uninterrupted build
writes.

The staged work is deleted only by the swap itself, by an ``--overwrite`` of
yet another recipe (which replaces it), by a build that finds the cache
already complete with the staged recipe (redundant), or by a staged build
that failed before finishing any shard. A rerun of the old command keeps it
and says so. Disk space: until the swap, the folder holds both caches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from cachebuild.builder.lock import LOCK_NAME
from cachebuild.builder.markers import BUILD_RECORD, STAGING_DIR, done_name, is_ours, manifest_damaged
from cachebuild.builder.output import LocalOutput, Output
from cachebuild.errors import OutputError
from cachebuild.format.atomic import is_tmp_name, output_error
from cachebuild.format.generations import GENERATIONS_DIR
from cachebuild.format.manifest import MANIFEST_NAME, Manifest

__all__ = ["STAGING_DIR", "SWAP_RECORD", "staged_fingerprint", "staged_note", "open_staging", "drop_redundant_staging", "discard_unstarted", "swap_in", "swap_steps", "finish_swap"]

SWAP_RECORD = "swap.json"
"""Written into the staging folder when a swap starts: its presence means "finish the swap first"."""


def _staging(root: Output) -> Output:
    """The staging folder; a symbolic link there (a stranger's cache) is refused: the staged build, its swap
    and its removal stay inside the cache, never through a link to elsewhere."""
    staging = root.child(STAGING_DIR)
    if isinstance(staging, LocalOutput) and staging.path.is_symlink():
        raise OutputError(f"{staging.path} is a symbolic link, not cachebuild's staging folder: delete it, then rerun")
    return staging


def staged_fingerprint(root: Output) -> str | None:
    """The build fingerprint of the cache staged under ``root`` (complete or not), or None."""
    staging = _staging(root)
    manifest = staging.read_json(MANIFEST_NAME)
    if manifest is not None:
        return (manifest.get("build") or {}).get("fingerprint")
    record = staging.read_json(BUILD_RECORD)
    return record.get("fingerprint") if record is not None else None


def staged_note(root: Output) -> str:
    """One sentence on the staged build (for a refusal or a "nothing to do"), or "" when there is none."""
    staging = _staging(root)
    names = staging.names()
    if MANIFEST_NAME in names:
        return f"a complete --overwrite build waits in {staging.location} to replace this cache: rerun that command to swap it in, or delete the folder"
    record = staging.read_json(BUILD_RECORD) if BUILD_RECORD in names else None
    if record is None:
        return ""
    try:
        total = f" of {-(-int(record['records']) // int(record['records_per_shard']))}"
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        total = ""
    done = sum(1 for n in names if n.endswith(".done.json"))
    return f"an unfinished --overwrite build is staged in {staging.location} ({done}{total} shards done): rerun that command to finish it, or delete the folder"


def open_staging(root: Output, fingerprint: str, probe: Callable[[], None] | None) -> tuple[Output, bool]:
    """The staging output for the build ``fingerprint``, and whether it already holds that cache complete.

    A staged build of the same fingerprint is resumed (its temporary files
    removed, a damaged staged manifest dropped); one of another recipe is
    replaced, after ``probe`` checked the source's first block.
    """
    staging = _staging(root)
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
        root.remove(STAGING_DIR)  # the staged build of another recipe: this --overwrite replaces it
        if isinstance(staging, LocalOutput):
            staging.path.mkdir()
            root.flush()
    except OSError as exc:
        raise output_error(Path(staging.location), exc) from exc
    return staging, False


def drop_redundant_staging(root: Output, fingerprint: str) -> None:
    """Remove a staged build of ``fingerprint`` when ``root`` already holds that cache complete."""
    if STAGING_DIR in root.names() and _staging(root).read_json(SWAP_RECORD) is None and staged_fingerprint(root) == fingerprint:
        root.remove(STAGING_DIR)


def discard_unstarted(root: Output) -> None:
    """After a failed staged build: remove the staging folder if it holds no finished shard (nothing to keep)."""
    names = _staging(root).names()
    if names and MANIFEST_NAME not in names and not any(n.endswith(".done.json") for n in names):
        root.remove(STAGING_DIR)


def _move_in(root: Output, staging: Output) -> Iterator[str]:
    """Steps 2-5 of the swap (module docstring); each is idempotent, so a rerun after a crash repeats none wrongly."""
    root.remove(MANIFEST_NAME)
    root.flush()
    yield "old manifest removed"
    manifest = Manifest.from_json(staging.read_bytes(MANIFEST_NAME), staging.location)
    new = {name for s in manifest.shards for name in (s.name, s.index, done_name(s.name))}
    present = set(staging.names())
    for name in sorted(new & present):  # (the others were moved before a crash)
        staging.move_to(name, root)
        yield f"moved {name}"
    keep = new | {MANIFEST_NAME, LOCK_NAME, STAGING_DIR}
    for name in root.names():
        if is_ours(name) and name not in keep and not _users_folder(root, name):
            root.remove(name)
            yield f"removed {name}"
    root.flush()
    staging.move_to(MANIFEST_NAME, root)
    root.flush()
    yield "manifest in place"


def _users_folder(root: Output, name: str) -> bool:
    """A folder of the cache folder that cachebuild did not make (it makes only ``generations/``): kept by the swap."""
    p = root.path / name if isinstance(root, LocalOutput) else None
    return p is not None and name != GENERATIONS_DIR and p.is_dir() and not p.is_symlink()


def swap_steps(root: Output) -> Iterator[str]:
    """Swap the complete staged cache into ``root``, yielding after each step (the module docstring's
    1-6). Stopping the iteration anywhere leaves what a crash there would."""
    staging = _staging(root)
    if staging.read_json(SWAP_RECORD) is None:
        staging.write_json(SWAP_RECORD, {"fingerprint": staged_fingerprint(root)})
        yield "swap started"
    if MANIFEST_NAME in staging.names():
        yield from _move_in(root, staging)
    root.remove(STAGING_DIR)
    yield "staging removed"


def swap_in(root: Output) -> None:
    """Run (or finish) the swap of the staged cache into ``root``; one ``OutputError`` line if the filesystem refuses."""
    try:
        for _ in swap_steps(root):
            pass
    except OSError as exc:
        raise output_error(Path(root.location), exc) from exc


def finish_swap(root: Output) -> bool:
    """Finish a swap a crash interrupted (run under the build lock, before anything reads the folder); True if there was one."""
    if STAGING_DIR not in root.names() or _staging(root).read_json(SWAP_RECORD) is None:
        return False
    swap_in(root)
    return True
