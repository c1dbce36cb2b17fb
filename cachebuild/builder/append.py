"""Grow a cache by one generation: ``cachebuild generate --append`` (``build(..., append=True)``).

An append adds ``records`` fresh records to an existing local cache without
touching a byte of what is there:

* **same recipe, checked**: kind, config, seed, codec and the determinism
  keys (block size, numpy version) must equal the cache's; anything else is
  one :class:`CacheMismatchError` naming the differing keys, and nothing
  is written;
* **fresh, determined bytes**: generation g's shards are seeded with
  :func:`~cachebuild.format.generations.generation_seed` ``(seed, g)`` and
  continue the cache's shard numbers and record ids, so the same append on
  two copies of a cache gives byte-identical new shards;
* **one commit point**: shards are written and marked done like a build's,
  then the generation's manifest is written to ``generations/gen-g.json`` and
  ``manifest.json`` is replaced atomically; a reader sees generation g-1 or
  g, never part of g;
* **resumable**: the unfinished append is recorded in
  ``generations/append.json``; rerunning the same command finishes it
  (shards already done are kept), another append (other arguments) first
  discards it, and ``cachebuild prune`` discards it too;
* the build lock is held throughout, and ``keep`` (``--keep N``) lists only
  the newest N generations in the new manifest, then prunes what no reader
  holds (:mod:`cachebuild.builder.prune`).
"""

from __future__ import annotations

from dataclasses import replace

import contextlib
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from cachebuild.builder.backends import run_jobs
from cachebuild.builder.cluster_check import check_cluster
from cachebuild.format.packing import effective_pack
from cachebuild.builder.builder import BuildOptions, BuildSummary, _build_shard, finished_shards, _fingerprint_doc, _index_of, _progress, records_per_shard
from cachebuild.builder.generation_manifest import APPEND_RECORD, commit_generation, generation_table, old_shape_bounds
from cachebuild.builder.lock import build_lock
from cachebuild.builder.markers import BUILD_RECORD, STAGING_DIR, read_json, write_json
from cachebuild.builder.overwrite import SWAP_RECORD, finish_swap
from cachebuild.builder.mismatch import describe_differences, fingerprint_doc_of_manifest
from cachebuild.builder.output import LocalOutput, open_output
from cachebuild.builder.plan import ShardSpec, plan_shards
from cachebuild.builder.source import RecordSource
from cachebuild.checks import MAX_SHARDS
from cachebuild.errors import CacheMismatchError, ConfigError, ManifestError
from cachebuild.format.atomic import is_tmp_name
from cachebuild.format.generations import GENERATIONS_DIR, generation_of, generation_seed, generations_dir
from cachebuild.format.limits import MAX_MEMBER_BYTES
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, confined_file, read_manifest

__all__ = ["append_cache", "discard_unfinished", "RECIPE_KEYS"]

RECIPE_KEYS = ("kind", "config", "seed", "codec", "determinism")
"""The keys of the build fingerprint an append must share with the cache (records and shard size may differ)."""


def _local_cache(opts: BuildOptions) -> LocalOutput:
    """The output, which must be an existing local cache (checked before anything is created or locked)."""
    out = open_output(opts.out, opts.storage_options)
    if not isinstance(out, LocalOutput):
        raise ConfigError(f"--append needs a local cache folder (or a shared filesystem), got {out.location}: append there, then upload")
    if not confined_file(out.path, MANIFEST_NAME, ManifestError).is_file():  # a link out of the cache, a FIFO: refused by name
        if (out.path / BUILD_RECORD).exists():
            raise ConfigError(f"--append: {out.path} holds an unfinished build (rerun it without --append first); build the cache first (without --append)")
        what = "does not exist" if not out.path.exists() else "is not a cachebuild cache (no manifest.json)"
        raise ManifestError(f"--append: {out.path} {what}; build the cache first (without --append)")  # exit 3, as verify's
    return out


def _finish_swap(opts: BuildOptions) -> None:
    """An --overwrite swap a crash interrupted goes forward first (under the lock): the append then
    grows the cache the folder now holds, never the old one the swap is replacing."""
    out = open_output(opts.out, opts.storage_options)
    if isinstance(out, LocalOutput) and (out.path / STAGING_DIR / SWAP_RECORD).is_file():
        with build_lock(out.path):
            finish_swap(out)


def _check_recipe(manifest: Manifest, doc: dict[str, Any], where: str) -> None:
    """Refuse, naming every differing key, an append whose recipe is not the cache's."""
    cache = fingerprint_doc_of_manifest(json.loads(manifest.to_json()))
    old = {k: cache.get(k) for k in RECIPE_KEYS}
    new = {k: doc.get(k) for k in RECIPE_KEYS}
    if json.loads(json.dumps(new, default=str)) != old:
        differs = describe_differences(old, new)
        raise CacheMismatchError(f"{where} holds a cache of another recipe ({differs}); an append must use the cache's own recipe and seed")


