"""The span recorder on CPU: contiguous sections, the pre-sync split, records written off the hot path."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from musubi.contract.errors import ConfigError
from musubi.contract.inject import parse
from musubi.telemetry.sampler import Sampler, throttle_names
from musubi.telemetry.spans import SpanRecorder


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_sections_are_contiguous_and_backward_splits_at_the_sync(tmp_path: Path) -> None:
    rec = SpanRecorder(tmp_path / "rank0.jsonl", 0, torch.device("cpu"))
    for step in (1, 2):
        for _ in rec.timed(iter([0])):  # the data wait of one batch
            time.sleep(0.002)
            rec.section("forward")
            time.sleep(0.003)
            rec.section("backward")
            time.sleep(0.004)
            rec.presync()  # what the DDP comm hook calls at the last bucket
            time.sleep(0.005)
            rec.section("optimizer")
            time.sleep(0.001)
            rec.step_done(step)
            break
    with rec.span("checkpoint"):
        time.sleep(0.006)
    rec.close()
    recs = _records(tmp_path / "rank0.jsonl")
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    one = steps[1]
    h = one["host"]
    assert set(h) == {"log", "data", "forward", "backward", "grad_comm", "optimizer"}
    assert h["forward"] >= 3 and h["backward"] >= 4 and h["grad_comm"] >= 5
    # contiguous: the sections add up to the wall time
    assert abs(sum(h.values()) - one["wall_ms"]) < 0.05
    names = [s[0] for s in one["spans"]]
    assert names == ["log", "data", "forward", "backward", "grad_comm", "optimizer"]
    starts = [s[1] for s in one["spans"]]
    assert starts == sorted(starts)
    tail = [r for r in recs if r["kind"] == "tail"]
    assert tail and tail[0]["host"]["checkpoint"] >= 6


def test_disabled_recorder_writes_only_explicit_records(tmp_path: Path) -> None:
    rec = SpanRecorder(tmp_path / "rank0.jsonl", 0, torch.device("cpu"), enabled=False)
    rec.section("forward")
    rec.step_done(1)
    rec.record({"kind": "memory", "step": 1})
    rec.close()
    assert _records(tmp_path / "rank0.jsonl") == [{"kind": "memory", "step": 1}]


def test_sampler_without_nvml_writes_cpu_figures(tmp_path: Path) -> None:
    s = Sampler(tmp_path / "sampler-rank0.jsonl", 0, 10.0, None)
    time.sleep(0.35)
    s.close()
    recs = _records(tmp_path / "sampler-rank0.jsonl")
    assert len(recs) >= 2
    assert {"proc_cpu", "workers_cpu", "host_cpu", "rss_gib"} <= set(recs[-1]) and "util" not in recs[-1]
    # Not pinned: its cores are everyone's, no figure of its own; pinned (an xdist worker's slice of a big machine),
    # the figure of its own cores.
    pinned = len(os.sched_getaffinity(0)) < (os.cpu_count() or 0) if hasattr(os, "sched_getaffinity") else False
    assert ("cores_cpu" in recs[-1]) == pinned, (pinned, recs[-1])


def test_sampler_of_a_pinned_rank_says_how_busy_its_cores_are(tmp_path: Path) -> None:
    """Whoever uses them: the evidence of CPU contention on a straggler's cores."""
    import os

    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one core: pinning to fewer is impossible")
    os.sched_setaffinity(0, {min(before)})
    try:
        s = Sampler(tmp_path / "sampler-rank0.jsonl", 0, 10.0, None)
        time.sleep(0.35)
        s.close()
    finally:
        os.sched_setaffinity(0, before)
    rec = _records(tmp_path / "sampler-rank0.jsonl")[-1]
    assert rec["cores"] == 1 and 0.0 <= rec["cores_cpu"] <= 100.0


def test_throttle_reason_names() -> None:
    assert throttle_names(0x1 | 0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]


def test_inject_grammar_extensions() -> None:
    f = parse("data_stall:ms=50,every=4; slow:rank=1,factor=1.1")
    assert f[0].params == {"ms": "50", "every": "4"} and f[1].num("factor") == 1.1
    with pytest.raises(ConfigError, match="slow: bad parameter"):
        parse("slow:rank=1,speed=2")


