"""Stage a cache into RAM (a tmpfs such as ``/dev/shm``) and remove it again.

Why: a loader reading from tmpfs pays no disk latency, and with a raw cache
(``--codec none``) no decompression either. Staging keeps the cache's promise
that a cache without a manifest is not a cache: shards and indexes are copied
under temporary names, each one is re-read and checked against the manifest's
sha256, and the manifest is written last, atomically, only when all of them
verified. A stamp file (:data:`STAMP_NAME`) marks the folder as a staged copy
and records size, mtime and sha256 of every verified file, so staging again an
unchanged cache copies nothing and ``unstage`` never deletes a built cache.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cachebuild.builder.markers import file_sha256
from cachebuild.errors import CacheBuildError, ConfigError, OutputError, ShardCorruptError
from cachebuild.format.atomic import atomic_write_bytes, is_tmp_name, open_tmp, output_error, tmp_name
from cachebuild.format.generations import GENERATIONS_DIR
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, confined_file, read_manifest
from cachebuild.format.reader import ShardSet
from cachebuild.format.records import check_structure
from cachebuild.tools.stage_dst import human, stage_lock
from cachebuild.tools.stage_space import check_space

__all__ = ["STAMP_NAME", "StageResult", "UnstageResult", "default_dst", "stage_cache", "unstage_cache"]

STAMP_NAME = ".cachebuild-stage.json"
DEFAULT_ROOT = Path("/dev/shm/cachebuild")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class _File:
    """One file to stage: name in the cache folder, size, expected sha256, owning shard."""

    name: str
    bytes: int
    sha256: str
    shard: str


@dataclass(frozen=True)
class StageResult:
    """What :func:`stage_cache` did; ``lines()`` is the CLI summary."""

    src: Path
    dst: Path
    files: int
    copied_files: int
    bytes_total: int
    bytes_copied: int
    seconds: float
    manifest_written: bool

    @property
    def already_staged(self) -> bool:
        """True when the staged copy was complete and current: nothing was written."""
        return self.bytes_copied == 0 and self.copied_files == 0 and not self.manifest_written

    @property
    def gb_per_s(self) -> float:
        return self.bytes_copied / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        if self.already_staged:
            head = f"already staged, nothing copied: {self.dst} ({self.files} files, {human(self.bytes_total)} match the manifest)"
        else:
            head = f"staged {self.src} -> {self.dst}: copied {self.copied_files}/{self.files} files, {human(self.bytes_copied)} in {self.seconds:.2f} s ({self.gb_per_s:.2f} GB/s), sha256 verified"
        return [head, f"pass to the loader: {self.dst}"]


@dataclass(frozen=True)
class UnstageResult:
    """What :func:`unstage_cache` removed (``existed`` False: there was nothing to remove)."""

    dst: Path
    files: int
    bytes: int
    existed: bool = True
    left: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        if not self.existed:
            return [f"nothing staged at {self.dst}"]
        out = [f"unstaged {self.dst}: removed {self.files} files, freed {human(self.bytes)}"]
        if self.left:
            out.append(f"kept {len(self.left)} file(s) not made by staging, and the folder: {', '.join(self.left[:5])}")
        return out


def default_dst(src: str | Path) -> Path:
    """``/dev/shm/cachebuild/<name of the SRC folder>``."""
    return DEFAULT_ROOT / Path(src).resolve().name


def _plan(src: Path, manifest: Manifest) -> list[_File]:
    """Shards and indexes to copy, with sizes; a missing or truncated source names its shard."""
    files = []
    for s in manifest.shards:
        for name, sha in ((s.name, s.sha256), (s.index, s.index_sha256)):
            try:
                size = confined_file(src, name).stat().st_size  # a link out of SRC, a loop, a FIFO: one line
            except FileNotFoundError as exc:
                raise ShardCorruptError(f"source shard {s.name}: {src / name} is missing") from exc
            if name == s.name and size != s.bytes:
                raise ShardCorruptError(f"source shard {s.name}: {size} bytes, manifest says {s.bytes} (truncated or replaced)")
            files.append(_File(name, size, sha, s.name))
    return files


def _read_stamp(dst: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((dst / STAMP_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else None


def _stamp_bytes(src: Path, expected: set[str], files: dict[str, dict[str, Any]]) -> bytes:
    doc = {"format": "cachebuild-stage", "version": 1, "source": str(src), "expected": sorted(expected), "files": files}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _write_stamp(dst: Path, src: Path, expected: set[str], files: dict[str, dict[str, Any]]) -> None:
    atomic_write_bytes(dst / STAMP_NAME, _stamp_bytes(src, expected, files))


def _largest_stamp(src: Path, files: list[_File]) -> int:
    """Bytes of the stamp once every file is staged (its widest form: 19-digit mtimes)."""
    widest = {f.name: {"bytes": f.bytes, "mtime_ns": 10**19 - 1, "sha256": f.sha256} for f in files}
    return len(_stamp_bytes(src, {f.name for f in files}, widest))


def _check_dst(src: Path, dst: Path) -> dict[str, Any]:
    """Refuse a DST that is SRC, a file, or a folder with other content; return its stamp."""
    rs, rd = src.resolve(), dst.resolve()
    if rs == rd or rs in rd.parents or rd in rs.parents:
        raise OutputError(f"cannot stage {src} into {dst}: source and destination overlap")
    if dst.exists() and not dst.is_dir():
        raise OutputError(f"cannot stage into {dst}: it is a file, not a folder")
    stamp = _read_stamp(dst) if dst.is_dir() else None
    if stamp is None and dst.is_dir() and any(not is_tmp_name(p) for p in dst.iterdir()):  # (a stage starting there: its stamp's temp)
        what = "a cache built there" if (dst / MANIFEST_NAME).exists() else "not empty"
        raise OutputError(f"cannot stage into {dst}: it is {what} and not a staged copy (no {STAMP_NAME}); choose a new or empty folder")
    return stamp or {"files": {}, "expected": []}


def _is_current(path: Path, f: _File, entry: dict[str, Any] | None, rehash: bool) -> bool:
    """Whether DST already holds ``f``: the stamp's size+mtime+sha256, else its hash."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != f.bytes:
        return False
    if not rehash and entry and entry.get("sha256") == f.sha256 and entry.get("mtime_ns") == st.st_mtime_ns and entry.get("bytes") == f.bytes:
        return True
    return file_sha256(path) == f.sha256


