"""Several caches of one kind in one :class:`~loaders.ShardStream`: weights per epoch, or a schedule.

```python
from loaders import Mixture, ShardStream, Stage
mix = Mixture({"n20": "/c/n20", "n35": "/c/n35", "n50": "/c/n50"},
              schedule=[Stage((0, 2), {"n20": 1}),
                        Stage((2, 4), {"n20": 1, "n35": 3}),
                        Stage((4, None), {"n20": 1, "n35": 1, "n50": 2})])
stream = ShardStream(mix, view="twins", batch_size=4096, compact=True)
ShardStream(["/c/a", "/c/b"], view="graphs")           # shorthand (or a dict): every record of each, once per epoch
ShardStream(["/c/a", "/c/b"], weights=[2, 1], view="graphs")   # shorthand with weights= (or schedule=, epoch_size=)
ShardStream(Mixture(["/c/a", "/c/b"], weights=[0.8, 0.2], epoch_size=50_000), view="graphs")
```

The caches are read as one *union* cache (:func:`union_manifest`): their
shards one after another, each cache's records numbered after the previous
caches' (``record_id`` in batches is that union id; :meth:`OpenMixture.cache_of`
maps it back). Field shapes are the largest of all caches (the ``graphs`` and
``twins`` views pad every level of a 20-to-50-node curriculum to 50 nodes),
so batch shapes never change between stages. The epoch order is
:mod:`loaders.mixplan`'s (counts per cache from :mod:`loaders.schedule`),
handed to the ordinary :class:`~loaders.plan.EpochPlan`: pools, ranks,
workers, padding and resume are those of one cache.

What may be mixed: caches of one ``kind``, with the same fields (names, dtypes
and ranks; shapes may differ) and the same codec; anything else is one
:class:`~cachebuild.errors.ConfigError` naming both caches and the difference,
raised before anything is read or written. The loader state names every cache
by its fingerprint (:func:`loaders.state.cache_fingerprint`) and the stages by
their weights, so a state loads only into the same mixture
(:class:`~cachebuild.errors.CacheMismatchError` naming what differs).

Each local cache is read at a generation (a cache grows by appends) and
leased, as one cache is: :mod:`loaders.mixgrow` moves every cache to its
newest generation at each epoch start and rebuilds the union
(:meth:`OpenMixture.moved`); the state records each cache's generation.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast

import numpy as np

from cachebuild.errors import CacheMismatchError, ConfigError
from cachebuild.format.generations import Lease, generation_of
from cachebuild.format.manifest import FieldSchema, Manifest, read_manifest
from cachebuild.format.names import record_key
from loaders.generations import open_newest
from loaders.mixplan import mixture_order
from loaders.plan import EpochPlan
from loaders.remote import RemoteOptions, fetch_manifest, is_remote
from loaders.schedule import Stage, Weights, check_schedule, draws_before, stage_at, stage_counts
from cachebuild.format.reader import LocalFiles, Locator, ShardSet, check_shard_files, local_path
from loaders.shards import RemoteFiles
from loaders.state import PlanConfig, cache_fingerprint

__all__ = ["Mixture", "Stage", "OpenMixture", "UnionFiles", "UnionShardSet", "union_manifest", "open_mixture", "refuse_single_cache_options", "mixture_root"]

_SINGLE_CACHE_OPTIONS = {
    "oversample": "oversample= reads one cache's labels; a Mixture sets proportions with weights=",
    "bucket_by": "bucket_by= orders one cache's records by length; it does not apply to a Mixture",
}

T = TypeVar("T")


def refuse_single_cache_options(view_options: Mapping[str, Any]) -> None:
    """A view option that works on one cache's records only, given for a Mixture: one ConfigError."""
    for key, why in _SINGLE_CACHE_OPTIONS.items():
        if view_options.get(key) is not None:
            raise ConfigError(why)


def _name_of(root: Any) -> str:
    s = str(root).rstrip("/")
    return s.rsplit("/", 1)[-1] or s


