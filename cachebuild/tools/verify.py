"""Check a cache end to end: every shard's checksum, every member's name, every record decoded.

Decoding goes through the loader's own decoder (:func:`cachebuild.format.decode.read_block`,
in blocks of bounded size, on shards opened by :class:`cachebuild.format.reader.ShardSet`),
so what ``verify`` passes is what training reads, and a fault reads the same in both.
Beyond what the loader checks, ``verify`` hashes every tar against the manifest and checks
what only ``tar -x`` + ``zstd -d`` users see (:func:`cachebuild.format.records.check_headers`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cachebuild.errors import CacheBuildError, ShardCorruptError
from cachebuild.format.decode import read_block
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, read_manifest
from cachebuild.format.names import JSON_DTYPE, record_key
from cachebuild.format.reader import ShardSet
from cachebuild.format.records import check_headers, check_members, record_blocks

__all__ = ["MAX_FAULTS", "VerifyReport", "verify_cache"]

MAX_FAULTS = 1000  # a wholly corrupt shard is reported, not listed member by member


@dataclass
class VerifyReport:
    """Faults found (one line each, naming shard, record and field) and what was checked."""

    root: Path
    shards: int = 0
    records: int = 0
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults


def _decode(shards: ShardSet, ids: np.ndarray, names: list[str], threads: int) -> None:
    """Decode ``names`` of records ``ids`` as the loader does, then check their headers."""
    read_block(shards, ids, names, threads)
    check_headers(shards, ids, names)


def _decode_shard(shards: ShardSet, s: int, report: VerifyReport, threads: int) -> None:
    """Every record of shard ``s``, a block at a time; a block that fails is decoded again member by
    member, so every faulty member is listed (up to :data:`MAX_FAULTS`), and a fault of a zstd frame
    that several records share (format v4) once, naming the others (:class:`_SharedFaults`)."""
    names = shards.manifest.field_names
    for a, b in record_blocks(shards, s):
        try:
            _decode(shards, np.arange(a, b), names, threads)
        except ShardCorruptError:
            _decode_members(shards, s, a, b, report)
            if len(report.faults) >= MAX_FAULTS:
                return
        report.records += b - a


def _decode_members(shards: ShardSet, s: int, a: int, b: int, report: VerifyReport) -> None:
    """Records ``[a, b)`` of shard ``s`` member by member, each fault to ``report`` (up to :data:`MAX_FAULTS`)."""
    shared = _SharedFaults(shards, s, report)
    try:
        for rid in range(a, b):
            for name in shards.manifest.field_names:
                try:
                    _decode(shards, np.array([rid]), [name], 1)
                except ShardCorruptError as exc:
                    shared.add(rid, name, str(exc))
                    if len(report.faults) >= MAX_FAULTS:
                        return
    finally:
        shared.close()


class _SharedFaults:
    """Faults of one block of shard ``s``: a record whose entry shares a zstd frame with a record already
    at fault, with the same fault, is counted on that record's line (``... (the zstd frame it shares
    with records K..L: the same fault in all N)``) instead of a line of its own: one flipped byte in
    a frame of 512 labels is one fault, not 512."""

    def __init__(self, shards: ShardSet, s: int, report: VerifyReport):
        self.shards, self.s, self.report = shards, s, report
        self.seen: dict[tuple[str, int, str], list[int]] = {}  # (field, frame offset, fault text after the field) -> [line, first rid, last rid, count]

    def add(self, rid: int, name: str, text: str) -> None:
        local, j = rid - int(self.shards.starts[self.s]), self.shards.field_pos[name]
        shared = self.shards.codec == "zstd" and bool(self.shards.layout(self.s).shared[local, j])
        key = (name, int(self.shards.shard(self.s).index[local, j]["offset"]), text.split(f"field '{name}': ", 1)[-1])
        hit = self.seen.get(key) if shared else None
        if hit is not None:
            hit[2:] = [rid, hit[3] + 1]
            return
        if shared:
            self.seen[key] = [len(self.report.faults), rid, rid, 1]
        self.report.faults.append(text)

    def close(self) -> None:
        first = int(self.shards.manifest.shards[self.s].first_record) - int(self.shards.starts[self.s])
        for line, a, b, count in self.seen.values():
            if count > 1:
                self.report.faults[line] += f" (the zstd frame it shares with records {record_key(first + a + 1)}..{record_key(first + b)}: the same fault in all {count})"


Extent = dict[int, tuple[np.ndarray, np.ndarray]]
"""Per array field (by position): the smallest and largest shape of the records seen so far."""


def _grow_extent(extent: Extent, index: np.ndarray, manifest: Manifest) -> None:
    """Widen ``extent`` by the shapes in one shard's (checked) index."""
    for j, f in enumerate(manifest.fields):
        if f.dtype == JSON_DTYPE or not f.ndim or not len(index):
            continue
        shapes = index[:, j]["shape"][:, : f.ndim].astype(np.int64)
        lo, hi = shapes.min(axis=0), shapes.max(axis=0)
        if j in extent:
            lo, hi = np.minimum(lo, extent[j][0]), np.maximum(hi, extent[j][1])
        extent[j] = (lo, hi)


def _schema_faults(manifest: Manifest, extent: Extent, root: Path) -> list[str]:
    """The manifest's ``max_shape``/``min_shape`` must be its records' (the writer computes them from
    the indexes); the loader's views size every batch by ``max_shape``, so a larger one is a fault."""
    faults = []
    for j, f in enumerate(manifest.fields):
        if j not in extent:
            continue
        for key, said, got, word in (("max_shape", f.max_shape, extent[j][1], "largest"), ("min_shape", f.min_shape, extent[j][0], "smallest")):
            if list(said) != got.tolist():
                faults.append(f"{root / MANIFEST_NAME}: fields.{f.name}.{key} = {list(said)}, but its records' {word} shape is {got.tolist()} (not written by cachebuild; readers size batches by it)")
    return faults


def _verify_shard(shards: ShardSet, s: int, decode: bool, report: VerifyReport, threads: int, extent: Extent) -> bool:
    """Check shard ``s`` (faults go to ``report``); False if it could not be opened."""
    entry = shards.manifest.shards[s]
    try:
        sh = shards.shard(s)  # files present, sizes, index sha256, index vs manifest and tar, first/last keys
    except CacheBuildError as exc:
        report.faults.append(str(exc))
        return False
    _grow_extent(extent, sh.index, shards.manifest)
    if hashlib.sha256(sh.view).hexdigest() != entry.sha256:
        report.faults.append(f"shard {entry.name}: sha256 mismatch (corrupt)")
    try:
        check_members(shards, s)
    except ShardCorruptError as exc:
        report.faults.append(str(exc))
        return True
    if decode:
        _decode_shard(shards, s, report, threads)
    return True


def verify_cache(root: str | Path, decode: bool = True, progress: bool = False) -> VerifyReport:
    """Verify every shard of the cache at ``root``; faults are collected, not raised."""
    from tqdm.auto import tqdm

    root = Path(root)
    manifest = read_manifest(root)
    report = VerifyReport(root)
    threads = min(8, os.cpu_count() or 1)
    extent: Extent = {}
    opened = 0
    with ShardSet(manifest, root, verify="crc") as shards:
        for s in tqdm(range(len(manifest.shards)), unit=" shards", disable=not progress):
            try:
                opened += _verify_shard(shards, s, decode, report, threads, extent)
            finally:
                shards.release([s])
            report.shards += 1
    if opened == len(manifest.shards):  # (a shard that did not open is already a fault; its shapes are unknown)
        report.faults += _schema_faults(manifest, extent, root)
    return report
