"""Fixed-layout batches packed in one buffer.

A view declares its batch once as a :class:`Layout` (key -> shape, dtype),
fixed for the whole run (what ``torch.compile`` wants). Each batch is one
``uint8`` buffer holding every key at a 64-byte aligned offset; keys are views
into it. Why one buffer: a DataLoader worker hands a tensor to the main
process as a shared-memory segment plus a file descriptor, at a fixed cost per
tensor; one buffer per batch pays it once, is pinned in one call, and
:func:`loaders.to_device` copies it to the GPU in one transfer. Inside a worker
the buffer is one of the worker's reusable shared-memory slots
(:mod:`loaders.slots`), so nothing is copied on the way out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate_fn_map

__all__ = ["Field", "Layout", "PackedBatch", "Batch", "torch_dtype"]

_ALIGN = 64


@lru_cache(maxsize=1024)
def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@lru_cache(maxsize=1024)
def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides in elements."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class Field:
    """One batch key: shape (batch axis first), numpy dtype name, and its fill before a view writes it.

    ``fill`` is ``None`` when the view writes every element itself.
    """

    shape: tuple[int, ...]
    dtype: str
    fill: float | int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


class Layout:
    """Ordered batch keys with their byte offsets inside the batch buffer."""

    def __init__(self, fields: Mapping[str, Field]):
        self.fields = dict(fields)
        self.offsets: dict[str, int] = {}
        pos = 0
        for name, f in self.fields.items():
            self.offsets[name] = pos
            pos += -(-f.nbytes // _ALIGN) * _ALIGN
        self.nbytes = pos

    def __repr__(self) -> str:
        keys = ", ".join(f"{k}: {list(f.shape)} {f.dtype}" for k, f in self.fields.items())
        return f"Layout({keys})"

    def check_fits(self, batch_size: int, where: str) -> None:
        """Refuse (:class:`~cachebuild.errors.ConfigError`) a batch larger than this machine's memory,
        before anything is allocated: batches are sized by the manifest's ``max_shape``, which the
        loader trusts (``cachebuild verify`` checks it against the records)."""
        from cachebuild.errors import ConfigError

        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if self.nbytes > memory and self.fields:
            key, f = max(self.fields.items(), key=lambda kv: kv[1].nbytes)
            raise ConfigError(
                f"batch_size {batch_size} on {where} needs {self.nbytes / 1e9:.1f} GB per batch ('{key}' {list(f.shape)} {f.dtype} alone: "
                f"{f.nbytes / 1e9:.1f} GB), more than this machine's {memory / 1e9:.1f} GB of memory: lower batch_size, or check the cache's "
                "max_shape (`cachebuild verify` compares it with the records)"
            )

    def shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``key -> (shape, dtype)``, for documentation and checks."""
        return {k: (f.shape, f.dtype) for k, f in self.fields.items()}

    def allocate(self, shared: bool, slot: tuple[torch.Tensor, Any] | None = None) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """A buffer and writable numpy views of every key, keys with a ``fill`` pre-filled.

        ``slot`` is a reused shared-memory buffer (a worker's slot, see
        :mod:`loaders.slots`) to write into; else a new buffer, in shared
        memory when ``shared``, or a private one this layout handed out before
        and nobody holds any more (:class:`_Spares`: a fresh buffer costs page
        faults and the kernel's zeroing on every batch). A buffer known to be
        zero (a fresh shared segment) skips zero fills. Keys with ``fill=None``
        are left as they are: the view writes every element (padding included).
        """
        if slot is not None:
            buf, zeroed = slot[0], False
        elif shared:
            buf, zeroed = _new_buffer(self.nbytes, True)
        else:
            buf, zeroed = self._spares.take(self.nbytes), False
        raw = buf.numpy()
        arrays = {}
        for name, f in self.fields.items():
            off = self.offsets[name]
            arr = raw[off : off + f.nbytes].view(f.dtype).reshape(f.shape)
            if f.fill is not None and not (zeroed and f.fill == 0):
                arr.fill(f.fill)
            arrays[name] = arr
        return buf, arrays

    @property
    def _spares(self) -> "_Spares":
        spares = self.__dict__.get("_spare_buffers")
        if spares is None:
            spares = self.__dict__["_spare_buffers"] = _Spares()
        return spares

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_spare_buffers", None)  # buffers stay in their process
        return state

    def spec(self) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
        """Picklable description ``(key, dtype, shape, offset)`` carried with each packed batch."""
        return tuple((k, f.dtype, f.shape, self.offsets[k]) for k, f in self.fields.items())