@dataclass(frozen=True)
class Mixture:
    """What a mixed stream reads: caches by name, and their weights per epoch (or a schedule).

    Args:
        caches: ``{name: root}``, or a list of roots (named after their folders).
            A root is a local folder, a ``file://`` URL or a remote cache URL.
        weights: per cache (dict by name, missing names weigh 0; or a list in
            order); ``None``: the caches' sizes (every record once per epoch).
        epoch_size: records per epoch (default: the records of the caches weighted > 0).
        schedule: a list of :class:`Stage` instead of ``weights``/``epoch_size``:
            weights per range of epochs, covering every epoch from 0 (a curriculum);
            or ``{first_epoch: weights}``, each until the next key (the last open-ended).

    Weights become counts and records as :mod:`loaders.schedule` says. Bad input
    (unknown cache, weights negative, NaN or all zero, a schedule with a gap or an
    overlap) is a :class:`ConfigError` here, before any cache is opened.
    """

    caches: Mapping[str, Any] | Sequence[Any]
    weights: Weights = None
    epoch_size: int | None = None
    schedule: Sequence[Stage] | Mapping[int, Weights] | None = None

    def __post_init__(self) -> None:
        names, roots = self._parse_caches(self.caches)
        object.__setattr__(self, "caches", dict(zip(names, roots)))
        if self.schedule is not None:
            if self.weights is not None or self.epoch_size is not None:
                raise ConfigError("Mixture: give either weights/epoch_size or a schedule (each Stage has its own weights and epoch_size), not both")
            stages = check_schedule(self.schedule, names)
        else:
            stages = check_schedule([Stage((0, None), self.weights, self.epoch_size)], names, where="Mixture")
        object.__setattr__(self, "schedule", stages)
        object.__setattr__(self, "weights", stages[0].weights if len(stages) == 1 else None)

    @staticmethod
    def _parse_caches(caches: Any) -> tuple[list[str], list[str]]:
        if isinstance(caches, Mapping):
            names, roots = [str(k) for k in caches], [str(v) for v in caches.values()]
        elif isinstance(caches, (list, tuple)):
            roots = [str(r) for r in caches]
            names = [_name_of(r) for r in roots]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ConfigError(f"Mixture: two caches are named {dup[0]!r} (after their folders); pass a dict {{name: root}}")
        else:
            raise ConfigError(f"Mixture: caches must be a dict {{name: root}} or a list of roots, got {type(caches).__name__}")
        if not roots:
            raise ConfigError("Mixture: no caches given")
        return names, roots

    @property
    def names(self) -> list[str]:
        return list(self.caches)

    @property
    def roots(self) -> list[str]:
        return list(cast(Mapping[str, str], self.caches).values())

    @property
    def stages(self) -> tuple[Stage, ...]:
        return tuple(cast(Sequence[Stage], self.schedule or ()))  # checked stages after __post_init__


class UnionFiles:
    """A locator (:class:`loaders.shards.Locator`) over several caches' locators: union shard ``s`` is
    shard ``local[s]`` of cache ``cache[s]``."""

    def __init__(self, parts: Sequence[Locator], cache: np.ndarray, local: np.ndarray, label: str):
        self.parts, self.cache, self.local = list(parts), cache, local
        self.root = label
        self.remote = any(getattr(p, "remote", False) for p in self.parts)

    def open(self, s: int, opener: Callable[[Path, Path], T]) -> T:
        return self.parts[int(self.cache[s])].open(int(self.local[s]), opener)

    def open_index(self, s: int, reader: Callable[[Path], T]) -> T:
        return self.parts[int(self.cache[s])].open_index(int(self.local[s]), reader)

    def plan(self, shard_order: list[int]) -> None:
        for c, part in enumerate(self.parts):
            part.plan([int(self.local[s]) for s in shard_order if self.cache[s] == c])

    def close(self) -> None:
        for part in self.parts:
            part.close()


class UnionShardSet(ShardSet):
    """The union's :class:`ShardSet`; its messages name a record by its key in its own cache
    (``cache/shard-...tar, record 0000000005``), not by its union id, and each shard's index is
    checked against its own cache's ``codec.share`` (``shares``, per union shard: caches of format
    v1/v3, whose entries never share a frame, mix with v4 caches, and v4 caches of other bounds)."""

    def __init__(self, manifest: Manifest, root: str, verify: str, locator: Locator, shares: np.ndarray):
        super().__init__(manifest, root, verify, locator)
        self.shares = shares

    def share(self, s: int) -> int:
        return int(self.shares[s])

    def where(self, record: int, field_name: str) -> str:
        s, local = self.locate(np.array([record]))
        entry = self.manifest.shards[int(s[0])]
        return f"shard {entry.name}, record {record_key(entry.first_record + int(local[0]))} (union record {record}), field '{field_name}'"


