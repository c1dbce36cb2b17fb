"""Weights and schedules of a mixture: how many records of each cache every epoch holds.

A *stage* gives each cache of a mixture a weight for a range of epochs; a
*schedule* is stages covering every epoch from 0, one after another (a
curriculum: which caches, with which weights, at which epoch). Plain
``weights`` are a schedule of one open-ended stage.

How weights become counts (the rule, see docs/DECISIONS.md):

* an epoch of a stage holds ``epoch_size`` records (default: the records of
  the caches the stage gives a weight > 0, so with weights equal to the
  caches' sizes, or no weights at all, every record once);
* cache ``c`` gets ``epoch_size * w_c / sum(w)`` of them, rounded by largest
  remainder (exact rational arithmetic; ties to the earlier cache), so the
  counts add up to ``epoch_size`` and equal the cache sizes exactly when the
  weights are proportional to them;
* which records: cache ``c`` is read as an endless stream of shuffled passes
  over it (:mod:`loaders.mixplan`), and each epoch takes the next
  ``count`` records of that stream. A count below the cache's size subsamples
  without replacement (later epochs continue where this one stopped, so
  every record is seen before any is seen again); above it, records repeat,
  each ``count // size`` or one more times.

Everything here is a pure function of integers and floats; bad input is one
:class:`~cachebuild.errors.ConfigError` naming the stage, cache and value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np

from cachebuild.errors import ConfigError

__all__ = ["Stage", "Weights", "as_stages", "check_weights", "epoch_counts", "check_schedule", "stage_counts", "stage_at", "draws_before"]

Weights = Mapping[str, float] | Sequence[float] | None
"""Weights by cache name (missing names weigh 0), or one per cache in order; ``None``: the caches' sizes."""


@dataclass(frozen=True)
class Stage:
    """Weights for the epochs ``[first, end)`` (``end=None``: every later epoch).

    ``epochs`` is ``(first, end)`` or a ``range``; ``weights`` as :data:`Weights`;
    ``epoch_size`` records per epoch (default: the records of the caches weighted > 0).
    """

    epochs: tuple[int, int | None] | range
    weights: Weights = None
    epoch_size: int | None = None

    @property
    def first(self) -> int:
        return int(self.epochs.start if isinstance(self.epochs, range) else self.epochs[0])

    @property
    def end(self) -> int | None:
        e = self.epochs.stop if isinstance(self.epochs, range) else self.epochs[1]
        return None if e is None else int(e)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_weights(weights: Weights, names: Sequence[str], where: str = "weights") -> tuple[float, ...] | None:
    """One float per cache (``None`` stays ``None``: the caches' sizes); a :class:`ConfigError` for
    an unknown cache name, a count that does not match, a value that is not a finite number >= 0, or all zero."""
    if weights is None:
        return None
    if isinstance(weights, Mapping):
        unknown = [k for k in weights if k not in names]
        if unknown:
            raise ConfigError(f"{where}: unknown cache {unknown[0]!r}; the mixture's caches are {list(names)}")
        values = [weights.get(n, 0.0) for n in names]
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"{where}: expected a dict {{cache name: weight}} or a list of {len(names)} weights, got {type(weights).__name__}")
    else:
        if len(weights) != len(names):
            raise ConfigError(f"{where}: {len(weights)} weights for {len(names)} caches {list(names)}")
        values = list(weights)
    out = []
    for name, w in zip(names, values):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not math.isfinite(float(w)) or float(w) < 0:
            raise ConfigError(f"{where}: weight of cache {name!r} is {w!r}; weights must be finite numbers >= 0")
        out.append(float(w))
    if sum(out) <= 0:
        raise ConfigError(f"{where}: all weights are 0 ({dict(zip(names, out))}); give at least one cache a weight > 0")
    return tuple(out)


def epoch_counts(weights: Sequence[float] | None, records: Sequence[int] | np.ndarray, epoch_size: int | None = None) -> np.ndarray:
    """Records of each cache in one epoch, int64 ``[caches]`` (the rule of the module docstring)."""
    sizes = [int(r) for r in np.asarray(records, dtype=np.int64).tolist()]
    w = [Fraction(float(x)) for x in (sizes if weights is None else weights)]
    if epoch_size is None:
        epoch_size = int(sum(r for r, x in zip(sizes, w) if x > 0))
    total = sum(w)
    quota = [x * epoch_size / total for x in w]
    counts = [math.floor(q) for q in quota]
    left = epoch_size - sum(counts)
    by_rest = sorted(range(len(w)), key=lambda c: (-(quota[c] - counts[c]), c))
    for c in by_rest[:left]:
        counts[c] += 1
    return np.array(counts, dtype=np.int64)


MAX_EPOCH_RECORDS = 1 << 31
"""The most records one epoch may draw: its plan holds an int64 order of that length (16 GiB)."""


