"""The next pool decoded in a thread while a process's batches read the current one.

In a mixed plan a process builds all batches of pool ``q`` from records decoded
once (:class:`loaders.views.store.RecordStore`); the decode of pool ``q + 1``
would otherwise stall the batch that first needs it (a pool of 33,000 small
records: ~40 ms). A store that may decode ahead (the pooled ``records`` view,
in the trainer's process: DataLoader workers share their pools instead) starts
that decode in a thread as soon as a batch lies wholly in pool ``q``, into the
region the previous pool has left; zstd and numpy's copies release the GIL, so
on a machine with a core to spare the decode runs beside the batches.

In the epoch's last pool, the next epoch's first pool is decoded ahead the same
way (its plan from the stream: :meth:`loaders.ShardStream.make_plan`), into one
more region, kept from this epoch's batches (the last batch's padding reads
this epoch's first pool again, elsewhere); the next epoch uses it if its plan is
the one decoded for (the same plan fingerprint: not after ``set_epoch`` to
another epoch, a grown cache or a restore elsewhere), else it is dropped.

Batches do not change: the same records are decoded into the same rows, and a
batch that needs the pool (or a decode: one reader of the shards at a time)
first waits for the thread. A decode that raises is raised to the batch that
needs its pool.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from loaders.plan import BatchItems

if TYPE_CHECKING:
    from cachebuild.format.reader import ShardSet
    from loaders.views.store import RecordStore

__all__ = ["AheadDecode", "AheadPools", "FirstPool", "PROTECTED"]

PROTECTED = -2
"""A store region's pool id while it holds the next epoch's first pool: no batch of this epoch takes it."""

FirstPool = Callable[[Any], "tuple[tuple[Any, ...], int, np.ndarray] | None"]
"""``first_pool(plan)``: ``(plan_key, plan_id, record ids)`` of ``plan``'s first pool as its batches will name it, or ``None``."""


class AheadDecode:
    """Pool ``pool``'s records ``ids`` being decoded into rows ``dest`` of region ``region``, in a thread
    (``key``, ``plan_id``: the plan it belongs to; ``next_epoch``: a later plan than the batches' now)."""

    def __init__(
        self, pool: int, region: int, ids: np.ndarray, dest: np.ndarray, decode: Callable[[np.ndarray, np.ndarray], None], key: tuple[Any, ...] = (), plan_id: int = 0, next_epoch: bool = False
    ):
        self.pool, self.region, self.dest, self.count = pool, region, dest, len(ids)
        self.key, self.plan_id, self.next_epoch = key, plan_id, next_epoch
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(decode, ids, dest), name=f"cachebuild-pool-{pool}-ahead", daemon=True)
        self.thread.start()

    def _run(self, decode: Callable[[np.ndarray, np.ndarray], None], ids: np.ndarray, dest: np.ndarray) -> None:
        try:
            decode(ids, dest)
        except BaseException as exc:  # (raised to the batch that waits for it)
            self.error = exc

    def wait(self) -> BaseException | None:
        """Return once the decode is done: what it raised, or ``None``. (It does not raise: a caller
        tells a failed decode from a Ctrl-C during the wait, and forgets the decode only once it ended.)"""
        self.thread.join()
        return self.error


class AheadPools:
    """A :class:`~loaders.views.store.RecordStore`'s decodes ahead (module docstring): at most one pending."""

    def __init__(self, first_pool: FirstPool):
        self.first_pool = first_pool
        self.plans: Callable[[int], Any] | None = None  # the stream's plan of an epoch (trainer's process only)
        self.pending: AheadDecode | None = None

    def drop(self) -> None:
        """Forget the pending decode once it has ended (its thread writes into the store's arrays: a Ctrl-C
        while waiting leaves it pending, so no batch takes its region under it)."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None

    def new_plan(self, store: RecordStore, items: BatchItems) -> None:
        """The batches moved to another plan (regions just freed): keep a decode made ahead for it, or drop it."""
        p = self.pending
        if p is not None and p.next_epoch and (p.key, p.plan_id) == (items.plan_key, items.plan_id):
            p.next_epoch = False
            store.held[p.region] = p.pool
            return
        self.drop()

    def before(self, store: RecordStore, pools: np.ndarray) -> None:
        """Before a batch of ``pools`` takes its regions: wait for the pending decode if the batch needs its
        pool, or any pool not decoded (its decode and the thread's would read the shards at once)."""
        p = self.pending
        if p is None:
            return
        held = set(store.held.tolist()) - {p.pool, PROTECTED}
        lo, hi = int(pools.min()), int(pools.max())
        if lo in held and hi in held and (lo == hi or set(np.unique(pools).tolist()) <= held):
            return
        if p.next_epoch:  # (its pool is not this epoch's: it stays, done, until the next epoch takes it)
            p.thread.join()
            return
        self.wait(store)

    def wait(self, store: RecordStore) -> None:
        """Wait for the pending decode and mark its rows decoded (a failed one frees its region, and raises)."""
        p = self.pending
        if p is None:
            return
        error = p.wait()  # (forgotten only once it ended: a Ctrl-C here leaves it pending)
        self.pending = None
        if error is not None:
            store.held[p.region] = -1
            raise error
        store.done[p.dest] = True
        store.decodes += p.count

    def after(self, store: RecordStore, shards: ShardSet, items: BatchItems) -> None:
        """After a batch lying wholly in pool ``q``: start decoding pool ``q + 1`` (the next epoch's first, after the last)."""
        if self.pending is not None:
            return
        assert items.pool is not None and items.pool_records is not None and store.arrays is not None
        q = int(items.pool[0])
        if int(items.pool.min()) != q or int(items.pool.max()) != q or q + 1 in store.held:
            return
        try:
            ids, key, plan_id, later = items.pool_records(q + 1), items.plan_key, items.plan_id, False
        except IndexError:  # the epoch's last pool: the next epoch's first
            nxt = self.first_pool(self.plans(int(items.plan_key[1]) + 1)) if self.plans is not None else None
            if nxt is None:
                return
            (key, plan_id, ids), later = nxt, True
        free = [r for r, p in enumerate(store.held.tolist()) if p != q and p != PROTECTED]
        if not free or not 0 < len(ids) <= store.size:
            return
        # (an empty region first, then one of another pool than this epoch's first: the epoch's last batch
        # wraps to that pool for its padding, and finding it decoded saves decoding it again)
        r = min(free, key=lambda r: (int(store.held[r]) == 0, int(store.held[r]) != -1))
        lo, hi = r * store.size, (r + 1) * store.size
        for name, arr in store.arrays.items():
            if store.fields[name].zero:
                arr[lo:hi] = 0
        store.done[lo:hi] = False
        store.held[r] = PROTECTED if later else q + 1
        arrays, decode = store.arrays, store.decode_rows  # (in the store's decode process where it has one)
        self.pending = AheadDecode(0 if later else q + 1, r, ids, lo + np.arange(len(ids), dtype=np.int64), lambda i, d: decode(shards, i, arrays, d), key, plan_id, later)
