"""Decoded pools shared by a loader's DataLoader workers: each pool decoded once, not once per worker.

Why: in a mixed plan (:mod:`loaders.pools`) every batch draws rows from a whole
pool of records, and the DataLoader hands batches to workers in turn, so every
worker builds batches of every pool. With private stores
(:class:`loaders.views.store.RecordStore`) each worker decoded every record of
every pool: ``W`` workers did ``W`` times the decoding of one, and the cost per
batch of a worker grew with ``W`` (a ``twins`` pool of 1,024 graphs serves about
240 batches; at 8 workers each worker decodes it for 30 of them).

What: the loader allocates, before its workers start, ``regions`` shared
buffers of one pool each (``pool_span + workers``: the pools one batch touches,
plus one for each worker running a pool ahead) and a small control table, all
in shared memory that pages in when first written. A worker that needs a pool
claims a region under a lock; the pool is decoded in parts of
:data:`PART_RECORDS` records, and every worker that needs the pool while parts
are left takes the next part (under the lock) and decodes it, so workers help
with a decode instead of waiting for it; the last part done marks the region
ready, and a worker with no part left waits for that (polling). A region is
reused for another pool only when no batch is reading it and every worker has
moved past its pool (each worker publishes the first pool of the batch it is
building). Batches do not change: the same records are decoded into the same
padded rows whichever worker decodes them.

Never a deadlock and never a wrong row: a worker that finds no region it may
take, or waits longer than ``wait_s`` for another's decode, uses its private
store for that batch (decoding as before); a decode that raises frees its
region, so waiting workers find it empty and decode (and raise) themselves.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from loaders.plan import BatchItems
from loaders.slots import shared_bytes

__all__ = ["SharedPools", "shared_pools_for"]

_PLAN, _EPOCH, _POOL, _STATE, _USERS, _NEXT, _DONE, _ZERO = range(8)  # columns of a region's control row
_COLS = 8
PART_RECORDS = 128
"""Records per part of a pool's decode: the unit workers share (a part is one ``read_block``)."""
_EMPTY, _DECODING, _READY = 0, 1, 2
_MAX_SHARE_OF_SHM = 0.25  # of /dev/shm's free space, at most, so a full tmpfs never faults a worker


