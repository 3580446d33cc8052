"""Samples the GPUs at an interval and emits ``GpuSample`` events on the bus.

NVML (package nvidia-ml-py) gives utilization, memory, power and SM clock;
torch adds its own allocator's view. Without a GPU (or without the NVIDIA
driver) ``start()`` returns False and nothing is ever emitted: the front ends
then show "N/A (no GPU)". A reading a device does not support is NaN, not an
error.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from kvscope.engine.events import EventBus, GpuSample, now_ns


def _reading(read: Callable[[], float]) -> float:
    try:
        return read()
    except pynvml.NVMLError:
        return math.nan


def _torch_allocated(index: int) -> int:
    torch = sys.modules.get("torch")  # the engine's torch; never import it here
    if torch is None or not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return 0
    return int(torch.cuda.memory_allocated(index))


class GpuSampler:
    """Every ``interval_s``, one GpuSample per device, stamped with ``current_step()``."""

    def __init__(
        self,
        bus: EventBus,
        interval_s: float = 1.0,
        current_step: Callable[[], int] = lambda: -1,
    ) -> None:
        self.bus = bus
        self.interval_s = interval_s
        self.current_step = current_step
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def start(self) -> bool:
        """Start sampling; False (and no thread) when there is no GPU to sample."""
        try:
            pynvml.nvmlInit()
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except pynvml.NVMLError:
            self._handles = []
        if not self._handles:
            return False
        self._thread = threading.Thread(target=self._run, name="kvscope-gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def sample(self) -> list[GpuSample]:
        """One reading of every device (also what the thread emits)."""
        ts, step = now_ns(), self.current_step()
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used, total = int(memory.used), int(memory.total)
            except pynvml.NVMLError:
                used = total = 0
            samples.append(
                GpuSample(
                    ts_ns=ts,
                    step=step,
                    gpu_index=index,
                    utilization_pct=_reading(
                        lambda h=handle: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    ),
                    memory_used_bytes=used,
                    memory_total_bytes=total,
                    power_w=_reading(lambda h=handle: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    sm_clock_mhz=_reading(
                        lambda h=handle: float(
                            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
                        )
                    ),
                    torch_allocated_bytes=_torch_allocated(index),
                )
            )
        return samples

    def _run(self) -> None:
        while True:
            for sample in self.sample():
                self.bus.emit(sample)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Stop the thread and release NVML."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._handles:
            self._handles = []
            pynvml.nvmlShutdown()
