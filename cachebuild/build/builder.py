"""Build a cache: plan shards, make the missing ones in parallel, write the manifest last.

Same source config and seed give byte-identical shards whatever the worker
count or backend, and however often the build was interrupted: each shard is a
pure function of (config, seed, shard index), written under a temporary name,
renamed when complete, and marked done; a rerun skips shards that verify.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cachebuild.build.markers import BUILD_RECORD, done_name, read_json, read_valid_done, write_done, write_json
from cachebuild.build.plan import BLOCK_RECORDS, ShardSpec, plan_shards
from cachebuild.build.source import RecordSource
from cachebuild.errors import CacheMismatchError, ConfigError, OutputError
from cachebuild.format.atomic import is_tmp_name, output_error
from cachebuild.format.codec import Codec
from cachebuild.format.index import load_index
from cachebuild.format.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardEntry, read_manifest, schemas_from_indexes, write_manifest
from cachebuild.format.shard_writer import ShardWriter, WrittenShard, index_name

__all__ = ["BuildOptions", "BuildSummary", "build_cache", "BACKENDS"]

BACKENDS = ("loky", "threading", "dask", "ray")


@dataclass(frozen=True)
class BuildOptions:
    """How to build (not what): where, how many records, seed, codec, shard size, parallelism."""

    out: Path
    records: int
    seed: int = 0
    codec: Codec = Codec()
    shard_bytes: int = 256 << 20
    workers: int | None = None
    backend: str = "loky"
    backend_args: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    progress: bool = True
    sync: bool = True

    def validate(self) -> None:
        if not isinstance(self.records, int) or self.records < 1:
            raise ConfigError.bad_value("records", self.records, "must be a whole number >= 1")
        if self.shard_bytes < 1:
            raise ConfigError.bad_value("build.shard_mb", self.shard_bytes, "must be > 0")
        if self.workers is not None and self.workers < 1:
            raise ConfigError.bad_value("workers", self.workers, "must be >= 1")
        if self.backend not in BACKENDS:
            raise ConfigError.bad_value("backend", self.backend, f"must be one of {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced, for the CLI's closing lines and for callers."""

    out: Path
    records: int
    shards: int
    built: int
    skipped: int
    raw_bytes: int
    stored_bytes: int
    seconds: float
    already_complete: bool = False

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 0.0

    def lines(self, unit: str = "records") -> list[str]:
        if self.already_complete:
            return [f"cache at {self.out} is already complete ({self.records} {unit}, {self.shards} shards): nothing to do"]
        rate = self.records / self.seconds if self.seconds > 0 and self.built else 0.0
        return [
            f"built {self.out}: {self.records} {unit} in {self.shards} shards ({self.built} built, {self.skipped} already done)",
            f"raw {self.raw_bytes / 1e6:.1f} MB -> stored {self.stored_bytes / 1e6:.1f} MB (ratio {self.ratio:.2f}x)",
            f"time {self.seconds:.2f} s, {rate:,.0f} {unit}/s, {self.raw_bytes / 1e6 / max(self.seconds, 1e-9):,.0f} MB/s raw",
        ]