class SharedPools:
    """``regions`` decoded pools of ``pool_size`` records, shared by ``workers`` processes (module docstring)."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], str]], pool_size: int, regions: int, workers: int, lock: Any, wait_s: float = 30.0, part_records: int = PART_RECORDS):
        self.fields = dict(fields)
        self.part_records = max(1, int(part_records))
        self.pool_size, self.regions, self.workers, self.wait_s = int(pool_size), int(regions), int(workers), float(wait_s)
        rows = self.pool_size * self.regions
        self._buffers = {k: shared_bytes(rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize) for k, (shape, dtype) in self.fields.items()}
        self._control = shared_bytes(8 * (_COLS * self.regions + 3 * self.workers + 2))
        self.lock = lock
        self._views: dict[str, np.ndarray] | None = None
        self._mine: list[int] = []  # regions this process's current batch reads

    @property
    def nbytes(self) -> int:
        return sum(int(b.numel()) for b in self._buffers.values())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_views"], state["_mine"] = None, []
        return state

    def _arrays(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        if self._views is None:
            rows = self.pool_size * self.regions
            self._views = {k: self._buffers[k].numpy().view(dtype).reshape((rows,) + tuple(shape)) for k, (shape, dtype) in self.fields.items()}
        flat = self._control.numpy().view(np.int64)
        ctrl = flat[: _COLS * self.regions].reshape(self.regions, _COLS)
        prog = flat[_COLS * self.regions : _COLS * self.regions + 3 * self.workers].reshape(self.workers, 3)
        return self._views, ctrl, prog, flat[-2:]

    @property
    def decoded(self) -> int:
        """Records decoded into the shared regions so far, by every worker together."""
        return int(self._arrays()[3][0])

    @property
    def private_batches(self) -> int:
        """Batches a worker built from its private store instead (no region free, or a wait timed out)."""
        return int(self._arrays()[3][1])

    def fits(self, items: BatchItems, dense: dict[str, Any]) -> bool:
        """Whether this batch's pools can live here (pools no larger, same record layout as allocated).

        A grown cache's plan cuts its pools anew (``records / ceil(records / mix)`` each): they may
        be a record smaller or larger than the plan the regions were sized for, so regions are
        sized for ``mix`` (:func:`shared_pools_for`) and any pool up to that size fits.
        """
        return 0 < items.pool_size <= self.pool_size and {k: (tuple(d.shape), np.dtype(d.dtype).name) for k, d in dense.items()} == self.fields

    def take(self, items: BatchItems, worker: int, decode: Callable[[np.ndarray, np.ndarray, dict[str, np.ndarray]], None], zero: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """``(arrays, where)`` with every pool of the batch decoded in shared regions, or ``None``
        (no region free, or another worker's decode took too long: the caller decodes privately).

        ``decode(ids, rows, arrays)`` decodes records ``ids`` into ``arrays[k][rows]``; ``zero`` are
        the fields to clear before a region is reused. Call :meth:`done` when the batch is built.
        """
        assert items.pool is not None and items.pool_index is not None and items.pool_records is not None, "a mixed batch"
        arrays, ctrl, prog, count = self._arrays()
        key = (int(items.plan_id), int(items.plan_key[1]))
        pools = np.unique(items.pool).tolist()
        claimed: dict[int, int] = {}
        region_of: dict[int, int] = {}
        with self.lock:
            # the pool this worker is at: the batch's first (the epoch's last batch wraps to pool 0 for its
            # padding rows, which is no reason to keep every pool between alive)
            prog[worker] = (key[0], key[1], pools[-1] if items.is_pad.any() else pools[0])
            for q in pools:
                hit = np.flatnonzero((ctrl[:, _PLAN] == key[0]) & (ctrl[:, _EPOCH] == key[1]) & (ctrl[:, _POOL] == q) & (ctrl[:, _STATE] != _EMPTY))
                if hit.size:
                    r = int(hit[0])
                else:
                    victim = self._victim(ctrl, prog)
                    if victim is None:
                        for taken in region_of.values():
                            ctrl[taken, _USERS] -= 1
                        count[1] += 1
                        return None
                    r = victim
                    fresh = ctrl[r, _PLAN] == 0  # never used: its shared pages are still zero
                    ctrl[r] = (key[0], key[1], q, _DECODING, 0, 0, 0, 0 if fresh else 1)
                    claimed[q] = r
                ctrl[r, _USERS] += 1
                region_of[q] = r
        self._mine = list(region_of.values())
        for q, r in region_of.items():  # decode the parts left of every pool not ready yet (ours or another's)
            self._help(r, items.pool_records(q), arrays, ctrl, count, decode, zero, list(claimed.values()))
        if not self._wait_ready(list(region_of.values()), ctrl):
            self.done()
            with self.lock:
                count[1] += 1
            return None
        region = np.array([region_of[q] for q in items.pool.tolist()], np.int64) if len(items.pool) else np.zeros(0, np.int64)
        return arrays, region * self.pool_size + items.pool_index

    def _help(self, r: int, ids: np.ndarray, arrays: dict[str, np.ndarray], ctrl: np.ndarray, count: np.ndarray, decode: Callable[..., None], zero: list[str], claimed: list[int]) -> None:
        """Decode parts of pool records ``ids`` into region ``r`` while parts are left; the last part
        done marks the region ready (a region already ready, or emptied by a failed decode, is left).

        On an error the region and every region this batch claimed that is not ready yet are marked
        empty: left ``DECODING`` they could never be reused, and a worker needing one of those pools
        would wait ``wait_s`` for a decode nobody runs. Workers still decoding a part of such a
        region keep their use of it until they finish, so it is not reused under them.
        """
        step = self.part_records
        lo, parts = r * self.pool_size, max(1, -(-len(ids) // step))  # an empty pool: one empty part
        while True:
            with self.lock:
                if ctrl[r, _STATE] != _DECODING or ctrl[r, _NEXT] >= parts:
                    return
                part = int(ctrl[r, _NEXT])
                ctrl[r, _NEXT] += 1
                clear = bool(ctrl[r, _ZERO])
            a, b = part * step, min(len(ids), (part + 1) * step)
            try:
                for k in zero if clear else ():  # the rows this part uses (regions are sized for mix; rows past the pool are never read)
                    arrays[k][lo + a : lo + b] = 0
                if b > a:
                    decode(ids[a:b], lo + np.arange(a, b, dtype=np.int64), arrays)
            except BaseException:
                with self.lock:
                    bad = [q for q in {r, *claimed} if ctrl[q, _STATE] == _DECODING]
                    ctrl[bad, _STATE] = _EMPTY  # workers waiting on them give up on them (and release their use)
                    for taken in self._mine:
                        ctrl[taken, _USERS] -= 1
                self._mine = []
                raise
            with self.lock:
                if ctrl[r, _STATE] != _DECODING:
                    return
                ctrl[r, _DONE] += 1
                count[0] += b - a
                if ctrl[r, _DONE] == parts:
                    ctrl[r, _STATE] = _READY

    def _wait_ready(self, regions: list[int], ctrl: np.ndarray) -> bool:
        """Wait until every one of ``regions`` is ready (the parts other workers decode); ``False`` on a timeout or a failed decode."""
        deadline = time.monotonic() + self.wait_s
        for r in regions:
            while ctrl[r, _STATE] != _READY:
                if ctrl[r, _STATE] == _EMPTY or time.monotonic() > deadline:
                    return False
                time.sleep(0.0002)
        if regions:
            with self.lock:  # a barrier: the decoder's writes happened before its READY
                pass
        return True

    def _victim(self, ctrl: np.ndarray, prog: np.ndarray) -> int | None:
        """A region no batch reads and no worker needs again (every worker is past its pool), oldest first; or ``None``."""
        free = (ctrl[:, _USERS] == 0) & (ctrl[:, _STATE] != _DECODING)
        empty = np.flatnonzero(free & (ctrl[:, _STATE] == _EMPTY))
        if empty.size:
            return int(empty[0])
        best = None
        for r in np.flatnonzero(free).tolist():
            plan, epoch, pool = ctrl[r, _PLAN], ctrl[r, _EPOCH], ctrl[r, _POOL]
            same = prog[:, 0] == plan
            ahead = (prog[:, 1] > epoch) | ((prog[:, 1] == epoch) & (prog[:, 2] > pool))
            if (ahead | ~same).all() and (best is None or (epoch, pool) < (ctrl[best, _EPOCH], ctrl[best, _POOL])):
                best = r
        return best

    def done(self) -> None:
        """The batch that took regions is built: they may be reused."""
        if self._mine:
            _, ctrl, _, _ = self._arrays()
            with self.lock:
                for r in self._mine:
                    ctrl[r, _USERS] -= 1
            self._mine = []


def shared_pools_for(view: Any, plan: Any, workers: int, context: Any) -> SharedPools | None:
    """Shared pools for ``view``'s record store across ``workers`` DataLoader workers, or ``None``
    (fewer than 2 workers, no store, an unmixed plan, or more memory than a quarter of
    /dev/shm's free space: then each worker keeps its private store, as before)."""
    store = getattr(view, "store", None)
    if store is None or workers < 2 or plan.pools is None:
        return None
    fields = {k: (tuple(d.shape), np.dtype(d.dtype).name) for k, d in store.fields.items()}
    per_record = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(t).itemsize for s, t in fields.values())
    regions = plan.pool_span + workers
    size = plan.pool_size
    mix = getattr(view, "mix", None)
    if isinstance(mix, int) and len(plan.pools) > 2:  # 2+ pools: any later plan's are <= mix (and this one's > mix / 2)
        size = max(size, mix)
    need = per_record * size * regions
    try:
        st = os.statvfs("/dev/shm")
        room = st.f_bavail * st.f_frsize
    except OSError:
        return None
    if need > _MAX_SHARE_OF_SHM * room:
        return None
    lock = (context if context is not None else __import__("multiprocessing")).Lock()
    part = max(1, int(getattr(view, "pool_part", None) or PART_RECORDS))  # (a view whose records share frames decodes whole frames)
    return SharedPools(fields, size, regions, workers, lock, part_records=part)
