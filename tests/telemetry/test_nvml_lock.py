"""NVML is entered by one thread at a time: two watches of external commands starting together in one process
killed it with a segmentation fault on 4x H200 (2026-11-27). A fake pynvml counts callers inside it at once."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

from musubi.telemetry.sampler import open_nvml_index


class CountingNvml:
    """Every NVML entry point sleeps a little and records how many threads were inside at once."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self) -> None:
        self.inside, self.most = 0, 0
        self.lock = threading.Lock()

    def __getattr__(self, name: str):
        def call(*args):
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            time.sleep(0.005)
            with self.lock:
                self.inside -= 1
            if name == "nvmlGpmQueryDeviceSupport":
                return SimpleNamespace(isSupportedDevice=0)
            if name == "nvmlDeviceGetUtilizationRates":
                return SimpleNamespace(gpu=10, memory=1)
            if name == "nvmlDeviceGetMemoryInfo":
                return SimpleNamespace(used=2**30, total=2**31)
            return 1
        return call


def test_threads_opening_and_reading_gpus_at_once_never_overlap_in_nvml(monkeypatch) -> None:
    nvml = CountingNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    start = threading.Barrier(4)
    samples: list[dict] = []

    def watch(index: int) -> None:
        start.wait()
        device = open_nvml_index(index)
        assert device is not None
        for _ in range(3):
            samples.append(device.read())

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(samples) == 12 and all(s["util"] == 10 for s in samples)
    assert nvml.most == 1
