"""What a fresh build finds at its output, and what it does about it before building.

:func:`prepare_out` looks at the output folder (or URL) and answers one of

* ``"complete"``: it already holds this exact cache (same build fingerprint,
  every file the manifest lists at its size): nothing to do;
* ``"build"``: build here, resuming the shards already done for this
  fingerprint (an empty folder, an unfinished build of this recipe, or a
  complete one that lost a file);
* ``"stage"``: it holds a cache (or an unfinished build with finished shards)
  of another recipe and ``--overwrite`` was given: the new cache is built in
  the staging folder and swapped in only when complete
  (:mod:`cachebuild.builder.overwrite`); nothing of the old cache is touched
  here.

Without ``--overwrite`` another recipe is refused, naming the keys that
differ.

A local folder this process may not write (``chmod``, a read-only mount) is
looked at without writing anything (:func:`complete_read_only`): the complete
cache of this recipe is "nothing to do"; anything else is the one-line
"not writable" refusal of :func:`check_local`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from cachebuild.builder.markers import BUILD_RECORD, STAGING_DIR, is_ours, manifest_damaged
from cachebuild.builder.mismatch import describe_differences, fingerprint_doc_of_manifest
from cachebuild.builder.output import LocalOutput, Output
from cachebuild.builder.overwrite import SWAP_RECORD, drop_redundant_staging, staged_fingerprint, staged_note
from cachebuild.errors import CacheBuildError, CacheMismatchError, ManifestError, OutputError
from cachebuild.format.atomic import is_tmp_name, output_error
from cachebuild.format.manifest import MANIFEST_NAME, READ_VERSIONS, Manifest
from cachebuild.format.names import FORMAT_NAME

__all__ = ["Prepared", "prepare_out", "check_local", "refuse_foreign", "read_only_folder", "complete_read_only", "read_only_refusal", "remove_leftovers"]

Prepared = Literal["complete", "build", "stage"]


def check_local(out: LocalOutput) -> None:
    """The output folder exists (created) and is writable, or one ``OutputError`` line."""
    path = out.path
    if path.exists() and not path.is_dir():
        raise OutputError(f"output path {path} exists and is not a folder")
    if path.is_symlink() and not path.exists():
        raise OutputError(f"output path {path} is a symbolic link to {os.readlink(path)}, which does not exist: create that folder, or choose another --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc) from exc
    if not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {path}: not writable")


def refuse_foreign(out: Output, names: list[str]) -> None:
    """One ``OutputError`` line for a folder that holds files and no cache (a stranger's folder); called before
    the build lock is taken too, so such a folder is never written, not even the lock file."""
    foreign = [n for n in names if not is_ours(n)]
    if foreign and MANIFEST_NAME not in names and BUILD_RECORD not in names:
        raise OutputError(f"output folder {out.location} is not empty and is not a cachebuild cache (found {foreign[0]!r}); choose another --out")


def read_only_folder(out: LocalOutput) -> bool:
    """The output is an existing folder this process may not write into (permissions, a read-only mount)."""
    return out.path.is_dir() and not os.access(out.path, os.W_OK)


def complete_read_only(out: LocalOutput, fingerprint: str) -> Manifest | None:
    """The manifest of the complete cache of ``fingerprint`` in ``out``, found without writing anything; else None.

    For a folder the build cannot write: no build lock is taken (creating its
    file is a write; no build of ours can be writing into a folder we could
    not write either, and the manifest is only ever replaced whole), no
    redundant staged build removed. An ``--overwrite`` swap left half done
    (``.overwrite/swap.json``), another recipe, a missing or resized file, or
    a folder that cannot be read all answer None.
    """
    try:
        names = out.names()
        if MANIFEST_NAME not in names or (STAGING_DIR in names and out.child(STAGING_DIR).read_json(SWAP_RECORD) is not None):
            return None
        doc = out.read_json(MANIFEST_NAME) or {}
        if (doc.get("build") or {}).get("fingerprint") != fingerprint or manifest_damaged(out, doc):
            return None
        return Manifest.from_json(out.read_bytes(MANIFEST_NAME), out.location)
    except (OSError, ValueError, CacheBuildError):
        return None


def read_only_refusal(out: LocalOutput) -> OutputError:
    """The one line for a folder the build cannot write that does not hold its complete cache."""
    held = ", and the cache in it is not this recipe's complete cache" if (out.path / MANIFEST_NAME).is_file() else ""
    return OutputError(f"cannot write {out.path}: not writable{held}")


def _check_manifest_readable(out: Output) -> None:
    """The output's manifest is a cachebuild manifest this version reads, or one :class:`ManifestError` line.

    A folder is taken as a cache by its ``manifest.json``; one that does not parse (another tool's
    manifest, a damaged file, a newer cachebuild's format) must not be overwritten silently as if
    the folder were empty."""
    try:
        data = out.read_bytes(MANIFEST_NAME)
    except ManifestError:
        raise  # (a link out of the folder, a FIFO: the line names it already)
    except OSError as exc:
        raise ManifestError(f"cannot read {out.location}/{MANIFEST_NAME}: {exc}") from exc
    try:
        Manifest.from_json(data, out.location)
    except ManifestError as exc:
        if _format_version(data) not in (None, *READ_VERSIONS):
            hint = "it was written by another version of cachebuild: build with that version, or choose another --out"
        else:
            hint = f"if this folder is a cachebuild cache whose manifest was damaged, delete {MANIFEST_NAME} and rerun the command that built it, otherwise choose another --out"
        raise ManifestError(f"{exc}; nothing was changed: {hint}") from exc


def _format_version(data: bytes) -> object:
    """The ``version`` of a manifest document in cachebuild's format, or None (not JSON, not ours)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc.get("version") if isinstance(doc, dict) and doc.get("format") == FORMAT_NAME else None


def _existing(out: Output, names: list[str]) -> tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """(fingerprint, fingerprint document, manifest) of what the output holds: a complete cache, or an
    unfinished build that finished at least one shard (one that finished none has nothing to keep)."""
    if MANIFEST_NAME in names:
        manifest = out.read_json(MANIFEST_NAME) or {}
        return (manifest.get("build") or {}).get("fingerprint"), fingerprint_doc_of_manifest(manifest), manifest
    if BUILD_RECORD in names and any(n.endswith(".done.json") for n in names):
        record = out.read_json(BUILD_RECORD) or {}
        doc = record.get("doc")
        return record.get("fingerprint"), doc if isinstance(doc, dict) else None, None
    return None, None, None


def prepare_out(out: Output, doc: dict[str, Any], fingerprint: str, overwrite: bool) -> Prepared:
    """Make the output ready for the build of ``doc`` (fingerprint ``fingerprint``); see the module docstring.

    An interrupted swap must already be finished
    (:func:`cachebuild.builder.overwrite.finish_swap`, under the build lock of a local output).
    """
    if isinstance(out, LocalOutput):
        check_local(out)
    names = out.names()
    refuse_foreign(out, names)
    if MANIFEST_NAME in names:
        _check_manifest_readable(out)
    previous, previous_doc, manifest = _existing(out, names)
    staged = staged_fingerprint(out)
    if manifest is not None and previous == fingerprint:
        if not manifest_damaged(out, manifest):
            drop_redundant_staging(out, fingerprint)
            remove_leftovers(out)  # a cache finished while a killed worker's temp file stayed (builds before 2026-11-24)
            return "complete"
        out.remove(MANIFEST_NAME)  # not complete any more: the resume re-checks every shard (sha256) and rebuilds the bad ones
        return "build"
    if staged == fingerprint and (overwrite or previous is None):
        return "stage"  # resume (or swap in) this recipe's staged build
    if previous is not None and previous != fingerprint:
        if not overwrite:
            differs = describe_differences(previous_doc, doc) if isinstance(previous_doc, dict) else ""
            hint = f"; {staged_note(out)}" if staged == fingerprint else ""
            raise CacheMismatchError(
                f"{out.location} holds a cache built with another config, seed, codec or size{' (' + differs + ')' if differs else ''}; pass --overwrite to replace it, or choose another --out{hint}"
            )
        return "stage"
    remove_leftovers(out, names)
    return "build"


def remove_leftovers(out: Output, names: list[str] | None = None) -> None:
    """Remove the temporary files of interrupted writes at ``out`` (``shard-00017.tar.tmp-5511``: a worker
    killed mid-shard, whose shard the build then rebuilt elsewhere). Called with the build's lock held
    (local outputs), when no shard of this build is being written."""
    for n in out.names() if names is None else names:
        if is_tmp_name(Path(n)):
            out.remove(n)