def _next_numbers(manifest: Manifest, where: str) -> tuple[int, int]:
    """``build.next_shard`` and ``next_record``, checked against the shards listed: numbering that would reuse a
    listed shard's name or record ids (a damaged or foreign manifest) is refused, since the append would
    replace that shard's files."""
    build, last = manifest.build, -1
    for s in manifest.shards:
        if re.fullmatch(r"shard-\d{5,}\.tar", s.name) is None:
            raise ManifestError(f"{where}/{MANIFEST_NAME}: lists shard {s.name!r}, not named shard-NNNNN.tar as cachebuild names them; an append cannot number after it: nothing was changed")
        last = max(last, int(s.name[6:-4]))
    next_shard, next_record = build.get("next_shard", len(manifest.shards)), build.get("next_record", manifest.records)
    end = int(build.get("first_record", 0)) + manifest.records
    if type(next_shard) is not int or next_shard <= last:
        raise ManifestError(f"{where}/{MANIFEST_NAME}: build.next_shard = {next_shard!r}, but shard-{last:05d}.tar is listed; an append would replace its files: nothing was changed")
    if type(next_record) is not int or next_record != end:
        raise ManifestError(f"{where}/{MANIFEST_NAME}: build.next_record = {next_record!r}, but the listed records end at {end}; an append would reuse record ids: nothing was changed")
    return next_shard, next_record


def _plan(manifest: Manifest, per_shard: int, records: int, where: str) -> list[ShardSpec]:
    """The new generation's shards: shard numbers and record ids continue the cache's."""
    next_shard, next_record = _next_numbers(manifest, where)
    specs = [ShardSpec(next_shard + s.index, next_record + s.start, next_record + s.stop) for s in plan_shards(records, per_shard)]
    if specs[-1].index >= MAX_SHARDS:
        raise ConfigError(f"this append would number shards up to {specs[-1].index}, past the limit of {MAX_SHARDS}: append more records at a time (larger shards)")
    return specs


def _cache_pack(manifest: Manifest, asked: int, given: bool, record_bytes: int, where: str) -> int:
    """The cache's own ``pack``: a generation packs its records as the cache does, so old caches keep
    their layout and leaving ``pack`` out means "the cache's". A ``pack`` asked for (``given``, even
    256) that would pack differently is refused rather than silently ignored."""
    own = manifest.codec.pack
    if given and effective_pack(asked, record_bytes) != own:
        raise ConfigError(
            f"build.pack = {asked}: the cache at {where} packs {own} record{'s' if own != 1 else ''} per tar member (its codec.pack), and an append packs as the cache does: leave --pack / build.pack out"
        )
    return own


def _cache_defaults(manifest: Manifest, opts: BuildOptions) -> BuildOptions:
    """A seed, codec or level the append was not given is the cache's own (as ``pack`` is): appending
    to a cache built with ``--seed 7`` or ``--codec none`` needs only ``--append``. One that was given
    and differs is refused by the recipe check, naming it."""
    if not opts.seed_given:
        opts = replace(opts, seed=manifest.seed)
    if not opts.codec_given:
        opts = replace(opts, codec=replace(opts.codec, name=manifest.codec.name, level=manifest.codec.level))
    return opts


def append_cache(source: RecordSource, opts: BuildOptions, unit: str = "records") -> BuildSummary:
    """Add one generation of ``opts.records`` fresh records to the cache at ``opts.out`` (see the module docstring)."""
    opts.validate()
    check_cluster(opts.backend, opts.address)
    t0 = time.perf_counter()
    _finish_swap(opts)
    out = _local_cache(opts)
    record_bytes = source.estimated_record_bytes()
    if record_bytes > MAX_MEMBER_BYTES:
        raise ConfigError(f"one record would take about {record_bytes} bytes, more than the {MAX_MEMBER_BYTES}-byte limit of a member")
    with build_lock(out.path):
        return _append(source, opts, out, unit, t0, records_per_shard(opts.records, opts.shard_bytes, record_bytes))