def _fingerprint(source: RecordSource, opts: BuildOptions, per_shard: int) -> str:
    doc = {
        "version": FORMAT_VERSION,
        "kind": source.kind,
        "config": source.config_dict(),
        "seed": opts.seed,
        "codec": opts.codec.to_dict(),
        "records": opts.records,
        "records_per_shard": per_shard,
        "block_records": BLOCK_RECORDS,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _is_ours(p: Path) -> bool:
    n = p.name
    return n in (MANIFEST_NAME, BUILD_RECORD) or n.startswith("shard-") or is_tmp_name(p)


def _prepare_out(out: Path, fingerprint: str, overwrite: bool) -> bool:
    """Make ``out`` ready; True when it already holds this exact complete cache."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"output path {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(out, exc) from exc
    if not os.access(out, os.W_OK):
        raise OutputError(f"cannot write {out}: not writable")
    entries = list(out.iterdir())
    foreign = [p.name for p in entries if not _is_ours(p)]
    if foreign and not (out / MANIFEST_NAME).exists() and not (out / BUILD_RECORD).exists():
        raise OutputError(f"output folder {out} is not empty and is not a cachebuild cache (found {foreign[0]!r}); choose another --out")
    previous = None
    if (out / MANIFEST_NAME).exists():
        previous = (read_json(out / MANIFEST_NAME) or {}).get("build", {}).get("fingerprint")
        if previous == fingerprint:
            return True
    elif (out / BUILD_RECORD).exists():
        previous = (read_json(out / BUILD_RECORD) or {}).get("fingerprint")
    if previous is not None and previous != fingerprint:
        if not overwrite:
            raise CacheMismatchError(
                f"{out} holds a cache built with another config, seed, codec or size; "
                "pass --overwrite to replace it, or choose another --out"
            )
        (out / MANIFEST_NAME).unlink(missing_ok=True)  # first: the old cache stops being complete
        for p in entries:
            if _is_ours(p) and p.name != MANIFEST_NAME:
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    for p in entries:
        if is_tmp_name(p) and p.exists():
            p.unlink(missing_ok=True)
    return False


def _build_shard(source: RecordSource, seed: int, spec: ShardSpec, out: Path, codec: Codec, fingerprint: str, sync: bool) -> WrittenShard:
    """Make one shard from scratch (runs in a worker process)."""
    writer = ShardWriter(out, spec.name, source.fields(), codec, first_record=spec.start)
    try:
        for block in source.blocks(seed, spec.index, spec.start, spec.stop):
            for record in block:
                writer.add(record)
        if writer.records != spec.records:
            raise RuntimeError(f"source made {writer.records} records for {spec.name}, plan says {spec.records}")
        shard = writer.close(sync=sync)
    except BaseException:
        writer.abort()
        raise
    write_done(out, shard, fingerprint, sync=sync)
    return shard


def _progress(total: int, unit: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=f" {unit}", unit_scale=True, disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def _run_parallel(fn: Callable[..., WrittenShard], todo: list[ShardSpec], opts: BuildOptions, args: tuple):
    """Yield finished shards in completion order, on the chosen joblib backend."""
    from joblib import Parallel, delayed, parallel_config

    workers = opts.workers or os.cpu_count() or 1
    workers = min(workers, len(todo))
    if workers <= 1 and opts.backend == "loky":
        for spec in todo:
            yield fn(args[0], args[1], spec, *args[2:])
        return
    with parallel_config(backend=opts.backend, n_jobs=workers, **opts.backend_args):
        yield from Parallel(return_as="generator_unordered")(delayed(fn)(args[0], args[1], spec, *args[2:]) for spec in todo)


def build_cache(source: RecordSource, opts: BuildOptions, unit: str = "records") -> BuildSummary:
    """Build (or finish, or confirm) the cache described by ``source`` and ``opts``."""
    opts.validate()
    t0 = time.perf_counter()
    per_shard = max(1, opts.shard_bytes // max(1, source.estimated_record_bytes()))
    plan = plan_shards(opts.records, per_shard)
    fingerprint = _fingerprint(source, opts, per_shard)
    out = Path(opts.out)
    if _prepare_out(out, fingerprint, opts.overwrite):
        m = read_manifest(out)
        return BuildSummary(out, m.records, len(m.shards), 0, len(m.shards), sum(s.raw_bytes for s in m.shards), sum(s.bytes for s in m.shards), time.perf_counter() - t0, True)
    write_json(out / BUILD_RECORD, {"fingerprint": fingerprint, "kind": source.kind, "records": opts.records, "records_per_shard": per_shard}, opts.sync)

    done: dict[int, WrittenShard] = {}
    for spec in plan:
        shard = read_valid_done(out, spec.name, fingerprint)
        if shard is not None:
            done[spec.index] = shard
        else:
            (out / done_name(spec.name)).unlink(missing_ok=True)
    skipped = len(done)
    todo = [spec for spec in plan if spec.index not in done]
    bar = _progress(opts.records, unit, opts.progress)
    bar.update(sum(s.records for s in done.values()))
    built_raw = 0
    try:
        for shard in _run_parallel(_build_shard, todo, opts, (source, opts.seed, out, opts.codec, fingerprint, opts.sync)):
            done[plan[_index_of(shard)].index] = shard
            built_raw += shard.raw_bytes
            bar.update(shard.records)
            bar.set_postfix_str(f"{built_raw / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.0f} MB/s", refresh=False)
    finally:
        bar.close()
    shards = [done[spec.index] for spec in plan]
    _write_final_manifest(source, opts, out, shards, fingerprint, per_shard)
    (out / BUILD_RECORD).unlink(missing_ok=True)
    return BuildSummary(
        out,
        opts.records,
        len(plan),
        len(todo),
        skipped,
        sum(s.raw_bytes for s in shards),
        sum(s.bytes for s in shards),
        time.perf_counter() - t0,
    )


def _index_of(shard: WrittenShard) -> int:
    return int(shard.name.removeprefix("shard-").removesuffix(".tar"))


def _write_final_manifest(source: RecordSource, opts: BuildOptions, out: Path, shards: list[WrittenShard], fingerprint: str, per_shard: int) -> None:
    from cachebuild import __version__

    fields = list(source.fields())
    indexes = [load_index(out / index_name(s.name), len(fields)) for s in shards]
    manifest = Manifest(
        kind=source.kind,
        config=source.config_dict(),
        seed=opts.seed,
        codec=opts.codec,
        fields=schemas_from_indexes(fields, indexes),
        shards=tuple(ShardEntry(**s.to_dict()) for s in shards),
        build={"fingerprint": fingerprint, "records_per_shard": per_shard, "block_records": BLOCK_RECORDS},
        created_by=f"cachebuild {__version__}",
    )
    write_manifest(out, manifest)
