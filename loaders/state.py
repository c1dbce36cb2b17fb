"""Loader state: a position in the epoch plan, with what it is a position *of*.

The state is a small JSON-able dict::

    {"format": "cachebuild-loader-state", "version": 1,
     "epoch": 3,            # epoch of the position
     "position": 1234,      # global batches of that epoch consumed by the trainer(s), all ranks together
     "seed": 0,
     "cache": "<sha256>",   # fingerprint of the cache (fields, shard names, sizes, checksums)
     "plan": {"view": "twins", "view_options": {...}, "batch_size": 4096,
              "shuffle": true, "window": 16, "drop_last": false},
     "world_size": 2,       # when saved (informational: any world size may resume)
     "batches": 617,        # batches this rank had consumed in the epoch (informational)
     "generation": 2}       # generation of a growing cache the epoch reads (absent: 0; see loaders.generations)

Inside the workers of torchdata's ``StatefulDataLoader``, each worker saves
its own share: the same dict with ``position`` the start of its pass and a
``"worker": {"id", "num_workers", "rank", "yielded"}`` entry (its batches are
every ``num_workers``-th of the rank's from ``position``, and it yielded
``yielded`` of them); such a state loads only into the same worker of the same
``num_workers`` (:class:`~cachebuild.errors.WorkerStateError` otherwise: one
line, in the main process, before any worker starts when the loader is a
:class:`loaders.stateful.StatefulStreamLoader`, see :func:`check_loader_workers`).

Resuming needs only ``epoch`` and ``position`` (O(1), nothing replayed); the
rest must match the stream it is loaded into, else :class:`CacheMismatchError`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from cachebuild.errors import CacheMismatchError, WorkerStateError
from cachebuild.format.manifest import Manifest

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "PlanConfig",
    "cache_fingerprint",
    "make_state",
    "check_position",
    "check_state",
    "make_worker_state",
    "check_worker_state",
    "state_generation",
    "saved_workers",
    "check_loader_workers",
    "plan_args",
]

STATE_FORMAT = "cachebuild-loader-state"
STATE_VERSION = 1


@dataclass(frozen=True)
class PlanConfig:
    """Everything that decides the batches of an epoch, besides the cache and the epoch."""

    view: str
    batch_size: int
    shuffle: bool
    seed: int
    window: int | None
    drop_last: bool
    view_options: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """The JSON form compared on resume (seed is stored on its own)."""
        d = asdict(self)
        d.pop("seed")
        out: dict[str, Any] = json.loads(json.dumps(d))
        return out


def plan_args(batch_size: Any, seed: Any, shuffle: Any, drop_last: Any) -> tuple[int, int, bool, bool]:
    """:class:`ShardStream`'s plan arguments checked (one ``ValueError`` line each, before anything is
    opened) and made plain Python values, as a state stores them in JSON: numpy integers and booleans are
    accepted; ``shuffle="no"`` (a string from a command line or a YAML file) is refused, not truthy.
    (``window``: :func:`loaders.shard_window.resolve_window`.)"""
    for name, value in (("batch_size", batch_size), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):  # a float would fail deep in the plan, or silently seed
            raise ValueError(f"{name} must be a whole number, got {value!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
        if not isinstance(flag, (bool, np.bool_)) and not (type(flag) is int and flag in (0, 1)):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    return int(batch_size), int(seed), bool(shuffle), bool(drop_last)


def cache_fingerprint(manifest: Manifest) -> str:
    """sha256 over the cache's identity: kind, seed, codec, fields, and each shard's name, records and checksums."""
    doc = {
        "kind": manifest.kind,
        "seed": manifest.seed,
        "codec": manifest.codec.to_dict(),
        "fields": {f.name: f.to_dict() for f in manifest.fields},
        "shards": [[s.name, s.records, s.bytes, s.sha256, s.index_sha256] for s in manifest.shards],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def make_state(epoch: int, position: int, cfg: PlanConfig, fingerprint: str, world_size: int, batches: int, generation: int = 0) -> dict[str, Any]:
    """The state dict (see the module docstring)."""
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "epoch": int(epoch),
        "position": int(position),
        "seed": int(cfg.seed),
        "cache": fingerprint,
        "plan": cfg.identity(),
        "world_size": int(world_size),
        "batches": int(batches),
        "generation": int(generation),
    }


def check_state(state: Mapping[str, Any], cfg: PlanConfig, fingerprint: str, shards: int | None = None, records: int | None = None) -> tuple[int, int]:
    """``(epoch, position)`` of a state saved by a stream of the same cache and plan; a clear error otherwise.

    Settings that plan the same batches count as equal, so a state saved before a default changed
    resumes under the new one where nothing differs: ``shards`` (the most shards a window spans here):
    a window of at least that many is one window, as ``None`` (``window=16``, the default before
    ``"auto"``, on a local cache of at most 16 shards); ``records``: a mixing pool (``mix``) of at least
    that many records is one pool (``mix=1024``, the ``mel`` default before ``"auto"``, on a cache of
    at most 1,024 files; not with ``oversample``, whose epoch holds more positions than records)."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"not a cachebuild loader state (format={state.get('format') if isinstance(state, Mapping) else type(state).__name__!r})")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"loader state version {state.get('version')!r} is not supported (this loader reads {STATE_VERSION})")
    if state.get("cache") != fingerprint:
        raise CacheMismatchError(f"loader state was saved from another cache (fingerprint {str(state.get('cache'))[:12]}..., this cache is {fingerprint[:12]}...)")
    if state.get("seed") != cfg.seed:
        raise CacheMismatchError(f"loader state has seed {state.get('seed')!r}, this stream has seed {cfg.seed}")
    mine = cfg.identity()
    theirs = state.get("plan", {})
    same = {"window": lambda v: _one_window(v, shards), "view_options": lambda v: _one_pool(v, records)}
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k) and not (k in same and same[k](mine.get(k)) == same[k](theirs.get(k))))
    if diff:
        detail = ", ".join(f"{k}: saved {theirs.get(k)!r}, now {mine.get(k)!r}" for k in diff)
        hint = f"; pass window={theirs.get('window')!r} to resume it (the default window='auto' is a full shuffle of a local cache, 16-shard windows of a remote one)" if "window" in diff else ""
        saved, now = theirs.get("view_options"), mine.get("view_options")
        if "view" not in diff and "view_options" in diff and isinstance(saved, dict) and isinstance(now, dict) and saved.get("mix") != now.get("mix"):
            hint += f"; pass mix={saved.get('mix')!r} to resume it" + (" (the mel view's default mix='auto' pools 64 MB of files)" if mine.get("view") == "mel" else "")
        raise CacheMismatchError(f"loader state was saved with another plan ({detail}){hint}")
    epoch, position = state.get("epoch"), state.get("position")
    if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0 or position < 0:
        raise ValueError(f"loader state has an invalid epoch/position: {epoch!r}/{position!r}")
    return epoch, position


