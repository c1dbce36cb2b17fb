"""A mixture over caches that grow: each cache moves to its newest generation at an epoch start.

The single-cache rule of :mod:`loaders.generations`, applied per cache of a
:class:`~loaders.Mixture`:

* at the start of an epoch (from its first batch) the mixture reads each
  local cache's newest complete generation (one ``stat`` of its
  ``manifest.json`` when nothing changed), takes a lease on it
  (:func:`cachebuild.format.generations.take_lease`, so ``--keep N`` and
  ``cachebuild prune`` never delete a shard the epoch may read), and rebuilds
  the union (:meth:`loaders.mixture.OpenMixture.moved`); the epoch plan is a
  pure function of (each cache's generation, weights or schedule, seed,
  epoch), and every epoch reads the same generations from its first batch to
  its last;
* the loader state records each cache's generation
  (``state["mixture"]["caches"][i]["generation"]``); a state loaded mid-epoch
  reads those generations (from the caches' ``generations/`` snapshots) until
  that epoch ends, then moves on;
* a cache whose newer generation needs other padded batch shapes (a field's
  largest record grew past every other cache's) stays at its generation,
  with one :class:`~loaders.generations.GenerationWarning` per (cache,
  generation); the other caches move on. Caches are tried in the mixture's
  order, each on top of those already accepted, so every process decides alike;
* under ``torch.distributed`` rank 0 decides the generations (one
  ``broadcast_object_list`` per epoch start), so every rank plans the same epoch;
* remote caches stay at the generation they had when the stream opened them.

The functions here also serve a single cache (they hand over to
:mod:`loaders.generations`), so :class:`~loaders.ShardStream` speaks of a tuple
of generations, one per cache, whatever it reads.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from cachebuild.errors import CacheMismatchError, ManifestError
from cachebuild.format.generations import Lease, generation_of
from cachebuild.format.manifest import Manifest
from cachebuild.format.reader import check_shard_files, local_path
from loaders.generations import GenerationWarning, bound_view, distributed, newest_seen, open_generation, open_newest, refresh, use_generation
from loaders.mixture import OpenMixture
from loaders.state import state_generation

if TYPE_CHECKING:
    from loaders.stream import ShardStream

__all__ = ["stream_generations", "use_generations", "refresh_generations", "load_generations"]

Opened = dict[int, tuple[Manifest, Lease]]
"""Per cache index: a generation's manifest and the lease held on it."""


def stream_generations(stream: "ShardStream") -> tuple[int, ...]:
    """The generation of each cache the stream reads (one cache: a 1-tuple)."""
    return stream.mixture.generations if stream.mixture is not None else (stream.generation,)


def use_generations(stream: "ShardStream", generations: Sequence[int], strict: bool = True) -> None:
    """Make ``stream`` read ``generations`` (one per cache). ``strict``: other batch shapes are an error, else a warning."""
    if stream.mixture is None:
        use_generation(stream, int(generations[0]), strict)
    else:
        _use_mixture(stream, stream.mixture, tuple(int(g) for g in generations), strict, {})


def refresh_generations(stream: "ShardStream") -> tuple[int, ...]:
    """At an epoch start: move every cache to its newest generation where it can; returns the generations read."""
    if stream.mixture is None:
        refresh(stream)
    else:
        _refresh_mixture(stream, stream.mixture)
    return stream_generations(stream)


def load_generations(stream: "ShardStream", state: Mapping[str, Any]) -> None:
    """Before a state's other checks: make ``stream`` read the generations ``state`` was saved on."""
    if stream.mixture is None:
        if isinstance(state, Mapping) and isinstance(state.get("mixture"), Mapping):
            raise CacheMismatchError(f"loader state was saved from a mixture of caches, this stream reads the single cache {stream.root}")
        use_generation(stream, state_generation(state))
        return
    before = stream.mixture.generations
    _use_mixture(stream, stream.mixture, stream.mixture.saved_generations(state), True, {})
    try:
        stream.mixture.check_state(state)  # fingerprints of the generations now read
    except CacheMismatchError:
        _use_mixture(stream, stream.mixture, before, False, {})  # a refused state leaves the stream as it was
        raise


