"""GpuIdleMeter through StallMonitor on a real GPU: a data-starved loop shows idle gaps, a GPU-bound one none."""

from __future__ import annotations

import time

import pytest
import torch

from loaders.monitor import StallMonitor

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SPIN = 20_000_000  # torch.cuda._sleep cycles: ~10 ms at datacentre clocks


def _run(batches, gpu_cycles: int, cpu_delay_s: float):
    x = torch.zeros(4, device="cuda")

    def slow():
        for i in range(batches):
            time.sleep(cpu_delay_s)  # the loader makes the trainer (and so the GPU) wait
            yield x

    monitor = StallMonitor(sample_every_s=None, warn=None, gpu_idle=True)
    for b in monitor.wrap(slow()):
        torch.cuda._sleep(gpu_cycles)  # the step's device work, enqueued asynchronously
    return monitor.summary()


@pytest.mark.gpu
@cuda
def test_gpu_bound_loop_shows_no_idle_gap():
    sm = _run(40, SPIN, 0.0)
    assert sm.gpu_idle_fraction is not None and sm.gpu_idle_fraction < 0.02
    assert sm.gpu_idle_ms_per_step < 0.2


@pytest.mark.gpu
@cuda
def test_data_bound_loop_shows_the_stall():
    sm = _run(30, 200_000, 0.02)  # ~0.1 ms of GPU work, 20 ms of waiting for data
    assert sm.gpu_idle_fraction is not None and sm.gpu_idle_fraction > 0.8
    assert 15 < sm.gpu_idle_ms_per_step < 40


def test_without_cuda_the_idle_fields_are_none():
    sm = StallMonitor(sample_every_s=None, warn=None, gpu_idle=False)
    for _ in sm.wrap(iter([torch.zeros(2)] * 5)):
        pass
    assert sm.summary().gpu_idle_fraction is None and sm.summary().gpu_idle_ms_per_step is None
