"""Reusable shared-memory batch buffers between DataLoader workers and the main process.

Why: handing a fresh shared-memory tensor from a worker to the main process
costs, per batch, a new segment the kernel must zero and fault in (about as
much time as decoding the batch) and a file-descriptor hand-over through a
socket (a connect per batch). Instead the loader allocates, before the workers
start, ``slots`` buffers per worker (:class:`SlotRings`); the workers inherit
them. A worker writes a batch into its next free slot and sends only a
reference ``(rings, worker, slot)``; the main process copies the batch out
(into pinned memory in the pin thread, else into private memory) and frees the
slot.

Protocol, per slot: byte 0 of its header is 1 while it holds a batch the main
process has not copied, 0 when free. Only a worker sets it (when free), only
the main process clears it (once per batch: after copying it, or when the
reference is dropped unread, as the DataLoader does with batches it discards
when a pass is cut short). The DataLoader keeps at most ``prefetch_factor``
batches of a worker outstanding, so ``prefetch_factor + 2`` slots do not run
out; if one stays busy past a timeout anyway, the worker uses a fresh buffer
instead: never an endless wait, never a slot overwritten while it is read.

Zero copy: a batch that is not pinned (a CPU consumer) need not be copied out
at all. :meth:`SlotLease.adopt` hands the consumer tensors that view the slot
and frees the slot when the last of them is dropped (the storage's owner holds
the lease). At most :data:`ZERO_COPY_HELD` such batches per worker are alive at
once (the hand-over queue, the batch in use, the one before it); a consumer
that keeps more gets copies, so a worker never waits on a consumer that hoards
batches. The loader gives each worker ``prefetch_factor + 2 + ZERO_COPY_HELD``
slots.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["SLOT_HEADER", "ZERO_COPY_HELD", "SlotRings", "SlotLease", "register", "unregister", "rings_of", "shared_bytes", "RetiredBatch"]

SLOT_HEADER = 64
"""Bytes before the batch in a slot; byte 0 is the slot's busy flag."""

ZERO_COPY_HELD = 4
"""Most batches per worker a consumer may hold as views of their slots (see the module docstring)."""

_REGISTRY: dict[str, "SlotRings"] = {}
_RETIRED: "collections.OrderedDict[str, None]" = collections.OrderedDict()
_RETIRED_KEPT = 1024  # tokens of rings already let go of, remembered (a few bytes each)


def _retire(token: str) -> None:
    _REGISTRY.pop(token, None)
    _RETIRED[token] = None
    while len(_RETIRED) > _RETIRED_KEPT:
        _RETIRED.popitem(last=False)


def register(rings: "SlotRings", owner: object) -> None:
    """Make ``rings`` findable by the main process's unpickler for as long as ``owner`` (the loader) lives."""
    _REGISTRY[rings.token] = rings
    weakref.finalize(owner, _retire, rings.token)


def unregister(rings: "SlotRings") -> None:
    """Forget ``rings`` (a loader replaced them); batches still referring to them can no longer be read."""
    _retire(rings.token)


class RetiredBatch:
    """What a batch of rings already let go of unpickles to: nothing to read. Torch's pin-memory
    thread can still take one from the queue while a loader is torn down (a trainer leaving its
    loop at exit); it is dropped with the iterator instead of raising in that thread."""

    def __repr__(self) -> str:
        return "RetiredBatch()"


def rings_of(token: str) -> "SlotRings":
    """The rings a slot reference names (main process)."""
    try:
        return _REGISTRY[token]
    except KeyError:
        raise RuntimeError(f"batch refers to slot rings {token[:8]} that no live loader in this process owns") from None