def _refresh_mixture(stream: "ShardStream", mix: OpenMixture) -> None:
    dist = distributed(stream)
    newest, opened = list(mix.generations), Opened()
    if dist is None or dist.get_rank() == 0:
        try:
            for c, root in enumerate(mix.roots):
                if mix.is_remote(c):
                    continue
                mix.seen[c] = newest_seen(local_path(root), mix.seen.get(c))
                g = mix.seen[c][1]
                if g != mix.generations[c] and (c, g) not in mix.warned:
                    opened[c] = open_newest(local_path(root))
                    newest[c] = generation_of(opened[c][0])
        except BaseException:
            _close(opened)
            raise
    if dist is not None:
        box = [newest]
        dist.broadcast_object_list(box, src=0)
        newest = [int(g) for g in box[0]]
    want = tuple(g if (c, g) not in mix.warned else mix.generations[c] for c, g in enumerate(newest))
    _use_mixture(stream, mix, want, False, opened)


def _use_mixture(stream: "ShardStream", mix: OpenMixture, want: tuple[int, ...], strict: bool, opened: Opened) -> None:
    """Switch the mixture's caches to ``want``; ``opened``: leases already taken (used or closed here)."""
    if len(want) != len(mix.names):
        _close(opened)
        raise ValueError(f"{len(want)} generations for a mixture of {len(mix.names)} caches {mix.names}")
    changed = [c for c, g in enumerate(want) if g != mix.generations[c]]
    _close({c: o for c, o in opened.items() if c not in changed})
    opened = {c: o for c, o in opened.items() if c in changed}
    try:
        for c in changed:
            root = mix.roots[c]
            if mix.is_remote(c):
                raise ManifestError(f"cache {mix.names[c]!r} ({root}) is remote, read at generation {mix.generations[c]}: it cannot switch to generation {want[c]}")
            if c not in opened:
                opened[c] = open_generation(local_path(root), want[c])
            check_shard_files(opened[c][0], local_path(root))
        if changed:
            _fit(stream, mix, changed, opened, strict)
    except BaseException:
        _close(opened)
        raise


def _fit(stream: "ShardStream", mix: OpenMixture, changed: list[int], opened: Opened, strict: bool) -> None:
    """Take every changed cache whose generation keeps the batch shapes (all at once when they all do,
    else one by one in the mixture's order); warn about (or, ``strict``, refuse) the others."""
    manifests = [opened[c][0] if c in opened else m for c, m in enumerate(mix.manifests)]
    got = _candidate(stream, mix, manifests)
    taken = list(changed)
    if got is None:
        manifests, taken = list(mix.manifests), []
        for c in changed:
            trial = list(manifests)
            trial[c] = opened[c][0]
            attempt = _candidate(stream, mix, trial)
            if attempt is None:
                g = generation_of(trial[c])
                message = (
                    f"generation {g} of cache {mix.names[c]!r} ({mix.roots[c]}) needs other batch shapes than generation "
                    f"{mix.generations[c]} (a field's largest record grew); this stream keeps generation {mix.generations[c]} of it: "
                    "open a new ShardStream to read it"
                )
                if strict:
                    raise ManifestError(message)
                opened.pop(c)[1].close()
                if (c, g) not in mix.warned:
                    mix.warned.add((c, g))
                    warnings.warn(message, GenerationWarning, stacklevel=4)
                continue
            manifests, got = trial, attempt
            taken.append(c)
    if got is not None:
        _swap(stream, *got, {c: opened.pop(c)[1] for c in taken})


def _candidate(stream: "ShardStream", mix: OpenMixture, manifests: list[Manifest]) -> tuple[OpenMixture, Any, np.ndarray | None] | None:
    """The mixture over ``manifests`` with its bound view, or None when its batch shapes differ from the stream's."""
    cand = mix.moved(manifests)
    view, items = bound_view(stream, cand.manifest, cand.shard_set(stream.verify))
    return (cand, view, items) if view.layout().spec() == stream._spec else None


def _swap(stream: "ShardStream", cand: OpenMixture, view: Any, items: np.ndarray | None, leases: dict[int, Lease]) -> None:
    old, old_reader = stream.mixture, stream._reader
    replaced = [old.leases[c] for c in leases] if old is not None else []
    for c, lease in leases.items():
        cand.leases[c] = lease
    stream.mixture, stream.manifest, stream.view, stream.items_per_record = cand, cand.manifest, view, items
    stream.fingerprint = cand.fingerprint
    stream._counts = np.array([s.records for s in cand.manifest.shards], dtype=np.int64)
    stream._reader, stream._reader_pid, stream._plan_cache = None, -1, None
    if old_reader is not None:
        old_reader.close()
    for held in replaced:
        if held is not None:
            held.close()  # after the new ones are held: never a moment without a lease


def _close(opened: Opened) -> None:
    for _, lease in opened.values():
        lease.close()