def check_schedule(stages: Sequence[Stage] | Mapping[int, Weights], names: Sequence[str], where: str | None = None) -> tuple[Stage, ...]:
    """The stages in epoch order, each with checked weights; a :class:`ConfigError` for a gap, an
    overlap, an empty or reversed range, an open stage that is not the last, or a bad epoch size.

    ``where`` names the one stage a plain ``Mixture(weights=..., epoch_size=...)`` makes, so its
    errors speak of what the user wrote (``Mixture: weight of cache 'a' is -1``), not of a schedule."""
    stages = as_stages(stages)
    if isinstance(stages, (str, bytes, Mapping)) or not isinstance(stages, Sequence) or not stages:
        raise ConfigError("schedule: expected a non-empty list of Stage(epochs=(first, end), weights=...) or a dict {first_epoch: weights}")
    out = []
    for i, s in enumerate(stages):
        if not isinstance(s, Stage):
            raise ConfigError(f"schedule stage {i}: expected a Stage(epochs=(first, end), weights=...), got {type(s).__name__}")
        _check_stage(s, where or f"schedule stage {i}")
        size = None if s.epoch_size is None else int(s.epoch_size)  # a numpy integer would break the state's JSON
        out.append(Stage((s.first, s.end), check_weights(s.weights, names, where or f"schedule stage {i} (epochs {_span(s)})"), size))
    out.sort(key=lambda s: s.first)
    if out[0].first != 0:
        raise ConfigError(f"schedule: epochs 0..{out[0].first - 1} have no stage (the first stage starts at epoch {out[0].first}); stages must cover every epoch from 0")
    for a, b in zip(out[:-1], out[1:]):
        if a.end is None or b.first < a.end:
            raise ConfigError(f"schedule: stages for epochs {_span(a)} and {_span(b)} overlap")
        if b.first > a.end:
            raise ConfigError(f"schedule: epochs {a.end}..{b.first - 1} have no stage (a gap between the stages for epochs {_span(a)} and {_span(b)})")
    return tuple(out)


def as_stages(schedule: Any) -> Any:
    """The short forms of a schedule as :class:`Stage` lists: ``{first_epoch: weights}`` (each stage
    runs until the next key, the last one open-ended) and ``[(epochs, weights[, epoch_size]), ...]``
    tuples; anything else is returned as it is, for :func:`check_schedule` to check."""
    if isinstance(schedule, Mapping) and schedule and all(_is_int(k) for k in schedule):
        firsts = sorted(int(k) for k in schedule)
        ends: list[int | None] = [*firsts[1:], None]
        return [Stage((a, b), schedule[a]) for a, b in zip(firsts, ends)]
    if isinstance(schedule, (list, tuple)) and all(isinstance(s, tuple) and 2 <= len(s) <= 3 for s in schedule):
        return [Stage(*s) for s in schedule]
    return schedule


def _check_stage(s: Stage, where: str) -> None:
    ep = s.epochs
    if isinstance(ep, range):
        if ep.step != 1:
            raise ConfigError(f"{where}: epochs {ep!r} must be a range with step 1")
    elif not isinstance(ep, (tuple, list)) or len(ep) != 2 or not _is_int(ep[0]) or not (ep[1] is None or _is_int(ep[1])):
        raise ConfigError(f"{where}: epochs must be (first, end) with integers (end None: open), got {ep!r}")
    if s.first < 0 or (s.end is not None and s.end <= s.first):
        raise ConfigError(f"{where}: epochs {_span(s)} is empty or negative (first >= 0, end > first)")
    if s.epoch_size is not None and (not _is_int(s.epoch_size) or not 1 <= s.epoch_size <= MAX_EPOCH_RECORDS):
        raise ConfigError(f"{where}: epoch_size must be an integer in [1, {MAX_EPOCH_RECORDS:,}] records, got {s.epoch_size!r}")


def _span(s: Stage) -> str:
    return f"{s.first}.." if s.end is None else f"{s.first}..{s.end - 1}"


def stage_counts(stage: Stage, records: Sequence[int] | np.ndarray) -> np.ndarray:
    """:func:`epoch_counts` of a checked stage (its weights one float per cache, or ``None``)."""
    if isinstance(stage.weights, Mapping):
        raise ConfigError("stage_counts needs a checked stage (check_schedule), not weights by name")
    return epoch_counts(stage.weights, records, stage.epoch_size)


def stage_at(stages: Sequence[Stage], epoch: int) -> int:
    """Index of the stage that holds ``epoch`` (checked stages); a :class:`ConfigError` past a closed schedule's end."""
    for i, s in enumerate(stages):
        if s.first <= epoch and (s.end is None or epoch < s.end):
            return i
    raise ConfigError(f"schedule: epoch {epoch} is past the last stage (epochs {_span(stages[-1])}); make the last stage open-ended: epochs=({stages[-1].first}, None)")


def draws_before(stages: Sequence[Stage], records: Sequence[int] | np.ndarray, epoch: int) -> np.ndarray:
    """Records drawn from each cache's stream by the epochs before ``epoch``, int64 ``[caches]`` (O(stages))."""
    total = np.zeros(len(records), np.int64)
    for s in stages:
        if s.first >= epoch:
            break
        last = epoch if s.end is None else min(epoch, s.end)
        total += stage_counts(s, records) * (last - s.first)
    return total
