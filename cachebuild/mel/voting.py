"""File-level leak decisions from segment scores, vectorised (torch; runs where the scores are).

The voting rule (two levels, both configurable):

1. **Segment**: each short window gets a leak probability ``p`` (``sigmoid``
   of a binary leak logit, or the ``leak_class`` column of a softmax over
   class logits; ``from_logits=False`` takes probabilities as given).
2. **Long window** votes leak:

   * ``rule="mean"`` (default): the mean of its short windows' ``p`` is
     ``>= threshold``, the users' ``evaluate_file_level`` (``probs_long =
     probs_short.mean(axis=1)``, a window votes when ``p >= threshold``; a tie, such
     as an untrained model's ``sigmoid(0) = 0.5`` at the default 0.5, votes leak). Why the default: with the users' 2 short windows per long
     window a majority is either "both" or a tie, while the mean keeps each
     window's confidence (one window at 0.9 and one at 0.3 vote leak).
   * ``rule="majority"``: strictly more than half of its short windows have
     ``p >= threshold`` (with 2 short windows: both).
3. **File** is a leak when at least ``vote_fraction`` (default 0.5) of its
   long windows vote leak: ``votes / windows >= vote_fraction`` (a ratio in
   float64; windows a file lacks, ``long_mask`` false, do not count).

Entry points:

* :func:`file_votes`: dense scores ``[F, L, S]`` (or ``[F, L, S, C]``, or flat
  ``[F*L*S(, C)]`` with ``num_long``/``num_short``): one reduction for a whole
  ``mel_files`` batch.
* :func:`segment_file_votes` and :class:`VoteAccumulator`: scores of segments
  in any order (the ``mel`` view, whose files span batches), tallied per
  ``(file, long window)`` with ``index_add_``; padding rows are skipped.
* :func:`file_level_accuracy`, :func:`file_confusion`: metrics of the decisions;
  :func:`leak_label_id` reads the LEAK label id from a cache's manifest.

Nothing here loops over files in Python. numpy inputs give numpy outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

__all__ = [
    "RULES",
    "leak_probability",
    "long_window_votes",
    "file_votes",
    "segment_file_votes",
    "VoteAccumulator",
    "file_level_accuracy",
    "file_confusion",
    "leak_label_id",
]

RULES = ("mean", "majority")
"""How the short windows of a long window vote (see the module docstring)."""

Array = Any  # torch.Tensor or np.ndarray


def _tensor(x: Array) -> tuple[torch.Tensor, bool]:
    """``(tensor, was numpy)``: numpy arrays are wrapped without a copy."""
    if isinstance(x, torch.Tensor):
        return x, False
    return torch.as_tensor(np.asarray(x)), True


def _back(x: torch.Tensor, numpy: bool) -> Array:
    return x.cpu().numpy() if numpy else x


def _check(threshold: float, vote_fraction: float, rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be a probability in [0, 1], got {threshold}")
    if not 0.0 <= vote_fraction <= 1.0:
        raise ValueError(f"vote_fraction must be in [0, 1], got {vote_fraction}")


def leak_probability(scores: torch.Tensor, from_logits: bool = True, leak_class: int | None = None) -> torch.Tensor:
    """Leak probability per segment, float32.

    ``leak_class=None``: ``scores`` are one leak logit (or probability) per
    segment. Otherwise the last axis holds classes and ``leak_class`` picks the
    leak column (softmax first when ``from_logits``).
    """
    s = scores.float()
    if leak_class is None:
        return torch.sigmoid(s) if from_logits else s
    probs = torch.softmax(s, dim=-1) if from_logits else s
    return probs[..., leak_class]


def long_window_votes(p: torch.Tensor, threshold: float = 0.5, rule: str = "mean") -> torch.Tensor:
    """``p [..., L, S]`` -> bool ``[..., L]``: does each long window vote leak (module rule 2)."""
    if rule == "mean":
        return p.double().mean(dim=-1) >= threshold
    if rule == "majority":
        return 2 * (p >= threshold).sum(dim=-1) > p.shape[-1]
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def _decide(votes: torch.Tensor, windows: torch.Tensor, vote_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per file: leak fraction ``votes / windows`` (float64; NaN without windows) and ``fraction >= vote_fraction``."""
    frac = votes.double() / windows.double()
    return frac, frac >= vote_fraction  # NaN compares false: a file with no windows is not a leak


