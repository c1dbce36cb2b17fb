"""Which epoch, and from which batch, each pass over a :class:`~loaders.ShardStream` runs.

The rule, the same wherever the stream is iterated:

* every new pass (every ``iter()`` of the stream or of a loader over it)
  starts the **next epoch** from its first batch;
* unless ``set_epoch(e)`` was called since the previous pass: then the pass
  runs epoch ``e`` (so the usual ``loader.set_epoch(epoch)`` loop, and
  trainers that never call it, both get each epoch once, in order);
* or ``load_state_dict(state)`` was: then the pass continues the saved epoch
  at the saved position; a state saved at the very end of an epoch continues
  with the next epoch, from its start (unless ``set_epoch`` named the saved
  epoch again: then that epoch's remaining batches, none).

A pass left unfinished (a ``break``) still counts: the next ``iter()`` starts
the next epoch. A loader's pass that no batch was taken from yet (one begun
ahead by :meth:`~loaders.StreamLoader.prepare_pass`, as Lightning's epoch start
does, or an ``iter()`` whose iterator was dropped unread, as Lightning's
``reload_dataloaders_every_n_epochs`` does) is not left: the next ``iter()``
runs it, the same epoch from the same start on the same generations (one with
no batch to hand out is left as any other). Only the newest pass counts:
``load_state_dict``, ``set_epoch``
to another epoch, or a new pass **supersede** a pass still being iterated (each
pass holds a token they retire), and its next ``next()`` raises
:class:`~cachebuild.errors.PassSupersededError` instead of building a batch
and counting it on top of the new position (which used to run on to the end of
the old epoch and lose the loaded state); torchdata's ``StatefulDataLoader``
likewise applies a loaded state to the next ``iter()`` only. A pass of the
stream iterated directly (no workers) begins at its first ``next()``: an
iterator made and dropped unread is no pass (torchdata, restoring a state
saved at an epoch's end, makes one and drops it); one that torchdata restores
(a state taken inside the loop, on an epoch's last batch) continues the saved
epoch, whose rest is empty, as torchdata's workers do.

The first pass of a new stream runs epoch 0.

Where the passes run decides who applies the rule:

* iterated directly, or through :func:`loaders.make_loader`: the main
  process (:class:`Progress`), which also counts the batches the trainer
  received, so ``state_dict()`` is exact;
* inside the workers of any other DataLoader (a plain ``torch`` DataLoader,
  torchdata's ``StatefulDataLoader``): each worker, from a small shared-memory
  block (:class:`Control`) that reaches persistent workers and fresh ones
  alike. The main process writes instructions there (``set_epoch``,
  ``load_state_dict``); every worker keeps, in its own slot, the epoch of its
  last pass and the instruction it already obeyed. All workers of a
  DataLoader run one pass each per ``iter()``, so their epochs stay equal.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import get_worker_info

from cachebuild.errors import PassSupersededError

__all__ = ["MAX_WORKERS", "Progress", "Control", "DirectPass", "never_finished"]

MAX_WORKERS = 256
"""DataLoader workers a stream can count passes for (one 32-byte slot each)."""

# Head of the control block: the pass a loader hands its workers, then the main process's instruction.
_VALID, _EPOCH, _START, _RANK, _WORLD, _GEN, _IEPOCH, _ISTART, _IEXACT, _PLAIN = range(10)
# Rows of the generations block: the cache generations of the handed pass and of the instruction
# (one per cache: a mixture's caches grow separately, see loaders.generations and loaders.mixgrow).
_HANDED, _INSTRUCTED = 0, 1
_HEAD = 16
# Per-worker slot: instruction generation obeyed, epoch and start of its last pass, passes begun.
_W_SEEN, _W_EPOCH, _W_START, _W_PASSES, _W_SLOT = 0, 1, 2, 3, 4

Finished = Callable[[int, int], bool]
"""``finished(epoch, start)``: True when no batch of ``epoch`` is left from global batch ``start``."""


class Progress:
    """Main-process bookkeeping: the epoch, and the global batches of it the trainer consumed."""

    def __init__(self) -> None:
        self.epoch = 0
        self.position = 0
        self.resume = False  # the next pass continues (epoch, position): load_state_dict
        self.pinned = True  # the next pass runs self.epoch (from 0, or a loaded position): a new stream, or set_epoch
        self.counted = False  # a pass ran here (directly or through a loader)
        self.world_size = 1
        self.batches = 0
        self.token = 0  # the counting pass's; load, set_epoch (another epoch) and begin retire it
        self._retired_by = ""
        self.rerun = False  # the last begin ran an unread pass again
        self.unread = False  # a loader's pass was begun and no batch of it taken yet: the next begin runs it again
        self.passes = 0  # passes begun (not counting a pass run again)
        self.told = False  # set_epoch or load_state_dict was called

    def set_epoch(self, epoch: int) -> None:
        self.unread, self.told = False, True
        if epoch != self.epoch:  # (the same epoch: a running pass goes on counting where it is)
            self.epoch, self.position, self.resume, self.batches = epoch, 0, False, 0
            self._retire(f"set_epoch({epoch})")
        self.pinned = True

    def load(self, epoch: int, position: int, batches: int) -> None:
        self.epoch, self.position, self.resume, self.batches, self.pinned = epoch, position, True, batches, False
        self.unread, self.told = False, True
        self._retire("load_state_dict()")

    def _retire(self, why: str) -> None:
        self.token += 1
        self._retired_by = why

    def check(self, token: int) -> None:
        """Raise :class:`PassSupersededError` when the pass holding ``token`` no longer counts."""
        if token == self.token:
            return
        if self._retired_by == "iter()":
            raise PassSupersededError("this pass was superseded by a newer pass (another iter() of the same loader or stream), which counts the position now: iterate that one")
        raise PassSupersededError(
            f"this pass was superseded by {self._retired_by}, which applies to the next pass; its batches are no longer counted: start the next pass with iter(loader) (or `for batch in loader`)"
        )

    def next_pass(self) -> tuple[int, int]:
        """``(epoch, start)`` the next pass would run, before :meth:`begin` (a resumed position may be the epoch's end)."""
        if self.resume or self.unread:
            return self.epoch, self.position
        return (self.epoch, 0) if self.pinned else (self.epoch + 1, 0)

    def begin(self, world_size: int, finished: Finished) -> int:
        """Start a pass by the rule above; returns its start (global batches of the epoch already consumed).
        A pass still :attr:`unread` is run again (:attr:`rerun` tells; its caller keeps its generations)."""
        self.rerun = self.unread and world_size == self.world_size
        epoch, start = self.next_pass()
        if not self.rerun and not self.pinned and finished(epoch, start):  # a state saved at the end of an epoch: the next one follows
            epoch, start = epoch + 1, 0
        if not self.rerun and (epoch != self.epoch or not self.resume):
            self.batches = 0
        self.passes += 0 if self.rerun else 1
        self.epoch, self.position, self.resume, self.pinned, self.counted, self.unread = epoch, start, False, False, True, False
        self.world_size = world_size
        self._retire("iter()")  # the pass begun here counts under the new token (its caller reads it)
        return start

    def advance(self, n: int = 1) -> None:
        self.position += n * self.world_size
        self.batches += n
        self.unread = False


class Control:
    """The shared-memory block between the main process's stream and the DataLoader workers' copies.

    Pickles as a shared tensor, so workers started by ``fork`` or ``spawn``,
    persistent or not, all read and write the same memory.

    The block belongs to one trainer process and its DataLoader workers. A copy of the stream
    that reaches another process which is not a DataLoader worker (a DDP rank given the stream
    by ``torch.multiprocessing.spawn`` or Lightning's ``ddp_spawn``, or forked) takes its own
    copy of the block at its first use, before it pickles the stream for its workers, and before
    it forks (an ``os.register_at_fork`` hook): ranks sharing one block read each other's passes
    (every rank's workers ran the pass one rank handed out: the same half of the cache twice).
    """

    def __init__(self, caches: int = 1) -> None:
        self._block: torch.Tensor = torch.zeros(_HEAD + MAX_WORKERS * _W_SLOT, dtype=torch.int64).share_memory_()
        self._generations: torch.Tensor = torch.zeros(2, max(1, caches), dtype=torch.int64).share_memory_()
        self._block[_GEN] = 1  # instruction 1 (no worker obeyed it yet): the first pass runs epoch 0 from 0
        self._owner = os.getpid()
        _CONTROLS.add(self)

    @property
    def block(self) -> torch.Tensor:
        self._own()
        return self._block

    @property
    def generations(self) -> torch.Tensor:
        self._own()
        return self._generations

    def _own(self) -> None:
        """In a process other than the block's owner and not a DataLoader worker: a private copy."""
        if self._owner != os.getpid() and get_worker_info() is None:
            self._block = self._block.clone().share_memory_()
            self._generations = self._generations.clone().share_memory_()
            self._owner = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        self._own()  # a rank pickling the stream for its spawned workers hands them its own block
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _CONTROLS.add(self)

    # ---- a loader's pass (make_loader): the main process decided it
    def hand_pass(self, epoch: int, start: int, rank: int, world_size: int) -> None:
        self.block[:_GEN] = torch.tensor([1, epoch, start, rank, world_size])

    def hand_generation(self, generations: Sequence[int]) -> None:
        """The cache generations (one per cache) the handed pass reads (before :meth:`hand_pass`)."""
        self.generations[_HANDED] = torch.tensor(list(generations), dtype=torch.int64)

    def handed_generation(self) -> tuple[int, ...]:
        return tuple(int(g) for g in self.generations[_HANDED].tolist())

    def instruct_generation(self, generations: Sequence[int]) -> None:
        """The cache generations (one per cache) the workers of other DataLoaders read from their next pass on."""
        self.generations[_INSTRUCTED] = torch.tensor(list(generations), dtype=torch.int64)

    def instructed_generation(self) -> tuple[int, ...]:
        return tuple(int(g) for g in self.generations[_INSTRUCTED].tolist())

    def handed_pass(self) -> tuple[int, int, int, int] | None:
        valid, epoch, start, rank, ws = self.block[:_GEN].tolist()
        return (epoch, start, rank, ws) if valid else None

    # ---- other DataLoaders: the main process instructs, each worker decides
    def instruct(self, epoch: int, start: int, exact: bool) -> None:
        """The next pass of every worker runs ``epoch`` from ``start`` (``set_epoch``, ``load_state_dict``).

        ``exact`` (``set_epoch``): even when no batch is left there; else an
        epoch's end moves on to the next epoch.
        """
        self.block[_IEPOCH], self.block[_ISTART], self.block[_IEXACT] = epoch, start, int(exact)
        self.block[_GEN] += 1

    def worker_pass(self, worker: int, finished: Finished, override: tuple[int, int] | None = None) -> tuple[int, int]:
        """``(epoch, start)`` of worker ``worker``'s new pass by the rule; recorded in its slot.

        ``override`` (a state loaded into this worker, as torchdata does) wins over
        both the instruction and the automatic next epoch.
        """
        if worker >= MAX_WORKERS:
            raise ValueError(f"a ShardStream counts passes for at most {MAX_WORKERS} DataLoader workers, got worker {worker}")
        base = _HEAD + worker * _W_SLOT
        gen = int(self.block[_GEN])
        exact = override is not None
        if override is not None:
            epoch, start = override
        elif int(self.block[base + _W_SEEN]) != gen:
            epoch, start, exact = int(self.block[_IEPOCH]), int(self.block[_ISTART]), bool(self.block[_IEXACT])
        else:
            epoch, start = int(self.block[base + _W_EPOCH]) + 1, 0
        if not exact and finished(epoch, start):
            epoch, start = epoch + 1, 0
        self.block[base + _W_SEEN], self.block[base + _W_EPOCH], self.block[base + _W_START] = gen, epoch, start
        self.block[base + _W_PASSES] += 1
        self.block[_PLAIN] = 1
        return epoch, start

    def worker_pass_preview(self, worker: int) -> tuple[int, int]:
        """``(epoch, start)`` worker ``worker``'s next pass would run (recording nothing)."""
        base = _HEAD + worker * _W_SLOT
        if int(self.block[base + _W_SEEN]) != int(self.block[_GEN]):
            return int(self.block[_IEPOCH]), int(self.block[_ISTART])
        return int(self.block[base + _W_EPOCH]) + 1, 0

    def workers_ran(self) -> bool:
        """True once workers of a DataLoader other than ``make_loader``'s ran a pass."""
        return bool(self.block[_PLAIN])

    def worker_epoch(self, worker: int = 0) -> int:
        """Epoch of worker ``worker``'s last pass."""
        return int(self.block[_HEAD + worker * _W_SLOT + _W_EPOCH])

    def worker_passes(self, workers: int) -> list[int]:
        """Passes begun by each of the first ``workers`` workers."""
        return [int(self.block[_HEAD + w * _W_SLOT + _W_PASSES]) for w in range(workers)]

    def settle(self, workers: int, quiet_s: float = 0.05, limit_s: float = 2.0) -> None:
        """Wait until every worker has begun the same number of passes and none began another for
        ``quiet_s`` (at most ``limit_s``). A DataLoader's ``iter()`` returns once its workers have
        acknowledged the new pass, but each records the pass only just after acknowledging; this
        closes that window for a state read before the first batch of a pass."""
        import time

        deadline, last, since = time.monotonic() + limit_s, None, time.monotonic()
        while time.monotonic() < deadline:
            now = self.worker_passes(workers)
            if now != last:
                last, since = now, time.monotonic()
            elif len(set(now)) == 1 and time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.002)

    def worker_start(self, worker: int = 0) -> int:
        """Global batch worker ``worker``'s last pass started from."""
        return int(self.block[_HEAD + worker * _W_SLOT + _W_START])