def _copy_file(src: Path, dst: Path, on_bytes: Callable[[int], None], stop: threading.Event) -> None:
    """Copy ``src`` to ``dst`` in chunks (in-kernel ``sendfile`` on Linux), reporting progress."""
    kernel = sys.platform.startswith("linux")
    with open(src, "rb") as fi, open_tmp(dst) as fo:
        while True:
            if stop.is_set():
                raise InterruptedError(f"staging stopped while copying {src.name}")
            if kernel:
                n = os.sendfile(fo.fileno(), fi.fileno(), None, _CHUNK)
            else:
                n = fo.write(fi.read(_CHUNK))
            if n == 0:
                return
            on_bytes(n)


def _stage_one(src: Path, dst: Path, f: _File, on_bytes: Callable[[int], None], stop: threading.Event) -> tuple[dict[str, Any] | None, str | None]:
    """Copy one file under a temp name, verify its sha256, rename. Returns (stamp entry, fault)."""
    final = dst / f.name
    tmp = tmp_name(final)
    try:
        _copy_file(src / f.name, tmp, on_bytes, stop)
        if file_sha256(tmp) != f.sha256:
            tmp.unlink()
            what = "" if f.name == f.shard else f"index {f.name} of "
            if file_sha256(src / f.name) != f.sha256:
                return None, f"source shard {f.shard}: {what}sha256 differs from the manifest (corrupt source; run `cachebuild verify`, rebuild to repair)"
            return None, f"shard {f.shard}: {what}copy in {dst} does not match its sha256 (write error)"
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = final.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": f.sha256}, None