def file_votes(
    scores: Array,
    *,
    num_long: int | None = None,
    num_short: int | None = None,
    long_mask: Array | None = None,
    threshold: float = 0.5,
    vote_fraction: float = 0.5,
    rule: str = "mean",
    from_logits: bool = True,
    leak_class: int | None = None,
) -> tuple[Array, Array]:
    """Per-file ``(leak fraction [F] float64, decision [F] bool)`` from every segment's score.

    ``scores``: ``[F, L, S]`` (binary) or ``[F, L, S, C]`` (with ``leak_class``);
    or flat ``[F*L*S]`` / ``[F*L*S, 1]`` / ``[F*L*S, C]`` in file-major order
    (a ``mel_files`` batch's ``mel.reshape(-1, 1, M, T)`` through the model)
    with ``num_long`` and ``num_short``. ``long_mask`` ``[F, L]`` marks the
    long windows that exist (the ``mel_files`` key). Rule: module docstring.
    """
    _check(threshold, vote_fraction, rule)
    x, numpy = _tensor(scores)
    if num_long is not None or num_short is not None:
        if num_long is None or num_short is None:
            raise ValueError("give both num_long and num_short for flat scores")
        tail = x.shape[1:] if leak_class is not None else ()
        if leak_class is None and x.dim() == 2 and x.shape[1] == 1:
            x = x[:, 0]
        x = x.reshape((-1, num_long, num_short) + tuple(tail))
    want = 4 if leak_class is not None else 3
    if x.dim() != want:
        raise ValueError(f"scores must be [F, L, S{', C' if leak_class is not None else ''}] (or flat with num_long/num_short), got shape {tuple(x.shape)}")
    p = leak_probability(x, from_logits, leak_class)
    votes = long_window_votes(p, threshold, rule)
    if long_mask is None:
        n_votes = votes.sum(dim=1)
        windows = torch.full_like(n_votes, votes.shape[1])
    else:
        mask, _ = _tensor(long_mask)
        mask = mask.to(device=votes.device, dtype=torch.bool)
        n_votes = (votes & mask).sum(dim=1)
        windows = mask.sum(dim=1)
    frac, decision = _decide(n_votes, windows, vote_fraction)
    return _back(frac, numpy), _back(decision, numpy)


