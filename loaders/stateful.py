"""torchdata's ``StatefulDataLoader`` over a :class:`ShardStream`, checking a loaded state in the main process.

A plain ``StatefulDataLoader(stream, batch_size=None, num_workers=N)`` works
too (each worker saves and loads its own share, see :mod:`loaders.state`);
its state resumes only with the same ``num_workers``. With workers on both
sides, a mismatch is refused inside the workers and torch re-raises it in the
main process as one line (:class:`~cachebuild.errors.WorkerStateError`);
when either side has ``num_workers=0``, torchdata's own assertion on the
state's layout comes first. :class:`StatefulStreamLoader` refuses every
mismatch in ``load_state_dict``, in the main process, before any worker
starts::

    from loaders.stateful import StatefulStreamLoader

    dl = StatefulStreamLoader(stream, num_workers=2)
    dl.load_state_dict(state)          # WorkerStateError at once if state was saved with num_workers != 2

``torchdata`` is an optional dependency: ``pip install torchdata``.
"""

from __future__ import annotations

from typing import Any

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError as e:
    raise ImportError("loaders.stateful needs torchdata: pip install torchdata") from e

from loaders.state import check_loader_workers
from loaders.stream import ShardStream

__all__ = ["StatefulStreamLoader"]


class StatefulStreamLoader(StatefulDataLoader):  # type: ignore[misc]
    """A torchdata ``StatefulDataLoader`` of a :class:`ShardStream` (``batch_size=None``: the stream batches).

    ``load_state_dict`` refuses a state saved with another ``num_workers`` in
    one line (:class:`~cachebuild.errors.WorkerStateError`), before torchdata
    reads it; everything else is torchdata's.
    """

    def __init__(self, stream: ShardStream, **kwargs: Any):
        kwargs.setdefault("batch_size", None)
        super().__init__(stream, **kwargs)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check the saved ``num_workers`` against this loader's, then torchdata's restore."""
        if state_dict:
            check_loader_workers(state_dict, self.num_workers)
        super().load_state_dict(state_dict)