def _storage_refs(t: torch.Tensor) -> int:
    """References to ``t``'s storage (tensors, views and numpy arrays of it), counted the same way each time."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


class _Spares:
    """Private batch buffers of one layout, reused once nothing but this holds them.

    A batch's tensors (and numpy arrays or views made from them) hold its
    buffer's storage; when the consumer has dropped them all, the storage's
    reference count is back to this holder's own and the buffer is reused for a
    later batch. Callers get an alias (``buf.view(-1)``), never the held tensor,
    so holding only the returned buffer counts too. At most ``keep`` buffers
    are held; a consumer that keeps more batches gets fresh ones.
    """

    def __init__(self, keep: int = 3):
        self.keep = keep
        self.held: list[tuple[torch.Tensor, int]] = []

    def take(self, nbytes: int) -> torch.Tensor:
        for buf, alone in self.held:
            if buf.numel() == nbytes and _storage_refs(buf) == alone:
                return buf.view(-1)
        buf, _ = _new_buffer(nbytes, False)
        if len(self.held) >= self.keep:
            self.held.pop(0)
        self.held.append((buf, _storage_refs(buf)))
        return buf.view(-1)


def _new_buffer(nbytes: int, shared: bool) -> tuple[torch.Tensor, bool]:
    """``(uint8 buffer, known to be zero)``."""
    if shared:
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
        if new_shared is not None:  # straight in shared memory: no copy on the way out, zero pages
            return torch.empty(0, dtype=torch.uint8).set_(new_shared(max(nbytes, 1)))[:nbytes], True
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_(), False
    return torch.empty(nbytes, dtype=torch.uint8), False


_TORCH_DTYPES = {
    np.dtype(k).name: v
    for k, v in {
        "bool": torch.bool,
        "uint8": torch.uint8,
        "int8": torch.int8,
        "int16": torch.int16,
        "int32": torch.int32,
        "int64": torch.int64,
        "float16": torch.float16,
        "float32": torch.float32,
        "float64": torch.float64,
        "uint16": torch.uint16,
        "uint32": torch.uint32,
        "uint64": torch.uint64,
    }.items()
}


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a numpy dtype name."""
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        return _TORCH_DTYPES[np.dtype(dtype).name]


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """One plain memcpy on this thread (numpy): torch's intra-op thread pool turns a 1 MB copy
    into milliseconds of waiting when the cores are busy with the workers."""
    np.copyto(dst.numpy(), src.numpy())


class Batch(dict[str, Any]):
    """A batch as ``key -> tensor``, plus the packed buffer the tensors view (``packed``).

    A plain ``dict`` for its users; :func:`loaders.to_device` uses ``packed``
    to move the whole batch in one copy.
    """

    packed: "PackedBatch | None" = None


class PackedBatch:
    """A batch in transit: one ``uint8`` buffer and the layout of its keys.

    Crosses the worker -> main process boundary as one shared-memory tensor
    (or, for a batch in a worker's reusable slot, as a reference to the slot:
    see :mod:`loaders.slots`). ``pin_memory()`` copies it into pinned memory in
    one call (the DataLoader's pin thread calls it); :meth:`detach` into private
    memory. Either frees the slot.
    """

    __slots__ = ("buffer", "spec", "lease")

    def __init__(self, buffer: torch.Tensor, spec: tuple[tuple[str, str, tuple[int, ...], int], ...], lease: Any = None):
        self.buffer = buffer
        self.spec = spec
        self.lease = lease

    def __reduce__(self) -> tuple[Any, ...]:
        if self.lease is not None:
            reduced: tuple[Any, ...] = self.lease.reduce(self.spec)
            return reduced
        return (PackedBatch, (self.buffer, self.spec))

    def detach(self) -> "PackedBatch":
        """A batch that owns its memory: one in a slot is copied out, and the slot freed."""
        if self.lease is None:
            return self
        own = torch.empty(self.buffer.shape, dtype=torch.uint8)
        _copy(own, self.buffer)
        self.lease.release()
        return PackedBatch(own, self.spec)

    def pin_memory(self, device: object = None) -> "PackedBatch":
        if self.lease is None:
            return PackedBatch(self.buffer.pin_memory(), self.spec)
        pinned = torch.empty(self.buffer.shape, dtype=torch.uint8, pin_memory=True)
        _copy(pinned, self.buffer)
        self.lease.release()
        return PackedBatch(pinned, self.spec)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PackedBatch":
        """The same batch on ``device`` (one copy of the whole buffer)."""
        return PackedBatch(self.detach().buffer.to(device, non_blocking=non_blocking), self.spec)

    def unpack(self) -> Batch:
        """``key -> tensor`` views into the buffer, without a copy: a batch in a worker's slot is
        viewed in place and its slot freed when the consumer drops the batch (copied out instead
        when the worker's budget of such batches is spent; see :mod:`loaders.slots`)."""
        if self.lease is not None:
            lease, self.lease = self.lease, None
            own = lease.adopt(self.buffer)
            if own is None:
                self.lease = lease
                return self.detach().unpack()
            return PackedBatch(own, self.spec).unpack()
        out = Batch()
        buf = self.buffer
        typed: dict[torch.dtype, torch.Tensor] = {}
        for name, dtype, shape, off in self.spec:
            td = torch_dtype(dtype)
            t = typed.get(td)
            if t is None:
                t = typed[td] = buf.view(td)
            out[name] = t.as_strided(shape, _strides(shape), t.storage_offset() + off // t.element_size())
        out.packed = self
        return out

    def keys(self) -> Iterator[str]:
        return (s[0] for s in self.spec)


def _refuse_collate(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    """A DataLoader's default collate, given batches of a :class:`ShardStream`: one line instead of
    a silent ``[n, batch_size, ...]`` stack (``DataLoader(stream)`` has ``batch_size=1``)."""
    raise TypeError(
        f"a DataLoader with a batch_size would stack {len(batch)} of a ShardStream's batches into one [{len(batch)}, batch_size, ...] "
        "(DataLoader's default batch_size is 1): the stream makes the batches; pass DataLoader(stream, batch_size=None) "
        "or use loaders.make_loader(stream), and set the size with ShardStream(..., batch_size=N)"
    )


# torch's documented way to extend default_collate (its docstring): only collation of our batch
# types is affected, and only when a DataLoader collates them at all (batch_size not None).
default_collate_fn_map.update({Batch: _refuse_collate, PackedBatch: _refuse_collate})