def shared_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` (at least 1) of zeroed shared memory, as a ``uint8`` tensor that DataLoader workers
    inherit; its pages are allocated when first written (where torch can)."""
    size = max(int(nbytes), 1)
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is not None:
        lazy: torch.Tensor = torch.empty(0, dtype=torch.uint8).set_(new_shared(size))[:size]
        return lazy
    eager: torch.Tensor = torch.zeros(size, dtype=torch.uint8).share_memory_()
    return eager


class SlotRings:
    """``slots`` shared-memory buffers of ``nbytes`` (plus header) for each of ``workers`` workers."""

    def __init__(self, workers: int, slots: int, nbytes: int, timeout_s: float = 1.0):
        self.token = uuid.uuid4().hex
        self.workers, self.slots, self.nbytes, self.timeout_s = workers, slots, nbytes, timeout_s
        self.buffers = [[shared_bytes(SLOT_HEADER + max(nbytes, 1)) for _ in range(slots)] for _ in range(workers)]
        self._next = [0] * workers
        self._flags: dict[tuple[int, int], np.ndarray] = {}
        self.held = [0] * workers  # main process: batches alive as views of this worker's slots
        self._held_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_flags"] = {}
        state["held"] = [0] * self.workers
        del state["_held_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._held_lock = threading.Lock()

    def hold(self, worker: int, delta: int) -> bool:
        """Count a zero-copy batch of ``worker`` in (``+1``: ``False`` when the worker already has
        :data:`ZERO_COPY_HELD`) or out (``-1``)."""
        with self._held_lock:
            if delta > 0 and self.held[worker] >= ZERO_COPY_HELD:
                return False
            self.held[worker] += delta
            return True

    def _flag(self, worker: int, slot: int) -> np.ndarray:
        f = self._flags.get((worker, slot))
        if f is None:
            f = self._flags[(worker, slot)] = self.buffers[worker][slot][:1].numpy()
        return f

    def acquire(self, worker: int) -> tuple[torch.Tensor, "SlotLease"] | None:
        """Worker side: ``(batch buffer, lease)`` of the worker's next free slot (in ring order: one a
        consumer still holds is passed over), waiting for the next one when none is free; ``None``
        after the timeout."""
        i = self._next[worker]
        for step in range(self.slots):
            j = (i + step) % self.slots
            if not self._flag(worker, j)[0]:
                i = j
                break
        self._next[worker] = (i + 1) % self.slots
        flag = self._flag(worker, i)
        if flag[0]:
            deadline = time.monotonic() + self.timeout_s
            while flag[0]:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.0002)
        flag[0] = 1
        return self.data(worker, i), SlotLease(self, worker, i, armed=False)

    def data(self, worker: int, slot: int) -> torch.Tensor:
        return self.buffers[worker][slot][SLOT_HEADER : SLOT_HEADER + self.nbytes]

    def release(self, worker: int, slot: int) -> None:
        """Main side: the batch in the slot was copied (or dropped); the worker may reuse it."""
        self._flag(worker, slot)[0] = 0


class SlotLease:
    """A batch's claim on a slot. Pickled as a reference; in the main process it frees the slot
    exactly once: when the batch is copied out, or when it is dropped without being read."""

    __slots__ = ("rings", "worker", "slot", "armed", "viewed", "__weakref__")

    def __init__(self, rings: SlotRings, worker: int, slot: int, armed: bool):
        self.rings, self.worker, self.slot, self.armed, self.viewed = rings, worker, slot, armed, False

    def reduce(self, spec: Any) -> tuple[Any, ...]:
        return (_rebuild, (self.rings.token, self.worker, self.slot, spec))

    def release(self) -> None:
        if self.armed:
            self.armed = False
            self.rings.release(self.worker, self.slot)
            if self.viewed:
                self.rings.hold(self.worker, -1)

    def adopt(self, buffer: torch.Tensor) -> torch.Tensor | None:
        """A tensor over the slot's batch bytes that owns this lease: the slot is freed when the
        tensor and every view of it are gone. ``None`` when the worker's zero-copy budget is spent
        (the caller copies the batch out instead)."""
        if not self.armed or not self.rings.hold(self.worker, +1):
            return None
        self.viewed = True
        return torch.from_numpy(np.asarray(_SlotBytes(buffer, self)))

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: nothing left to free
            pass


class _SlotBytes:
    """The numpy interface of a slot's batch bytes; holds the slot's tensor and the lease, so the slot
    stays busy (and mapped) while any array or tensor made from it lives."""

    def __init__(self, buffer: torch.Tensor, lease: SlotLease):
        self.__array_interface__ = {"data": (buffer.data_ptr(), False), "shape": (buffer.numel(),), "typestr": "|u1", "version": 3}
        self.buffer = buffer
        self.lease = lease


def _rebuild(token: str, worker: int, slot: int, spec: Any) -> Any:
    """Unpickling in the main process: the batch, viewing the slot, holding an armed lease."""
    from loaders.batch import PackedBatch

    if token in _RETIRED:
        return RetiredBatch()
    rings = rings_of(token)
    return PackedBatch(rings.data(worker, slot), spec, SlotLease(rings, worker, slot, armed=True))