_CONTROLS: "weakref.WeakSet[Control]" = weakref.WeakSet()


def _own_before_fork() -> None:
    for control in list(_CONTROLS):
        control._own()


os.register_at_fork(before=_own_before_fork)  # a rank forking its workers owns its block first (Control)


def never_finished(epoch: int, start: int) -> bool:
    """A :data:`Finished` for a pass that continues its epoch even when none of it is left."""
    return False


class DirectPass:
    """A pass of a stream iterated directly (no DataLoader workers); it begins at its first ``next()``,
    so an iterator made and dropped unread (torchdata restoring a finished pass) starts no epoch.

    ``run(continues)`` makes the pass's batches when it begins. torchdata's ``StatefulDataLoader``
    at 0 workers saves this iterator's state next to the stream's and, on restore, makes a fresh
    pass and loads that state into it: such a pass continues the saved epoch even when none of it
    is left (``continues=True``; a state taken on its last batch: an empty rest, then the next pass
    runs the next epoch), as torchdata resumes the open pass of any dataset and as its workers do.
    A plain ``iter()`` after such a state starts the next epoch (the rule above).
    """

    def __init__(self, run: Callable[[bool], Iterator[Any]]) -> None:
        self._make = run
        self._run: Iterator[Any] | None = None
        self._continues = False

    def __iter__(self) -> "DirectPass":
        return self

    def __next__(self) -> Any:
        if self._run is None:
            self._run = self._make(self._continues)
        return next(self._run)

    def close(self) -> None:
        """End the pass now, as a generator's ``close()`` (it was one)."""
        if self._run is not None and hasattr(self._run, "close"):
            self._run.close()
        self._run = iter(())  # a closed pass yields nothing more, started or not

    def state_dict(self) -> dict[str, Any]:
        """torchdata's iterator state: only that a pass was open (the position is the stream's)."""
        return {"open_pass": True}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restored by torchdata: this pass continues the loaded epoch, even at its end."""
        self._continues = bool(state.get("open_pass", False)) if isinstance(state, Mapping) else False