def _check_compatible(names: Sequence[str], manifests: Sequence[Manifest]) -> None:
    """One :class:`ConfigError` naming both caches when two manifests cannot be read as one cache."""
    a, m0 = names[0], manifests[0]
    for b, m in zip(names[1:], manifests[1:]):
        where = f"Mixture: cache {b!r} ({m.root})"
        if m.kind != m0.kind:
            raise ConfigError(f"{where} is of kind {m.kind!r}, cache {a!r} ({m0.root}) of kind {m0.kind!r}; a mixture reads caches of one kind")
        if m.field_names != m0.field_names:
            raise ConfigError(f"{where} has fields {m.field_names}, cache {a!r} has {m0.field_names}; a mixture needs the same fields")
        for f, g in zip(m.fields, m0.fields):
            if (f.dtype, f.ndim) != (g.dtype, g.ndim):
                raise ConfigError(f"{where}: field {f.name!r} is {f.dtype} with {f.ndim} dims, in cache {a!r} {g.dtype} with {g.ndim} dims; a mixture needs the same dtypes and ranks")
        if m.codec.name != m0.codec.name:
            raise ConfigError(f"{where} is stored with codec {m.codec.name!r}, cache {a!r} with {m0.codec.name!r}; rebuild one with the other's build.codec")


def union_manifest(names: Sequence[str], manifests: Sequence[Manifest], label: str) -> Manifest:
    """One manifest over several compatible caches: their shards in order (named ``cache/shard``),
    each field's max shape the largest and min shape the smallest of all caches."""
    _check_compatible(names, manifests)
    m0 = manifests[0]
    fields = []
    for j, f in enumerate(m0.fields):
        maxs = np.max([m.fields[j].max_shape for m in manifests], axis=0) if f.ndim else ()
        mins = np.min([m.fields[j].min_shape for m in manifests], axis=0) if f.ndim else ()
        fields.append(FieldSchema(f.name, f.dtype, f.ndim, tuple(int(x) for x in maxs), tuple(int(x) for x in mins)))
    shards = tuple(dataclasses.replace(e, name=f"{n}/{e.name}", index=f"{n}/{e.index}") for n, m in zip(names, manifests) for e in m.shards)
    config = {"mixture": {n: m.config for n, m in zip(names, manifests)}}
    return Manifest(kind=m0.kind, config=config, seed=m0.seed, codec=m0.codec, fields=tuple(fields), shards=shards, root=label)


