"""Build a cache: plan shards, make the missing ones in parallel, write the manifest last.

Same source config and seed give byte-identical shards whatever the worker
count or backend, and however often the build was interrupted: each shard is a
pure function of (config, seed, shard index), written under a temporary name,
renamed (or uploaded) when complete, and marked done; a rerun skips shards that
verify.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cachebuild.builder.backends import BACKENDS, run_jobs
from cachebuild.builder.cluster_check import check_cluster
from cachebuild.builder.collector import fewer_collections
from cachebuild.builder.checked import block_records_of, check_schema, fill_shard, probe_source
from cachebuild.builder.determinism import build_environment, source_determinism
from cachebuild.builder.lock import build_lock
from cachebuild.builder.markers import BUILD_RECORD, done_name, read_valid_done, write_done
from cachebuild.builder.overwrite import discard_unstarted, finish_swap, open_staging, staged_note, swap_in
from cachebuild.builder.output import LocalOutput, Output, open_output
from cachebuild.builder.pack_choice import choose_pack, choose_share
from cachebuild.builder.plan import BLOCK_RECORDS, ShardSpec, plan_shards
from cachebuild.builder.prepare import check_local, complete_read_only, prepare_out, read_only_folder, read_only_refusal, refuse_foreign, remove_leftovers
from cachebuild.builder.source import RecordSource
from cachebuild.builder.stale import changed_inputs_note
from cachebuild.builder.stop import raise_if_stopped
from cachebuild.checks import MAX_RECORDS, MAX_SHARDS
from cachebuild.errors import ConfigError, OutputError, ShardCorruptError
from cachebuild.format.codec import Codec
from cachebuild.format.index import index_from_bytes
from cachebuild.format.json_text import nonfinite_at
from cachebuild.format.limits import MAX_MEMBER_BYTES
from cachebuild.format.malloc import tune_malloc
from cachebuild.format.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardEntry, schemas_from_indexes, shape_bounds
from cachebuild.format.shard_writer import ShardWriter

__all__ = ["BuildOptions", "BuildSummary", "build_fresh", "BACKENDS"]


@dataclass(frozen=True)
class BuildOptions:
    """How to build (not what): where, how many records, seed, codec, shard size, parallelism.

    ``out`` is a folder or an fsspec URL; ``address`` is the Dask scheduler or
    Ray cluster for those backends (None: start a local one).
    """

    out: Path | str
    records: int
    seed: int = 0
    codec: Codec = Codec()
    shard_bytes: int = 256 << 20
    workers: int | None = None
    backend: str = "loky"
    address: str | None = None
    overwrite: bool = False
    progress: bool = True
    sync: bool = True
    storage_options: dict[str, Any] = field(default_factory=dict)
    append: bool = False  # add a generation to the cache at ``out`` (see cachebuild.builder.append)
    keep: int | None = None  # with append: keep only the newest ``keep`` generations listed
    pack_given: bool = False  # codec.pack was asked for (not the default): an append refuses one that packs otherwise than the cache
    seed_given: bool = True  # False: the seed is the default, and an append takes the cache's own
    codec_given: bool = True  # False: codec name and level are the defaults, and an append takes the cache's own

    def validate(self) -> None:
        if isinstance(self.out, str) and not self.out.strip():
            raise ConfigError(f"--out is empty ({self.out!r}): name the cache folder or URL (an unset shell variable?)")
        if not isinstance(self.records, int) or isinstance(self.records, bool) or not 1 <= self.records <= MAX_RECORDS:
            raise ConfigError.bad_value("records", self.records, f"must be a whole number from 1 to {MAX_RECORDS}")
        if self.shard_bytes < 1:
            raise ConfigError.bad_value("build.shard_mb", self.shard_bytes, "must be > 0")
        if self.workers is not None and self.workers < 1:
            raise ConfigError.bad_value("workers", self.workers, "must be >= 1")
        if self.backend not in BACKENDS:
            raise ConfigError.bad_value("backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        if self.keep is not None and (not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 1):
            raise ConfigError.bad_value("keep", self.keep, "must be a whole number >= 1 (generations listed after the append)")
        if self.keep is not None and not self.append:
            raise ConfigError(f"keep={self.keep} (--keep) only applies to an append: add --append (or use `cachebuild prune`)")
        if self.append and self.overwrite:
            raise ConfigError("--append and --overwrite contradict each other: an append keeps the cache, --overwrite replaces it")


def _n(count: int, word: str) -> str:
    """``1 shard``, ``3 shards``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def ratio_text(ratio: float, pack: int = 1, shards: Sequence[ShardEntry] = ()) -> str:
    """The compression ratio, saying why a cache can be larger than its data (tar framing, e.g. a raw
    cache); ``--pack`` is advised only to a cache of one record per member (``pack`` 1). ``shards``:
    the cache's, so that shards holding fewer records than ``pack`` (a small ``--shard-mb``; a group
    never crosses a shard) are counted as the members they are, and said where there are several."""
    if ratio >= 0.9 or ratio == 0.0:  # (a raw packed cache stores ~0.98x: tar framing and the index)
        return f"ratio {ratio:.2f}x"
    groups = sum(-(-s.records // max(1, s.pack)) for s in shards)
    per = min(pack, round(sum(s.records for s in shards) / groups)) if groups else pack
    members = "--pack N lets N records share one" if pack == 1 else f"one per {per} records and field"
    if pack > 1 and len(shards) > 1 and max(s.records for s in shards) < pack:
        members += f": shards hold fewer records than pack = {pack}, a larger --shard-mb packs more per member"
    return f"ratio {ratio:.2f}x: tar headers and padding (about 1 KB per member; {members}) outweigh what compression saved, if any"


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced, for the CLI's closing lines and for callers."""

    out: str
    records: int
    shards: int
    built: int
    skipped: int
    raw_bytes: int
    stored_bytes: int
    seconds: float
    already_complete: bool = False
    generation: int | None = None  # an append: the generation it committed, and those the manifest lists
    generations: tuple[int, ...] = ()
    pack: int = 1  # records per tar member (for the ratio's explanation)
    entries: tuple[ShardEntry, ...] = ()  # the shards summed up (the ratio's explanation counts their members)
    notes: tuple[str, ...] = ()  # closing remarks (an --overwrite build staged in the cache, not yet swapped in)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 0.0

    def lines(self, unit: str = "records") -> list[str]:
        if self.already_complete:
            return [f"cache at {self.out} is already complete ({self.records} {unit}, {_n(self.shards, 'shard')}): nothing to do", *(f"note: {n}" for n in self.notes)]
        share = self.built / self.shards if self.shards else 0.0  # a resume's rate counts only what it built
        rate = self.records * share / self.seconds if self.seconds > 0 else 0.0
        mbs = self.raw_bytes * share / 1e6 / max(self.seconds, 1e-9)
        built = "" if self.built == self.shards else f" (the {_n(self.built, 'shard')} built now)"
        if self.generation is not None:
            listed = f"{self.generations[0]}..{self.generations[-1]}" if len(self.generations) > 1 else str(self.generations[0])
            return [
                f"appended generation {self.generation} to {self.out}: {self.records} {unit} in {_n(self.shards, 'shard')} "
                f"({self.built} built, {self.skipped} already done); the manifest lists generations {listed}",
                f"raw {self.raw_bytes / 1e6:.1f} MB -> stored {self.stored_bytes / 1e6:.1f} MB ({ratio_text(self.ratio, self.pack, self.entries)})",
                f"time {self.seconds:.2f} s, {rate:,.0f} {unit}/s{built}",
            ]
        timing = f"time {self.seconds:.2f} s, {rate:,.0f} {unit}/s, {mbs:,.0f} MB/s raw{built}"
        if self.built == 0:  # a rerun that found every shard built (its manifest was missing): nothing to rate
            timing = f"time {self.seconds:.2f} s: every shard was already built, the manifest is written"
        return [
            f"built {self.out}: {self.records} {unit} in {_n(self.shards, 'shard')} ({self.built} built, {self.skipped} already done)",
            f"raw {self.raw_bytes / 1e6:.1f} MB -> stored {self.stored_bytes / 1e6:.1f} MB ({ratio_text(self.ratio, self.pack, self.entries)})",
            timing,
            *(f"note: {n}" for n in self.notes),
        ]


MIN_SHARDS = 16


def records_per_shard(total: int, shard_bytes: int, record_bytes: int) -> int:
    """Records per shard: about ``shard_bytes`` raw, but cut smaller (down to one
    block) so mid-size caches still have ~16 shards for parallel builds and
    shuffling. Depends on the plan only, never on the worker count."""
    by_size = max(1, shard_bytes // max(1, record_bytes))
    by_count = max(BLOCK_RECORDS, -(-total // MIN_SHARDS))
    return max(1, min(by_size, by_count))


def _fingerprint_doc(source: RecordSource, opts: BuildOptions, per_shard: int) -> dict[str, Any]:
    """Everything a shard's bytes depend on; its hash is the build fingerprint. The config goes into
    the manifest, which is standard JSON: a NaN or infinite value in it is refused before anything is built."""
    config = source.config_dict()
    bad = nonfinite_at(config)
    if bad is not None:
        raise ConfigError(f"config key '{bad[0]}' is {bad[1]!r}: the recipe is stored in the manifest as JSON, which has no NaN or Infinity")
    return {
        "version": FORMAT_VERSION,
        "kind": source.kind,
        "config": config,
        "seed": opts.seed,
        "codec": opts.codec.to_dict(),
        "records": opts.records,
        "records_per_shard": per_shard,
        "determinism": source_determinism(source, block_records_of(source)),  # block size, numpy version
    }


def _fingerprint(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class BuiltShard:
    """What a shard job returns: the shard, and its index reduced to what the manifest's field schemas
    need (:func:`~cachebuild.format.manifest.shape_bounds`, two rows), so the build's process does not
    read every index back after the last shard (0.15 s of a 100k build, with both cores idle but one)."""

    entry: ShardEntry
    bounds: np.ndarray


def _build_shard(spec: ShardSpec, source: RecordSource, seed: int, out: Output, codec: Codec, fingerprint: str, sync: bool, own_process: bool) -> BuiltShard:
    """Make one shard from scratch, publish it, then mark it done (runs in a worker)."""
    if own_process:
        tune_malloc()  # a build worker process, not the caller's
    writer = ShardWriter(out.staging(), spec.name, source.fields(), codec, first_record=spec.start)
    try:
        with fewer_collections():
            fill_shard(writer, source, seed, spec)
        raise_if_stopped(fresh=True)  # never renamed into place for a build that has stopped (cachebuild.builder.stop)
        shard = writer.close(sync=sync)
    except BaseException:
        writer.abort()
        raise
    out.publish([shard.index, shard.name])
    write_done(out, shard, fingerprint, sync=sync)
    assert writer.index is not None  # (set by close)
    return BuiltShard(shard, shape_bounds(writer.index))


def finished_shards(out: Output, plan: Sequence[ShardSpec], fingerprint: str, deep: bool) -> dict[int, ShardEntry]:
    """The shards of ``plan`` already built for this ``fingerprint`` (a valid done marker; ``deep``: files re-hashed)."""
    done: dict[int, ShardEntry] = {}
    for spec in plan:
        shard = read_valid_done(out, spec.name, fingerprint, deep=deep)
        if shard is not None:
            done[spec.index] = shard
    return done


def _progress(total: int, unit: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=f" {unit}", unit_scale=True, disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def build_fresh(source: RecordSource, opts: BuildOptions, unit: str = "records") -> BuildSummary:
    """Build (or finish, or confirm) the cache described by ``source`` and ``opts`` (not an append:
    :func:`cachebuild.builder.build_cache` picks this or :func:`cachebuild.builder.append.append_cache`)."""
    opts.validate()
    check_cluster(opts.backend, opts.address)  # before the output is touched: a wrong address costs nothing
    check_schema(source)
    t0 = time.perf_counter()
    record_bytes = source.estimated_record_bytes()
    if record_bytes > MAX_MEMBER_BYTES:
        raise ConfigError(f"one record would take about {record_bytes} bytes, more than the {MAX_MEMBER_BYTES}-byte limit of a member: check the recipe's sizes (samples, nodes, segments)")
    per_shard = records_per_shard(opts.records, opts.shard_bytes, record_bytes)
    n_shards = -(-opts.records // per_shard)
    if n_shards > MAX_SHARDS:
        raise ConfigError(f"{opts.records} records at {per_shard} per shard make {n_shards} shards, more than {MAX_SHARDS}: raise build.shard_mb or build fewer records")
    out = open_output(opts.out, opts.storage_options)
    if not isinstance(out, LocalOutput):
        finish_swap(out)  # an --overwrite swap a crash interrupted goes forward first (the pack choice reads the manifest)
        return _build(source, _with_pack(opts, record_bytes, out), out, unit, t0, per_shard)
    if read_only_folder(out):  # nothing may be written there: only "this cache is complete" is an answer
        opts = _with_pack(opts, record_bytes, out)
        doc = _fingerprint_doc(source, opts, per_shard)
        manifest = complete_read_only(out, _fingerprint(doc))
        if manifest is not None:
            return _complete(out, manifest, t0, source)
        raise read_only_refusal(out)
    check_local(out)
    refuse_foreign(out, out.names())  # again under the lock (prepare_out): here so a stranger's folder gets no lock file
    with build_lock(out.path):
        finish_swap(out)
        return _build(source, _with_pack(opts, record_bytes, out), out, unit, t0, per_shard)


def _with_pack(opts: BuildOptions, record_bytes: int, out: Output) -> BuildOptions:
    """``opts`` with the pack (and shared-frame bound) to write (an ``--overwrite`` replaces the cache there: it does not take its layout)."""
    there = None if opts.overwrite else out
    codec = replace(opts.codec, pack=choose_pack(opts.codec.pack, opts.pack_given, record_bytes, there))
    return replace(opts, codec=replace(codec, share=choose_share(codec, there)))


def _build(source: RecordSource, opts: BuildOptions, out: Output, unit: str, t0: float, per_shard: int) -> BuildSummary:
    """The build itself, with the output's lock held (local outputs): in place, or staged then swapped in (``--overwrite``)."""
    plan = plan_shards(opts.records, per_shard)
    doc = _fingerprint_doc(source, opts, per_shard)
    fingerprint = _fingerprint(doc)
    state = prepare_out(out, doc, fingerprint, opts.overwrite)
    if state == "complete":
        return _complete(out, Manifest.from_json(out.read_bytes(MANIFEST_NAME), out.location), t0, source)
    notes: tuple[str, ...] = ()
    if state == "build":
        built, shards = _make(source, opts, out, plan, doc, fingerprint, unit)
    else:
        target, ready = open_staging(out, fingerprint, lambda: probe_source(source, opts.seed, plan[0]))
        try:
            built, shards = (0, list(Manifest.from_json(target.read_bytes(MANIFEST_NAME), target.location).shards)) if ready else _make(source, opts, target, plan, doc, fingerprint, unit)
        except Exception:
            discard_unstarted(out)  # a staged build that finished no shard leaves nothing behind
            raise
        swap_in(out)
        notes = (f"--overwrite: built in {target.location}, then swapped in for the cache of another recipe",)
    raw, stored = sum(s.raw_bytes for s in shards), sum(s.bytes for s in shards)
    return BuildSummary(out.location, opts.records, len(plan), built, len(plan) - built, raw, stored, time.perf_counter() - t0, pack=opts.codec.pack, entries=tuple(shards), notes=notes)


def _complete(out: Output, m: Manifest, t0: float, source: RecordSource) -> BuildSummary:
    """The summary of a rerun that found its cache complete: nothing to do (and what may make it stale)."""
    raw, stored = sum(s.raw_bytes for s in m.shards), sum(s.bytes for s in m.shards)
    notes = (staged_note(out), changed_inputs_note(source, out.path, MANIFEST_NAME) if isinstance(out, LocalOutput) else None)
    return BuildSummary(out.location, m.records, len(m.shards), 0, len(m.shards), raw, stored, time.perf_counter() - t0, True, pack=m.codec.pack, entries=m.shards, notes=tuple(n for n in notes if n))


def _make(source: RecordSource, opts: BuildOptions, out: Output, plan: list[ShardSpec], doc: dict[str, Any], fingerprint: str, unit: str) -> tuple[int, list[ShardEntry]]:
    """Build the shards of ``plan`` not yet done at ``out`` (the cache folder, or an --overwrite's staging folder),
    then its manifest; returns (shards built now, every shard)."""
    per_shard = doc["records_per_shard"]
    out.write_json(BUILD_RECORD, {"fingerprint": fingerprint, "doc": doc, "kind": source.kind, "records": opts.records, "records_per_shard": per_shard}, opts.sync)
    deep = isinstance(out, LocalOutput)
    done = finished_shards(out, plan, fingerprint, deep)
    todo = [spec for spec in plan if spec.index not in done]
    for spec in todo:
        out.remove(done_name(spec.name))
    bar = _progress(opts.records, unit, opts.progress)
    bar.update(sum(s.records for s in done.values()))
    built_raw = 0
    bounds: dict[int, np.ndarray] = {}  # of the shards built now (a resumed shard's index is read at the end)
    try:
        own_process = opts.backend != "threading" and not (opts.backend == "loky" and min(opts.workers or os.cpu_count() or 1, len(todo)) <= 1)
        args = (source, opts.seed, out, opts.codec, fingerprint, opts.sync, own_process)
        # closed on the way out, so that a stopped build's jobs stop (and say so) now: an interrupt landing here, between
        # two results, left the generator, and the wait for its running shards, to the garbage collector, after the CLI's exit
        with contextlib.closing(run_jobs(_build_shard, todo, args, opts.backend, opts.workers, opts.address, quiet=not opts.progress)) as jobs:
            for built in jobs:
                shard = built.entry
                done[_index_of(shard)] = shard
                bounds[_index_of(shard)] = built.bounds
                built_raw += shard.raw_bytes
                bar.update(shard.records)
                bar.set_postfix_str(f"{built_raw / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.0f} MB/s", refresh=False)
    finally:
        bar.close()
    shards = [done[spec.index] for spec in plan]
    remove_leftovers(out)  # a worker killed mid-shard (a lost Dask or Ray worker) left its temp file; the shard was redone
    _write_final_manifest(source, opts, out, shards, fingerprint, per_shard, bounds)
    out.remove(BUILD_RECORD)
    out.close_staging()  # a remote output's local staging folder ($TMPDIR/cachebuild-staging/<digest>), now empty
    return len(todo), shards


def _index_of(shard: ShardEntry) -> int:
    return int(shard.name.removeprefix("shard-").removesuffix(".tar"))


def _load_index(out: Output, shard: ShardEntry, n_fields: int) -> np.ndarray:
    """A shard's index (plain or compressed) as a view of the file's bytes (``np.load`` of a stream copies it
    in 256 KB steps), read bounded by its records x fields (a resumed shard was written by an earlier run)."""
    name = shard.index
    try:
        return index_from_bytes(out.read_bytes(name), f"{out.location}/{name}", n_fields, shard.records)
    except ShardCorruptError as exc:
        raise OutputError(str(exc)) from exc


def _write_final_manifest(source: RecordSource, opts: BuildOptions, out: Output, shards: list[ShardEntry], fingerprint: str, per_shard: int, bounds: dict[int, np.ndarray]) -> None:
    """The manifest, last; ``bounds``: :class:`BuiltShard.bounds` of the shards built now (the others' indexes are read)."""
    from cachebuild._version import __version__

    fields = list(source.fields())
    indexes = [bounds[_index_of(s)] if _index_of(s) in bounds else _load_index(out, s, len(fields)) for s in shards]
    manifest = Manifest(
        kind=source.kind,
        config=source.config_dict(),
        seed=opts.seed,
        codec=opts.codec,
        fields=schemas_from_indexes(fields, indexes, [s.name for s in shards]),
        shards=tuple(shards),
        build={
            "fingerprint": fingerprint,
            "records_per_shard": per_shard,
            "block_records": block_records_of(source),
            "determinism": source_determinism(source, block_records_of(source)),
            "environment": build_environment(),
        },
        created_by=f"cachebuild {__version__}",
    )
    out.write_bytes(MANIFEST_NAME, manifest.to_json())
