"""A stream over a growing cache: which generation each epoch reads, and switching to it.

A cache grows by generations (``cachebuild generate --append``,
:mod:`cachebuild.format.generations`). The rule a :class:`~loaders.ShardStream`
follows:

* an epoch reads **one** generation from its first batch to its last: the
  newest complete one (the one ``manifest.json`` holds) when the epoch starts
  from its beginning. The epoch plan is a pure function of (that generation's
  manifest, seed, epoch), so it is determined by the generation number, which
  the loader state records (``"generation"``);
* a state loaded mid-epoch continues on **its** generation (read from the
  cache's ``generations/`` snapshot even when newer ones exist) until that
  epoch ends; the next epoch moves to the newest;
* the stream holds a lease (:func:`cachebuild.format.generations.take_lease`)
  on the generation it reads, so ``--keep N`` and ``cachebuild prune`` never
  delete a shard an epoch still needs; a DataLoader worker holds its own (or
  shares its parent's, when forked);
* batch shapes never change under a running loader: a newer generation whose
  records need larger padded shapes (a field's max shape grew) is not picked
  up; the stream warns once and keeps its generation (a new ``ShardStream``
  reads it);
* remote caches (``http(s)://``, ``s3://``) stay at the generation they had
  when the stream opened them.

A mixture of caches follows the same rules per cache (:mod:`loaders.mixgrow`,
which builds on the functions here).

Who decides: the main process, when a pass starts (direct iteration and
:func:`loaders.make_loader`, which hands the generation to its workers with
the epoch); under ``torch.distributed``, rank 0's main process, for every
rank (one broadcast at each epoch start, so ranks never plan different
generations: a DDP hang). Workers of other DataLoaders (plain torch, torchdata) read the
generation the main process last instructed (at construction, ``set_epoch``
and ``load_state_dict``): with those loaders a new generation is picked up at
the epochs started by ``set_epoch``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cachebuild.errors import ManifestError
from cachebuild.format.generations import Lease, generation_of, read_generation, take_lease
from cachebuild.format.manifest import MANIFEST_NAME, Manifest, read_manifest
from cachebuild.format.reader import ShardSet, check_shard_files
from loaders.state import cache_fingerprint
from loaders.views import make_view

if TYPE_CHECKING:
    from loaders.stream import ShardStream

__all__ = ["open_newest", "open_generation", "use_generation", "refresh", "bound_view", "newest_seen", "distributed", "GenerationWarning"]

_RETRIES = 20


class GenerationWarning(UserWarning):
    """A newer generation exists that this stream cannot switch to (its batch shapes would change)."""


def open_generation(root: Any, generation: int) -> tuple[Manifest, Lease]:
    """Generation ``generation`` of the local cache at ``root``, with a lease held on it."""
    lease = take_lease(root, generation)
    try:
        return read_generation(root, generation), lease
    except BaseException:
        lease.close()
        raise


def open_newest(root: Any) -> tuple[Manifest, Lease]:
    """The newest generation of the local cache at ``root``, leased; retried when an append pruned it meanwhile."""
    for _ in range(_RETRIES):
        generation = generation_of(read_manifest(root))
        try:
            return open_generation(root, generation)
        except ManifestError:
            if generation_of(read_manifest(root)) == generation:
                raise  # not a race with an append: a real fault
    raise ManifestError(f"{root}: its newest generation keeps being pruned while this stream opens it; use --keep 2 or more")


def bound_view(stream: "ShardStream", manifest: Manifest, probe: ShardSet | None = None) -> tuple[Any, np.ndarray | None]:
    """A view of ``stream``'s kind bound to ``manifest``'s records: (view, items per record).
    ``probe``: the shards to read the indexes of (default: ``manifest``'s under ``stream.root``; closed here)."""
    view = make_view(stream.config.view, manifest, stream.config.batch_size, **stream._view_options)
    probe = ShardSet(manifest, stream.root, stream.verify) if probe is None else probe  # this generation's indexes only
    try:
        items = view.bind(probe.field_shapes)
    finally:
        probe.close()
    return view, items


def use_generation(stream: "ShardStream", generation: int, strict: bool = True, opened: tuple[Manifest, Lease] | None = None) -> bool:
    """Make ``stream`` read ``generation``; True when it does.

    ``strict``: a generation whose batch shapes differ is an error; otherwise
    a :class:`GenerationWarning` (once per generation) and the stream stays.
    """
    if generation == stream.generation:
        if opened is not None:
            opened[1].close()
        return True
    if stream.remote is not None:
        raise ManifestError(f"{stream.root} is a remote cache, read at generation {stream.generation}: it cannot switch to generation {generation}")
    manifest, lease = opened if opened is not None else open_generation(stream.root, generation)
    try:
        check_shard_files(manifest, stream.root)
        view, items = bound_view(stream, manifest)
        spec = view.layout().spec()
    except BaseException:
        lease.close()
        raise
    if spec != stream._spec:
        lease.close()
        message = (
            f"generation {generation} of {stream.root} needs other batch shapes than generation {stream.generation} "
            f"(a field's largest record grew); this stream keeps generation {stream.generation}: open a new ShardStream to read it"
        )
        if strict:
            raise ManifestError(message)
        if generation not in stream._warned_generations:
            stream._warned_generations.add(generation)
            warnings.warn(message, GenerationWarning, stacklevel=3)
        return False
    _swap(stream, generation, manifest, view, items, lease)
    return True


def _swap(stream: "ShardStream", generation: int, manifest: Manifest, view: Any, items: np.ndarray | None, lease: Lease) -> None:
    old_lease, old_reader = stream._lease, stream._reader
    stream.manifest, stream.view, stream.items_per_record = manifest, view, items
    stream.generation = generation
    stream.fingerprint = cache_fingerprint(manifest)
    stream._counts = np.array([s.records for s in manifest.shards], dtype=np.int64)
    stream._reader, stream._reader_pid, stream._plan_cache = None, -1, None
    stream._lease = lease
    if old_reader is not None:
        old_reader.close()
    if old_lease is not None:
        old_lease.close()  # after the new one is held: never a moment without a lease


def distributed(stream: "ShardStream") -> Any:
    """``torch.distributed`` when it gives this stream its world (initialised, 2+ ranks, no explicit world), else None."""
    if stream._rank is not None and stream._world_size is not None:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


Seen = tuple[tuple[int, int, int], int]
"""``manifest.json``'s (inode, mtime, size) when last parsed, and the generation it held."""


def newest_seen(root: Any, seen: Seen | None) -> Seen:
    """The generation ``manifest.json`` holds (with its stat key), parsed again only when the file was replaced
    (a new inode: appends commit by rename), so an epoch start costs one ``stat`` (a 500-shard manifest parses in ~20 ms)."""
    try:
        st = os.stat(Path(root) / MANIFEST_NAME)
    except FileNotFoundError:
        read_manifest(root)  # the reader's one-line ManifestError (mid-swap of an --overwrite: says so)
        st = os.stat(Path(root) / MANIFEST_NAME)  # (back meanwhile)
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    if seen is not None and seen[0] == key:
        return seen
    return key, generation_of(read_manifest(root))


def _newest(stream: "ShardStream") -> int:
    stream._manifest_seen = newest_seen(stream.root, stream._manifest_seen)
    return stream._manifest_seen[1]


def refresh(stream: "ShardStream") -> int:
    """At the start of an epoch: move ``stream`` to the newest generation if it can; returns the generation read.

    Under ``torch.distributed`` every rank reads the generation rank 0 found
    (one ``broadcast_object_list``; rank 0 holds its lease first), so all ranks
    plan the same epoch: every rank must start the epoch, as DDP does.
    """
    if stream.remote is not None or stream.mixture is not None:  # a mixture: loaders.mixgrow.refresh_mixture
        return stream.generation
    dist = distributed(stream)
    newest, opened = stream.generation, None
    if dist is None or dist.get_rank() == 0:
        newest = _newest(stream)
        if newest != stream.generation and newest not in stream._warned_generations:
            opened = open_newest(stream.root)
            newest = generation_of(opened[0])
    if dist is not None:
        box = [newest]
        dist.broadcast_object_list(box, src=0)
        newest = int(box[0])
    if newest != stream.generation and newest not in stream._warned_generations:
        use_generation(stream, newest, strict=False, opened=opened)
    elif opened is not None:
        opened[1].close()
    return stream.generation