@dataclass
class VoteAccumulator:
    """Per-(file, long window) tallies of segment scores that arrive in any order, over many batches.

    For evaluation through the ``mel`` view (a file's segments spread over
    batches and rows): ``update`` after each batch, ``result`` at the end.
    Rows flagged ``is_pad`` are skipped, so every segment counts once.
    Tallies live on ``device`` (float64 sums of ``p``, counts of ``p >
    threshold`` and of segments).

    Under DDP each rank sees only part of a file's segments (the ``mel`` view
    splits segments, not files, between ranks): call :meth:`all_reduce` on
    every rank before :meth:`result`, else each rank votes on its share alone.
    """

    num_files: int
    num_long: int
    threshold: float = 0.5
    vote_fraction: float = 0.5
    rule: str = "mean"
    from_logits: bool = True
    leak_class: int | None = None
    device: torch.device | str = "cpu"

    def __post_init__(self) -> None:
        _check(self.threshold, self.vote_fraction, self.rule)
        n = self.num_files * self.num_long
        self.p_sum = torch.zeros(n, dtype=torch.float64, device=self.device)
        self.positive = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.count = torch.zeros(n, dtype=torch.int64, device=self.device)

    def update(self, scores: Array, file_id: Array, long_index: Array, is_pad: Array | None = None) -> None:
        """Add a batch: ``scores`` ``[B]`` / ``[B, 1]`` (or ``[B, C]`` with ``leak_class``), ``file_id``, ``long_index`` ``[B]``."""
        x, _ = _tensor(scores)
        x = x.to(self.device)
        if self.leak_class is None and x.dim() == 2 and x.shape[1] == 1:
            x = x[:, 0]
        p = leak_probability(x, self.from_logits, self.leak_class).reshape(-1)
        cell = _tensor(file_id)[0].to(self.device, torch.int64) * self.num_long + _tensor(long_index)[0].to(self.device, torch.int64)
        if is_pad is not None:
            keep = ~_tensor(is_pad)[0].to(self.device, torch.bool)
            p, cell = p[keep], cell[keep]
        self.p_sum.index_add_(0, cell, p.double())
        self.positive.index_add_(0, cell, (p >= self.threshold).long())
        self.count.index_add_(0, cell, torch.ones_like(cell))

    def all_reduce(self, group: Any = None) -> "VoteAccumulator":
        """Sum the tallies of every rank of ``group`` in place (a collective: every rank calls it); returns self.

        Tallies must live where the backend reduces (CUDA for NCCL). Without an
        initialised ``torch.distributed`` this does nothing.
        """
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            for tally in (self.p_sum, self.positive, self.count):
                dist.all_reduce(tally, group=group)
        return self

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(leak fraction [F] float64, decision [F] bool, long windows seen [F] int64)``.

        A long window votes by the module's rule over the segments seen of it;
        a file without any segment seen has fraction NaN and decision False.
        """
        seen = self.count > 0
        if self.rule == "mean":
            votes = self.p_sum / self.count.clamp(min=1).double() >= self.threshold
        else:
            votes = 2 * self.positive > self.count
        votes = (votes & seen).view(self.num_files, self.num_long).sum(dim=1)
        windows = seen.view(self.num_files, self.num_long).sum(dim=1)
        frac, decision = _decide(votes, windows, self.vote_fraction)
        return frac, decision, windows


def segment_file_votes(
    scores: Array,
    file_id: Array,
    long_index: Array,
    num_files: int,
    num_long: int,
    is_pad: Array | None = None,
    **rule: Any,
) -> tuple[Array, Array]:
    """:func:`file_votes` for segments in any order: ``(fraction [num_files], decision [num_files])``.

    ``file_id`` in ``[0, num_files)`` and ``long_index`` in ``[0, num_long)``
    per segment; ``rule`` takes ``threshold``, ``vote_fraction``, ``rule``,
    ``from_logits``, ``leak_class``.
    """
    x, numpy = _tensor(scores)
    acc = VoteAccumulator(num_files, num_long, device=x.device, **rule)
    acc.update(x, file_id, long_index, is_pad)
    frac, decision, _ = acc.result()
    return _back(frac, numpy), _back(decision, numpy)


def _valid(decision: torch.Tensor, labels: torch.Tensor, leak_label: int, is_pad: Array | None) -> tuple[torch.Tensor, torch.Tensor]:
    truth = labels.to(decision.device) == leak_label
    if is_pad is not None:
        keep = ~_tensor(is_pad)[0].to(decision.device, torch.bool)
        decision, truth = decision[keep], truth[keep]
    return decision.bool(), truth


def file_confusion(decision: Array, labels: Array, leak_label: int, is_pad: Array | None = None) -> dict[str, float]:
    """Counts ``tp, fp, tn, fn`` of leak decisions against ``labels == leak_label`` (padding rows dropped),
    plus ``accuracy``, ``precision``, ``recall`` (NaN where undefined) and ``files``."""
    d, t = _valid(_tensor(decision)[0], _tensor(labels)[0], leak_label, is_pad)
    tp, fp = int((d & t).sum()), int((d & ~t).sum())
    tn, fn = int((~d & ~t).sum()), int((~d & t).sum())
    n = tp + fp + tn + fn
    nan = float("nan")
    return {
        "tp": tp,
        "fp": fp,
        "tn": tn,
        "fn": fn,
        "files": n,
        "accuracy": (tp + tn) / n if n else nan,
        "precision": tp / (tp + fp) if tp + fp else nan,
        "recall": tp / (tp + fn) if tp + fn else nan,
    }


def file_level_accuracy(decision: Array, labels: Array, leak_label: int, is_pad: Array | None = None) -> float:
    """Fraction of (non-padding) files whose leak decision matches ``labels == leak_label``."""
    return file_confusion(decision, labels, leak_label, is_pad)["accuracy"]


def leak_label_id(manifest: Any, name: str = "LEAK") -> int:
    """The label id of ``name`` in a mel cache (a :class:`~cachebuild.format.Manifest` or its ``config`` dict).

    Looks in the source's ``label2id`` (what the builder used), then the mel
    config's ``labels``.
    """
    config: Mapping[str, Any] = getattr(manifest, "config", manifest)
    for table in ((config.get("source") or {}).get("label2id"), (config.get("mel") or {}).get("labels")):
        if isinstance(table, Mapping) and name in table:
            return int(table[name])
    raise KeyError(f"label {name!r} not found in the cache's label mapping (source.label2id / mel.labels)")