class OpenMixture:
    """A :class:`Mixture` with its caches' manifests read and checked: the union manifest, the
    shards of a reading process, the plan of an epoch, and the mixture's part of the loader state.

    Each local cache is opened at its newest generation with a lease held on it
    (:attr:`leases`, :attr:`generations`); the manifests are checked for compatibility
    before any lease is taken, so refused input writes nothing."""

    def __init__(self, spec: Mixture, remote: RemoteOptions | None = None):
        self.spec = spec
        self.names = spec.names
        self.roots = spec.roots
        self.remote = remote if remote is not None else (RemoteOptions() if any(is_remote(r) for r in self.roots) else None)
        self.label = "mixture(" + ", ".join(f"{n}={r}" for n, r in zip(self.names, self.roots)) + ")"
        self.leases: list[Lease | None] = [None] * len(self.roots)  # per cache: the lease on the generation read (None: remote, or nothing to hold)
        self.warned: set[tuple[int, int]] = set()  # (cache, generation) refused for its shapes (loaders.mixgrow), shared by moved copies
        self.seen: dict[int, tuple[tuple[int, int, int], int]] = {}  # per cache: manifest.json's (inode, mtime, size) and generation
        remotes = {c: fetch_manifest(r, self.remote or RemoteOptions()) for c, r in enumerate(self.roots) if is_remote(r)}
        _check_compatible(self.names, [remotes[c] if c in remotes else read_manifest(local_path(r)) for c, r in enumerate(self.roots)])
        try:  # compatible: now lease (lease files are the only thing a reader writes, never for refused input)
            self._derive([remotes[c] if c in remotes else self._lease_newest(c, r) for c, r in enumerate(self.roots)])
        except BaseException:
            self.close()
            raise

    def _lease_newest(self, cache: int, root: str) -> Manifest:
        """A local cache's newest generation, leased (the lease kept in :attr:`leases`)."""
        manifest, lease = open_newest(local_path(root))
        self.leases[cache] = lease
        check_shard_files(manifest, local_path(root))
        return manifest

    def _derive(self, manifests: Sequence[Manifest]) -> None:
        """Everything the caches' manifests decide: the union, sizes, offsets, fingerprints, generations."""
        self.manifests = list(manifests)
        self.manifest = union_manifest(self.names, self.manifests, self.label)
        self.records = np.array([m.records for m in self.manifests], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.records)]).astype(np.int64)
        self.shard_counts = [np.array([s.records for s in m.shards], dtype=np.int64) for m in self.manifests]
        self.fingerprints = [cache_fingerprint(m) for m in self.manifests]
        self.generations: tuple[int, ...] = tuple(generation_of(m) for m in self.manifests)
        self._check_nonempty()
        self.fingerprint = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()

    def moved(self, manifests: Sequence[Manifest]) -> "OpenMixture":
        """This mixture over other generations of its caches (``manifests``, one per cache), nothing opened;
        it shares this one's leases list until the caller hands it its own (:mod:`loaders.mixgrow`)."""
        other = copy.copy(self)
        other.leases = list(self.leases)
        other._derive(manifests)
        return other

    def is_remote(self, cache: int) -> bool:
        return is_remote(self.roots[cache])

    def close(self) -> None:
        """Let go of every lease (a stream that is done with this mixture)."""
        for lease in self.leases:
            if lease is not None:
                lease.close()

    def _check_nonempty(self) -> None:
        for i, s in enumerate(self.spec.stages):
            counts = stage_counts(s, self.records)
            empty = [n for n, k, r in zip(self.names, counts.tolist(), self.records.tolist()) if k > 0 and r == 0]
            if empty:
                raise ConfigError(f"Mixture: schedule stage {i} draws records from cache {empty[0]!r}, which holds none")
            if counts.sum() == 0:
                raise ConfigError(f"Mixture: schedule stage {i} holds no records (epoch_size 0, or weighted caches are empty)")

    # ---- what the stream reads
    def shard_set(self, verify: str) -> ShardSet:
        """The union's shards as a reading process opens them (remote caches: a fetcher per cache)."""
        parts: list[Locator] = [RemoteFiles(r, m, self.remote) if is_remote(r) else LocalFiles(local_path(r), m) for r, m in zip(self.roots, self.manifests)]
        cache = np.repeat(np.arange(len(parts)), [len(m.shards) for m in self.manifests])
        local = np.concatenate([np.arange(len(m.shards)) for m in self.manifests]).astype(np.int64)
        shares = np.array([m.codec.share or 0 for m in self.manifests], np.int64)[cache]
        return UnionShardSet(self.manifest, self.label, verify, UnionFiles(parts, cache, local, self.label), shares)

    def counts(self, epoch: int) -> np.ndarray:
        """Records of each cache in ``epoch``, int64 ``[caches]``."""
        return stage_counts(self.spec.stages[stage_at(self.spec.stages, epoch)], self.records)

    def order(self, epoch: int, seed: int, shuffle: bool, window: int | None) -> np.ndarray:
        """Union record ids of ``epoch`` in order (:func:`loaders.mixplan.mixture_order`)."""
        before = draws_before(self.spec.stages, self.records, epoch)
        return mixture_order(self.shard_counts, self.counts(epoch), before, seed, epoch, shuffle, window)

    def plan(self, epoch: int, items_per_record: np.ndarray | None, cfg: PlanConfig, mix: int | None, chunk: int) -> EpochPlan:
        """The epoch plan of ``epoch``: the mixture's order, planned as one cache's."""
        order = self.order(epoch, cfg.seed, cfg.shuffle, cfg.window)
        return EpochPlan.from_order(order, items_per_record, cfg.batch_size, cfg.seed, epoch, cfg.shuffle, cfg.drop_last, mix, chunk)

    def cache_of(self, record_ids: np.ndarray) -> np.ndarray:
        """Index (in :attr:`names`) of the cache holding each union record id."""
        return np.searchsorted(self.offsets, np.asarray(record_ids, dtype=np.int64), side="right") - 1

    # ---- loader state
    def identity(self) -> dict[str, Any]:
        """What the loader state records of the mixture: every cache by name and fingerprint, every stage."""
        stages = [{"epochs": [s.first, s.end], "weights": None if s.weights is None else list(s.weights), "epoch_size": s.epoch_size} for s in self.spec.stages]
        return {"caches": [{"name": n, "fingerprint": f} for n, f in zip(self.names, self.fingerprints)], "stages": stages}

    def stamp(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with the mixture's identity and each cache's generation added (``state["mixture"]``;
        the single-cache ``"generation"`` key is dropped: a mixture's caches grow separately)."""
        ident = self.identity()
        for entry, g in zip(ident["caches"], self.generations):
            entry["generation"] = int(g)
        state.pop("generation", None)
        state["mixture"] = ident
        return state

    def saved_generations(self, state: Mapping[str, Any]) -> tuple[int, ...]:
        """The generation of each cache ``state`` was saved on (a cache's current one where the state
        names none: saved before mixtures followed growth); a :class:`CacheMismatchError` naming what
        differs when it was saved from other caches, weights or schedule."""
        if not isinstance(state, Mapping) or state.get("format") != "cachebuild-loader-state":
            return self.generations  # the generic check names what is wrong
        saved = state.get("mixture")
        if not isinstance(saved, Mapping):
            raise CacheMismatchError("loader state was saved from a single cache, this stream reads a mixture of caches " + ", ".join(self.names))
        entries = [c for c in saved.get("caches", []) if isinstance(c, Mapping)]
        if [c.get("name") for c in entries] != self.names:
            raise CacheMismatchError(f"loader state was saved from a mixture of caches {[c.get('name') for c in entries]}, this stream mixes {self.names}")
        if saved.get("stages") != self.identity()["stages"]:
            raise CacheMismatchError(f"loader state was saved with other weights or schedule (saved {saved.get('stages')}, now {self.identity()['stages']})")
        out = []
        for c, entry in enumerate(entries):
            g = entry.get("generation", self.generations[c])
            if not isinstance(g, int) or isinstance(g, bool) or g < 0:
                raise ValueError(f"loader state has an invalid generation for cache {self.names[c]!r}: {g!r}")
            out.append(g)
        return tuple(out)

    def check_state(self, state: Mapping[str, Any]) -> None:
        """A :class:`CacheMismatchError` naming the cache or stage that differs when ``state`` was saved from
        another mixture (call it once the stream reads the state's generations: fingerprints are per generation)."""
        if not isinstance(state, Mapping) or state.get("format") != "cachebuild-loader-state":
            return
        self.saved_generations(state)  # names and stages
        saved = cast(Mapping[str, Any], state["mixture"])
        theirs = [c.get("fingerprint") for c in saved["caches"]]
        for name, fp_saved, fp_now, root, g in zip(self.names, theirs, self.fingerprints, self.roots, self.generations):
            if fp_saved != fp_now:
                raise CacheMismatchError(f"loader state was saved with another cache {name!r}: fingerprint {str(fp_saved)[:12]}..., now {root} (generation {g}) is {fp_now[:12]}...")


MIXTURE_OPTIONS = ("weights", "epoch_size", "schedule")


def mixture_root(root: Any, options: dict[str, Any]) -> Any:
    """``ShardStream([a, b], weights=..., schedule=..., epoch_size=...)``: the short form of
    ``ShardStream(Mixture([a, b], ...))``. Pops those keys from ``options`` (the stream's view
    options) and returns the :class:`Mixture` they make, or ``root`` unchanged when none is given;
    given with one cache, or beside a :class:`Mixture` (which has its own), they are refused."""
    given = {k: options.pop(k) for k in MIXTURE_OPTIONS if k in options}
    if not given:
        return root
    if isinstance(root, Mixture):
        raise ConfigError(f"{', '.join(f'{k}=' for k in given)} given beside a Mixture: pass them to the Mixture itself")
    if not isinstance(root, (list, tuple, Mapping)):
        raise ConfigError(f"{', '.join(f'{k}=' for k in given)} mix several caches: pass a list [a, b] or a dict {{name: root}} of caches, not the one cache {str(root)!r}")
    return Mixture(root, **given)


def open_mixture(root: Any, remote: RemoteOptions | None = None) -> OpenMixture | None:
    """The opened mixture when ``root`` is a :class:`Mixture`, a list/tuple of roots or a dict
    ``{name: root}`` (each record once per epoch), else ``None`` (one cache)."""
    if isinstance(root, Mixture):
        return OpenMixture(root, remote)
    if isinstance(root, (list, tuple, Mapping)):
        return OpenMixture(Mixture(root), remote)
    return None
