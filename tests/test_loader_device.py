"""to_device: pass-through without CUDA; on a GPU, overlapped copies that equal the host batches."""

from __future__ import annotations

import pytest
import torch

from loader_fixtures import batches_equal, causal_cache  # noqa: F401
from loaders import ShardStream, expand_compact, make_loader, to_device
from loaders.batch import PackedBatch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_device_passes_batches_through(causal_cache):
    loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=50), num_workers=0)
    host = list(loader)
    for device in ("cpu", torch.device("cpu")):
        loader.set_epoch(0)
        moved = list(to_device(loader, device))
        assert len(moved) == len(host)
        assert all(batches_equal(a, b) for a, b in zip(host, moved))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_cuda_without_cuda_is_a_pass_through(causal_cache):
    loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=50), num_workers=0)
    batches = list(to_device(loader, "cuda"))
    assert len(batches) == 4 and all(v.device.type == "cpu" for b in batches for v in b.values())


def test_packed_batch_round_trip(causal_cache):
    batch = ShardStream(causal_cache, view="twins", batch_size=700, compact=True).batch(0)
    packed = batch.packed
    assert isinstance(packed, PackedBatch)
    again = packed.to("cpu").unpack()
    assert batches_equal(batch, again)
    assert all(v.untyped_storage().data_ptr() == packed.buffer.untyped_storage().data_ptr() for v in batch.values())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("num_workers", [0, 2])
def test_to_device_equals_host_batches(causal_cache, num_workers):
    stream = ShardStream(causal_cache, view="graphs", batch_size=32, seed=1)
    host = [{k: v.clone() for k, v in b.items()} for b in stream]
    loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=32, seed=1), num_workers=num_workers, prefetch_factor=2)
    assert loader.pin_memory
    got = []
    for batch in to_device(loader, "cuda"):
        assert all(v.is_cuda for v in batch.values())
        # slow work on the current stream while the next batch copies on the side stream
        torch.cuda._sleep(2_000_000)
        got.append({k: v.cpu() for k, v in batch.items()})
    assert len(got) == len(host)
    assert all(batches_equal(a, b) for a, b in zip(host, got))


@pytest.mark.gpu
@cuda
def test_held_batches_are_not_overwritten(causal_cache):
    """Keep every device batch alive and check them at the end: no buffer was reused early."""
    stream = ShardStream(causal_cache, view="twins", batch_size=1000, compact=True, seed=2)
    host = [{k: v.clone() for k, v in b.items()} for b in stream]
    loader = make_loader(ShardStream(causal_cache, view="twins", batch_size=1000, compact=True, seed=2), num_workers=2)
    kept = []
    for batch in to_device(loader, "cuda"):
        kept.append(batch)
        torch.cuda._sleep(1_000_000)
        expand_compact(batch)  # device-side expansion of the compact context
    torch.cuda.synchronize()
    assert all(batches_equal(a, {k: v.cpu() for k, v in b.items()}) for a, b in zip(host, kept))


@pytest.mark.gpu
@cuda
def test_state_counts_what_the_trainer_received(causal_cache):
    loader = make_loader(ShardStream(causal_cache, view="graphs", batch_size=16), num_workers=2)
    it = to_device(loader, "cuda")
    next(it), next(it), next(it)  # to_device holds batch 4 ahead
    assert loader.state_dict()["position"] == 3