def check_position(state: Mapping[str, Any], position: int, steps: Callable[[int], int]) -> None:
    """Refuse a ``position`` past the end of its epoch (``steps(world_size)``: batches per rank of the
    saved epoch): such a state was edited or belongs elsewhere, and used to run the next epoch silently."""
    ws = state.get("world_size", 1)
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        raise ValueError(f"loader state has an invalid world_size: {ws!r}")
    end = steps(ws) * ws
    if position > end:
        raise ValueError(f"loader state's position {position} is past its epoch's end ({end} global batches at world_size {ws}): the state was edited, or saved with another cache or plan")


def _one_window(window: Any, shards: int | None) -> Any:
    """``window`` as planned: None when it spans every one of ``shards`` shards."""
    return None if shards is not None and isinstance(window, int) and not isinstance(window, bool) and window >= shards else window


def _one_pool(options: Any, records: int | None) -> Any:
    """A view's options as planned: ``mix`` of at least ``records`` (one pool) as ``"one pool"``."""
    if records is None or not isinstance(options, dict) or "oversample" in options:
        return options
    mix = options.get("mix")
    return {**options, "mix": "one pool"} if isinstance(mix, int) and not isinstance(mix, bool) and mix >= records else options


def make_worker_state(state: dict[str, Any], worker: int, num_workers: int, rank: int, yielded: int) -> dict[str, Any]:
    """``state`` (of a worker's pass) with the worker's share and progress added (see the module docstring)."""
    state["worker"] = {"id": int(worker), "num_workers": int(num_workers), "rank": int(rank), "yielded": int(yielded)}
    return state


def state_generation(state: Mapping[str, Any]) -> int:
    """The cache generation a state was saved on (0 for states saved before caches grew)."""
    g = state.get("generation", 0) if isinstance(state, Mapping) else 0
    if not isinstance(g, int) or isinstance(g, bool) or g < 0:
        raise ValueError(f"loader state has an invalid generation: {g!r}")
    return g


def check_worker_state(state: Mapping[str, Any], worker: int, num_workers: int) -> int:
    """Batches worker ``worker`` of ``num_workers`` already yielded in the saved pass; a clear error for any other state."""
    w = state.get("worker")
    if not isinstance(w, Mapping):
        raise ValueError("a DataLoader worker can only load a state saved by a worker (torchdata's StatefulDataLoader)")
    if w.get("num_workers") != num_workers:
        raise WorkerStateError(_other_workers(w.get("num_workers"), num_workers))
    if w.get("id") != worker:
        raise ValueError(f"loader state was saved by worker {w.get('id')!r} of {num_workers}, loaded into worker {worker} of {num_workers}")
    yielded = w.get("yielded")
    if not isinstance(yielded, int) or yielded < 0:
        raise ValueError(f"loader state has an invalid worker progress: yielded={yielded!r}")
    return yielded


def _other_workers(saved: object, now: int) -> str:
    return (
        f"loader state was saved by a StatefulDataLoader with num_workers={saved!r}, loaded into one with num_workers={now}: "
        f"resume with num_workers={saved!r} (a state of loaders.make_loader resumes on any worker count)"
    )


def saved_workers(state: Mapping[str, Any]) -> int | None:
    """``num_workers`` of the torchdata ``StatefulDataLoader`` that saved ``state`` (None: not such a state).

    Its multi-process states hold it in ``_snapshot._main_snapshot._num_workers``;
    its single-process states have a top-level ``_num_yielded`` instead.
    """
    snap = state.get("_snapshot") if isinstance(state, Mapping) else None
    if isinstance(snap, Mapping):
        main = snap.get("_main_snapshot")
        n = main.get("_num_workers") if isinstance(main, Mapping) else None
        return n if isinstance(n, int) and not isinstance(n, bool) else None
    return 0 if isinstance(state, Mapping) and "_num_yielded" in state else None


def check_loader_workers(state: Mapping[str, Any], num_workers: int) -> None:
    """Main process, before torchdata reads ``state``: refuse, in one line, a state saved with another ``num_workers``.

    (Inside the workers, :func:`check_worker_state` refuses the same, but
    torchdata's own assertions come first when either count is 0.)
    """
    saved = saved_workers(state)
    if saved is not None and saved != num_workers:
        raise WorkerStateError(_other_workers(saved, num_workers))
