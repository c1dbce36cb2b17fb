"""``to_device``: move batches to the GPU on a side stream, one batch ahead of the trainer.

While the trainer works on batch i (on the current stream), batch i+1 is
copied host-to-device on a side CUDA stream. Before batch i is handed over,
the current stream waits for its copy (``wait_event``), and every device
tensor of it is marked as used by the current stream (``record_stream``) so
the caching allocator cannot hand its memory to a later copy while the
trainer still reads it. The pinned host buffer is kept referenced until its
copy's event has completed. A packed batch (:class:`loaders.batch.Batch` from
:func:`loaders.make_loader`) moves as one buffer, in one copy.

On a machine without CUDA, or for a CPU device, batches pass through unchanged.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from loaders.batch import Batch, PackedBatch

__all__ = ["to_device", "move"]


def _packed_of(batch: Any) -> PackedBatch | None:
    """The packed buffer behind a batch, if the batch is exactly its unpacked views."""
    packed = getattr(batch, "packed", None) if isinstance(batch, Batch) else None
    if not isinstance(packed, PackedBatch) or list(batch.keys()) != list(packed.keys()):
        return None
    base = packed.buffer.untyped_storage().data_ptr()
    if any(not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() != base for t in batch.values()):
        return None
    return packed


def move(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """``batch`` on ``device``: one copy for a packed batch, else tensor by tensor through dicts, lists, tuples."""
    packed = _packed_of(batch)
    if packed is not None:
        return packed.to(device, non_blocking=non_blocking).unpack()
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move(v, device, non_blocking) for v in batch)
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)


def _device_storages(batch: Any) -> Iterator[torch.Tensor]:
    """One tensor per device allocation of a moved batch: the packed buffer once, else every tensor."""
    packed = getattr(batch, "packed", None)
    if isinstance(batch, Batch) and packed is not None:
        yield packed.buffer
    else:
        yield from _tensors(batch)


def to_device(loader: Iterable[Any], device: str | torch.device = "cuda", non_blocking: bool = True) -> Iterator[Any]:
    """Yield the batches of ``loader`` on ``device``, copying the next one while the current one trains.

    Pass-through (the batches unchanged) when ``device`` is not CUDA or CUDA is
    absent. When ``loader`` has ``note_lookahead`` (a :class:`StreamLoader`),
    it is told about the batch held ahead, so its ``state_dict()`` still counts
    only what the trainer received.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        yield from loader
        return
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    side = torch.cuda.Stream(device=dev)
    note = getattr(loader, "note_lookahead", None)
    it = iter(loader)

    def start_copy() -> tuple[Any, Any, torch.cuda.Event] | None:
        try:
            host = next(it)
        except StopIteration:
            return None
        if note is not None:
            note(1)
        with torch.cuda.stream(side):
            out = move(host, dev, non_blocking)
            done = torch.cuda.Event()
            done.record(side)
        return host, out, done

    ahead = start_copy()
    while ahead is not None:
        host, out, done = ahead
        current = torch.cuda.current_stream(dev)
        current.wait_event(done)  # the trainer's stream sees batch i only once its copy is complete
        for t in _device_storages(out):
            t.record_stream(current)  # memory allocated on `side`, used on `current`
        ahead = start_copy()  # batch i+1 starts copying while batch i trains
        if note is not None:
            note(-1)
        yield out
        done.synchronize()  # long done by now; after it the pinned host buffer may be freed
        del host