def _copy_all(src: Path, dst: Path, todo: list[_File], workers: int, progress: bool, entries: dict[str, dict[str, Any]]) -> list[str]:
    """Stage ``todo`` with a thread pool and a byte progress bar; verified files go into ``entries``."""
    from tqdm.auto import tqdm

    stop, lock, faults = threading.Event(), threading.Lock(), []
    bar = tqdm(total=sum(f.bytes for f in todo), unit="B", unit_scale=True, unit_divisor=1024, desc="stage", disable=not progress)

    def on_bytes(n: int) -> None:
        with lock:
            bar.update(n)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cachebuild-stage")
    futures = {pool.submit(_stage_one, src, dst, f, on_bytes, stop): f for f in todo}
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in done:
            entry, fault = fut.result()
            if fault:
                faults.append(fault)
            elif entry is not None:
                entries[futures[fut].name] = entry
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
        for fut, f in futures.items():  # record what did finish, even when interrupted
            finished = fut.result()[0] if fut.done() and not fut.cancelled() and fut.exception() is None else None
            if finished:
                entries[f.name] = finished
    return sorted(faults)


def _clean(dst: Path, names: set[str]) -> int:
    """Remove leftover temp files and the listed names from DST; return the bytes freed."""
    freed = 0
    for p in list(dst.iterdir()):
        if p.is_file() and (p.name in names or is_tmp_name(p)):
            freed += p.stat().st_size
            p.unlink()
    return freed


def stage_cache(src: str | Path, dst: str | Path | None = None, progress: bool = True, workers: int | None = None, rehash: bool = False) -> StageResult:
    """Copy the cache at ``src`` into ``dst`` (default :func:`default_dst`), verify it, write its manifest last.

    Files already staged and unchanged are skipped (``rehash`` re-hashes them
    instead of trusting the stamp). Raises :class:`OutputError` when DST's
    filesystem is too small (before anything is written) and
    :class:`ShardCorruptError` naming each shard whose copy does not match the
    manifest; DST then has no manifest, so no loader takes it for a cache.
    """
    t0 = time.perf_counter()
    src = Path(src)
    manifest = read_manifest(src)
    manifest_bytes = (src / MANIFEST_NAME).read_bytes()
    dst = Path(dst) if dst is not None else default_dst(src)
    files = _plan(src, manifest)
    if _compare(dst, files, _check_dst(src, dst), manifest_bytes, rehash)[2]:  # staged and current: nothing to lock
        return StageResult(src, dst, len(files), 0, sum(f.bytes for f in files), 0, time.perf_counter() - t0, False)
    try:
        with stage_lock(dst):  # one stage into DST at a time: the others wait, then find its copy current
            return _stage_locked(src, dst, manifest, manifest_bytes, files, (progress, workers, rehash), t0)
    except OSError as exc:
        if isinstance(exc, CacheBuildError):
            raise
        if exc.filename and src.resolve() in Path(exc.filename).resolve().parents:
            raise OutputError(f"cannot read {exc.filename}: {exc.strerror}") from exc
        raise output_error(Path(exc.filename or dst), exc) from exc


def _compare(dst: Path, files: list[_File], stamp: dict[str, Any], manifest_bytes: bytes, rehash: bool) -> tuple[dict[str, dict[str, Any]], list[_File], bool]:
    """(stamp entries of the files DST already holds, the files to copy, whether DST is staged and current)."""
    old = stamp["files"]
    entries = {f.name: _entry(dst / f.name, f) for f in files if _is_current(dst / f.name, f, old.get(f.name), rehash)}
    todo = [f for f in files if f.name not in entries]
    return entries, todo, not todo and _read_bytes(dst / MANIFEST_NAME) == manifest_bytes


