"""Check a cache end to end: every shard's checksum, every record decoded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cachebuild.builder.markers import file_sha256
from cachebuild.errors import ShardCorruptError
from cachebuild.format.index_check import check_member_keys
from cachebuild.format.manifest import Manifest, read_manifest
from cachebuild.format.shard_reader import ShardReader

__all__ = ["VerifyReport", "verify_cache", "MAX_FAULTS"]

MAX_FAULTS = 1000  # per shard: a wholly corrupt shard is reported, not listed member by member


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


def _verify_shard(manifest: Manifest, root: Path, i: int, decode: bool, report: VerifyReport) -> None:
    entry = manifest.shards[i]
    tar, idx = root / entry.name, root / entry.index
    for path in (tar, idx):
        if not path.exists():
            report.faults.append(f"shard {entry.name}: {path.name} is missing")
            return
    if tar.stat().st_size != entry.bytes:
        report.faults.append(f"shard {entry.name}: {tar.stat().st_size} bytes, manifest says {entry.bytes} (truncated or replaced)")
        return
    if file_sha256(tar) != entry.sha256:
        report.faults.append(f"shard {entry.name}: sha256 mismatch (corrupt)")
    if file_sha256(idx) != entry.index_sha256:
        report.faults.append(f"shard {entry.name}: index {entry.index} sha256 mismatch (corrupt)")
        return
    try:
        reader = ShardReader.open(manifest, root, i, check_crc=True, strict=True)
    except ShardCorruptError as exc:
        report.faults.append(str(exc))
        return
    with reader:
        try:
            check_member_keys(reader._view, reader.index, manifest.fields, manifest.codec.name, entry.name, entry.first_record, range(len(reader)))
        except ShardCorruptError as exc:
            report.faults.append(str(exc))
            return
        if not decode:
            return
        for r in range(len(reader)):
            for f in manifest.fields:
                try:
                    reader.read(r, f.name)
                except ShardCorruptError as exc:
                    report.faults.append(str(exc))
                    if len(report.faults) >= MAX_FAULTS:
                        return
            report.records += 1


def verify_cache(root: str | Path, decode: bool = True, progress: bool = False) -> VerifyReport:
    """Verify every shard of the cache at ``root``; faults are collected, not raised."""
    from tqdm.auto import tqdm

    root = Path(root)
    manifest = read_manifest(root)
    report = VerifyReport(root)
    for i in tqdm(range(len(manifest.shards)), unit=" shards", disable=not progress):
        _verify_shard(manifest, root, i, decode, report)
        report.shards += 1
    return report