class FakeNvml:
    """The NVML calls the sampler makes, answering like an H100 (GPM included)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_SM_UTIL = 1, 2

    class _S:
        def __init__(self, **kw) -> None:
            self.__dict__.update(kw)

    def nvmlGpmQueryDeviceSupport(self, h):  # noqa: N802, ANN001, ANN201
        return self._S(isSupportedDevice=1)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802, ANN001, ANN201
        return self._S(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802, ANN001, ANN201
        return self._S(used=60 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802, ANN001, ANN201
        return 612_000

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802, ANN001, ANN201
        return 1980 if kind == 1 else 2619

    def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802, ANN001, ANN201
        return 61

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802, ANN001, ANN201
        return 0x4

    def nvmlGpmSampleAlloc(self):  # noqa: N802, ANN201
        return object()

    def nvmlGpmSampleGet(self, h, s):  # noqa: N802, ANN001, ANN201
        return s

    def nvmlGpmSampleFree(self, s) -> None:  # noqa: N802, ANN001
        pass

    def c_nvmlGpmMetricsGet_t(self):  # noqa: N802, ANN201
        return self._S(metrics=[self._S(metricId=0, nvmlReturn=0, value=71.25)])

    def nvmlGpmMetricsGet(self, mg):  # noqa: N802, ANN001, ANN201
        return mg


def test_nvml_sample_fields() -> None:
    from musubi.telemetry.sampler import NvmlDevice

    dev = NvmlDevice(FakeNvml(), object(), 3)
    first, second = dev.read(), dev.read()
    assert "sm_active" not in first and first["util"] == 97  # GPM activity needs two samples
    assert second == {"gpu_index": 3, "util": 97, "mem_util": 40, "mem_used_gib": 60.0, "mem_total_gib": 80.0,
                      "power_w": 612.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temp_c": 61,
                      "throttle": ["sw_power_cap"], "sm_active": 71.25}


class ProcsNvml(FakeNvml):
    """FakeNvml whose GPU runs the given (pid, bytes) compute processes."""

    def __init__(self, procs: list[tuple[int, int | None]] | None) -> None:
        self.procs = procs

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802, ANN001, ANN201
        if self.procs is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [self._S(pid=pid, usedGpuMemory=used) for pid, used in self.procs]


@pytest.mark.parametrize(("procs", "want"), [
    ("alone", (0, 0)),
    ("hog", (1, 1094)),  # another process beside the rank (the bench's GPU hog: 1094 MiB)
    ("container", (1, 1094)),  # another pid namespace: the rank's pid is not listed, the largest is taken as it
    ("unsupported", None),  # NVML cannot list processes: no figure, not 0
])
def test_sampler_counts_other_processes_on_the_rank_gpu(tmp_path: Path, procs: str, want: tuple | None) -> None:
    from musubi.telemetry.sampler import NvmlDevice

    me, big, hog = os.getpid(), 20 * 2**30, 1094 * 2**20
    listed = {"alone": [(me, big)], "hog": [(me, big), (424242, hog)],
              "container": [(900001, big), (900002, hog)], "unsupported": None}[procs]
    s = Sampler(tmp_path / "sampler-rank0.jsonl", 0, 0.1, NvmlDevice(ProcsNvml(listed), object(), 0))
    try:
        rec = s.sample()
    finally:
        s.close(last_sample=False)
    assert (rec.get("gpu_others"), rec.get("gpu_others_mib")) == (want or (None, None))


def test_sampler_samples_soon_at_close_and_survives_a_failed_read(tmp_path: Path, monkeypatch) -> None:
    """A short run gets a first sample soon after start and one at close; one failed read is not the end."""
    s = Sampler(tmp_path / "sampler-rank0.jsonl", 0, 1.0, None)  # 1 Hz
    real, calls = s.sample, []

    def flaky() -> dict:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("psutil hiccup")
        return real()

    monkeypatch.setattr(s, "sample", flaky)
    time.sleep(2.8)  # samples at ~0.2 s, ~1.2 s (fails), ~2.2 s
    s.close()
    recs = _records(tmp_path / "sampler-rank0.jsonl")
    # 0.2 s, 2.2 s (the sampler went on after the failure) and the one at close
    assert len(calls) >= 4 and len(recs) == len(calls) - 1
