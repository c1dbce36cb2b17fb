"""System numbers for the stall monitor: GPU utilisation and memory (NVML), CPU and RAM (psutil).

Sampled by a background thread every few hundred milliseconds, never per
training step; ``pynvml`` (package ``nvidia-ml-py``) is optional.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

__all__: list[str] = []  # internal to loaders.monitor


def _nvml(gpu: int | None) -> tuple[Any, Any] | None:
    """(pynvml, device handle) for the trainer's GPU, or None when NVML is unavailable.

    The CUDA device (``gpu``, default torch's current one) is matched to NVML by
    UUID when torch has initialised CUDA, else through ``CUDA_VISIBLE_DEVICES``
    (NVML counts physical devices, CUDA only the visible ones).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver or no device
        return None
    torch = sys.modules.get("torch")
    index = gpu
    try:
        if torch is not None and torch.cuda.is_initialized():
            index = torch.cuda.current_device() if gpu is None else gpu
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
    except Exception:  # an older torch without .uuid, or an unknown UUID: use the index below
        pass
    index = index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    try:
        if index < len(visible) and not visible[index].isdigit():
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(visible[index])
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(visible[index]) if index < len(visible) else index)
    except Exception:  # no such device: GPU stats unavailable
        return None


class _Sampler:
    """Background thread sampling GPU util/memory (NVML) and CPU/RAM (psutil) every ``interval`` s."""

    def __init__(self, interval: float, gpu: int | None) -> None:
        self.interval, self.gpu = interval, gpu
        self.gpu_util: list[float] = []
        self.gpu_times: list[float] = []  # perf_counter of each GPU sample
        self.gpu_mem: list[float] = []
        self.cpu: list[float] = []
        self.ram: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: tuple[Any, Any] | None = None

    def start(self) -> None:
        import psutil

        self._nv = _nvml(self.gpu)
        psutil.cpu_percent(interval=None)  # prime: the next call measures since now
        self._thread = threading.Thread(target=self._loop, name="stall-monitor-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        import psutil

        self.cpu.append(psutil.cpu_percent(interval=None))
        self.ram.append(psutil.virtual_memory().used / 1e9)
        if self._nv is not None:
            nv, handle = self._nv
            try:
                self.gpu_util.append(float(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
                self.gpu_times.append(time.perf_counter())
                self.gpu_mem.append(nv.nvmlDeviceGetMemoryInfo(handle).used / 1e9)
            except Exception:  # the device went away: stop asking
                self._nv = None

    def stop(self) -> None:
        """Stop the thread; take one last sample so short epochs still get numbers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # bounded: one NVML/psutil sample at most
            self._thread = None
            self.sample()