def _append(source: RecordSource, opts: BuildOptions, out: LocalOutput, unit: str, t0: float, per_shard: int) -> BuildSummary:
    manifest = read_manifest(out.path)
    if manifest.kind != source.kind:
        raise CacheMismatchError(f"{out.path} holds a cache of kind {manifest.kind!r}, this recipe builds {source.kind!r}; an append must use the cache's own recipe")
    opts = _cache_defaults(manifest, opts)
    opts = replace(opts, codec=replace(opts.codec, pack=_cache_pack(manifest, opts.codec.pack, opts.pack_given, source.estimated_record_bytes(), str(out.path))))
    if opts.codec.share is not None and opts.codec.share != manifest.codec.share and opts.codec.pack > 1 and opts.codec.name == "zstd":
        raise ConfigError(
            f"build.share = {opts.codec.share}: the cache at {out.path} shares frames up to {manifest.codec.share} bytes (its codec.share), and an append writes as the cache does: leave build.share out"
        )
    opts = replace(opts, codec=replace(opts.codec, share=manifest.codec.share))  # (a generation shares frames as its cache does)
    base_doc = _fingerprint_doc(source, opts, per_shard)
    _check_recipe(manifest, base_doc, str(out.path))
    generation = generation_of(manifest) + 1
    seed = generation_seed(manifest.seed, generation)
    plan = _plan(manifest, per_shard, opts.records, str(out.path))
    doc = {**base_doc, "generation": generation, "generation_seed": seed, "first_shard": plan[0].index, "first_record": plan[0].start}
    fingerprint = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    entry = {"generation": generation, "seed": seed, "first_shard": plan[0].index, "shards": len(plan), "first_record": plan[0].start, "records": opts.records}
    old_bounds = old_shape_bounds(out.path, manifest, entry, opts.keep)  # (a corrupt old index is refused here, before anything is written)
    _start(out, manifest, doc, fingerprint, opts.sync)
    done: dict[int, ShardEntry] = finished_shards(out, plan, fingerprint, deep=True)
    todo = [spec for spec in plan if spec.index not in done]
    skipped = len(done)
    bar = _progress(opts.records, unit, opts.progress)
    bar.update(sum(s.records for s in done.values()))
    try:
        own_process = opts.backend != "threading" and not (opts.backend == "loky" and min(opts.workers or os.cpu_count() or 1, len(todo)) <= 1)
        args = (source, seed, out, opts.codec, fingerprint, opts.sync, own_process)
        # closed on the way out, so that a stopped build's jobs stop (and say so) now: an interrupt landing here, between
        # two results, left the generator, and the wait for its running shards, to the garbage collector, after the CLI's exit
        with contextlib.closing(run_jobs(_build_shard, todo, args, opts.backend, opts.workers, opts.address, quiet=not opts.progress)) as jobs:
            for built in jobs:
                done[_index_of(built.entry)] = built.entry
                bar.update(built.entry.records)
    finally:
        bar.close()
    new = [done[spec.index] for spec in plan]
    committed = commit_generation(out.path, manifest, new, entry, opts.keep, old_bounds)
    out.remove(APPEND_RECORD)
    if opts.keep is not None:
        from cachebuild.builder.prune import prune_unlocked

        prune_unlocked(out.path)
    raw, stored = sum(s.raw_bytes for s in new), sum(s.bytes for s in new)
    return BuildSummary(
        str(out.path),
        opts.records,
        len(plan),
        len(todo),
        skipped,
        raw,
        stored,
        time.perf_counter() - t0,
        generation=generation,
        pack=opts.codec.pack,
        entries=tuple(new),
        generations=tuple(g["generation"] for g in generation_table(committed)),
    )


def _start(out: LocalOutput, manifest: Manifest, doc: dict[str, Any], fingerprint: str, sync: bool) -> None:
    """Record this append; an unfinished append with other arguments is discarded first (its files were never listed)."""
    previous = read_json(out.path / APPEND_RECORD)
    if previous is not None and previous.get("fingerprint") != fingerprint:
        discard_unfinished(out.path, manifest)
    generations_dir(out.path).mkdir(exist_ok=True)  # (a link there is refused, not followed)
    for folder in (out.path, out.path / GENERATIONS_DIR):  # half-written files of a killed writer (we hold the lock)
        for path in folder.iterdir():
            if is_tmp_name(path):
                path.unlink(missing_ok=True)
    write_json(out.path / APPEND_RECORD, {"fingerprint": fingerprint, "doc": doc}, sync)


def discard_unfinished(root: Path, manifest: Manifest) -> list[str]:
    """Delete the shard files of an unfinished append (any ``shard-*`` file at or past the manifest's next shard)."""
    first = int(manifest.build.get("next_shard", len(manifest.shards)))
    removed = []
    for path in sorted(root.glob("shard-*")):
        number = path.name[len("shard-") :].split(".", 1)[0]
        if number.isdigit() and int(number) >= first and not (path.is_dir() and not path.is_symlink()):  # (a user's folder: kept)
            path.unlink(missing_ok=True)
            removed.append(path.name)
    (root / APPEND_RECORD).unlink(missing_ok=True)
    return removed