def _stage_locked(src: Path, dst: Path, manifest: Manifest, manifest_bytes: bytes, files: list[_File], how: tuple[bool, int | None, bool], t0: float) -> StageResult:
    """:func:`stage_cache` under DST's lock: compare again (another stage may have just staged it), check, copy."""
    (progress, workers, rehash), stamp = how, _check_dst(src, dst)
    entries, todo, current = _compare(dst, files, stamp, manifest_bytes, rehash)
    if current:
        return StageResult(src, dst, len(files), 0, sum(f.bytes for f in files), 0, time.perf_counter() - t0, False)
    _check_structure(src, manifest, {f.shard for f in todo})  # before DST is written
    names = {f.name for f in files}
    stale = (set(stamp.get("expected", [])) | set(stamp["files"])) - names
    check_space(dst, [f.bytes for f in todo], _held(dst, stale | {f.name for f in todo}), len(manifest_bytes), _largest_stamp(src.resolve(), files), dst / STAMP_NAME)
    _clean(dst, {MANIFEST_NAME} | stale | {f.name for f in todo})  # no manifest until all verify
    _write_stamp(dst, src.resolve(), names, entries)
    try:
        faults = _copy_all(src, dst, todo, workers or min(4, os.cpu_count() or 1), progress, entries)
    except BaseException:
        try:
            _write_stamp(dst, src.resolve(), names, entries)  # what did verify, for the rerun
        except OSError:
            pass  # (a full disk: the rerun re-hashes instead) the copy's own error is the one to report
        raise
    _write_stamp(dst, src.resolve(), names, entries)
    if faults:
        raise ShardCorruptError(f"{len(faults)} file(s) failed verification, {dst} left without a manifest: " + "; ".join(faults))
    atomic_write_bytes(dst / MANIFEST_NAME, manifest_bytes)
    return StageResult(src, dst, len(files), len(todo), sum(f.bytes for f in files), sum(f.bytes for f in todo), time.perf_counter() - t0, True)


def _check_structure(src: Path, manifest: Manifest, shards: set[str]) -> None:
    """Refuse a source shard whose index, member keys, frame sizes or JSON members are wrong
    (:func:`cachebuild.format.records.check_structure`), before anything is copied."""
    with ShardSet(manifest, src, verify="size") as reader:
        for s, e in enumerate(manifest.shards):
            if e.name in shards:
                try:
                    check_structure(reader, s)
                finally:
                    reader.release([s])


def _entry(path: Path, f: _File) -> dict[str, Any]:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": f.sha256}


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _held(dst: Path, names: set[str]) -> int:
    """Bytes held in DST by files that staging will delete or replace (counted as free)."""
    total = 0
    for name in names:
        try:
            total += (dst / name).stat().st_size
        except OSError:
            pass
    return total


def _clean_leases(dst: Path) -> int:
    """Delete the lease files loaders made in the staged copy (``generations/gen-NNNNN.lock``, empty), and the
    folder when nothing else is in it; returns how many. Anything else there is kept and listed as left."""
    folder = dst / GENERATIONS_DIR
    if not folder.is_dir():
        return 0
    leases = [p for p in folder.glob("gen-*.lock") if p.stem[4:].isdigit() and p.is_file()]
    for p in leases:
        p.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()
    return len(leases)


def unstage_cache(dst: str | Path) -> UnstageResult:
    """Remove a staged copy made by :func:`stage_cache`: manifest first, then shards, then the stamp.

    Refuses (:class:`OutputError`) a folder without the stage stamp, so a built
    cache or an unrelated folder is never deleted. A missing folder is not an error.
    """
    dst = Path(dst)
    if not dst.exists():
        return UnstageResult(dst, 0, 0, existed=False)
    stamp = _read_stamp(dst) if dst.is_dir() else None
    if stamp is None:
        if (dst / MANIFEST_NAME).exists():
            raise ConfigError(f"refusing to unstage {dst}: it is a cachebuild cache but not a staged copy (no {STAMP_NAME}); delete it yourself if you mean to")
        raise ConfigError(f"refusing to unstage {dst}: not a staged cachebuild cache (no {STAMP_NAME})")
    names = set(stamp.get("expected", [])) | set(stamp["files"])
    files = sum(1 for p in dst.iterdir() if p.is_file() and (p.name in names or p.name == MANIFEST_NAME or is_tmp_name(p)))
    freed = _clean(dst, {MANIFEST_NAME}) + _clean(dst, names)
    files += _clean_leases(dst)
    freed += (dst / STAMP_NAME).stat().st_size
    (dst / STAMP_NAME).unlink()
    left = tuple(sorted(p.name for p in dst.iterdir()))
    if not left:
        dst.rmdir()
        if dst.parent == DEFAULT_ROOT and not any(DEFAULT_ROOT.iterdir()):
            DEFAULT_ROOT.rmdir()
    return UnstageResult(dst, files + 1, freed, left=left)
