"""The span recorder on CPU: contiguous sections, the pre-sync split, records written off the hot path."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from musubi.config.errors import ConfigError
from musubi.runtime.inject import parse
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
    assert h["forward"] >= 3 and h["backward"] >= 4 and 5 <= h["grad_comm"] < 10
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


def test_throttle_reason_names() -> None:
    assert throttle_names(0x1 | 0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]


def test_inject_grammar_extensions() -> None:
    f = parse("data_stall:ms=50,every=4; slow:rank=1,factor=1.1")
    assert f[0].params == {"ms": "50", "every": "4"} and f[1].num("factor") == 1.1
    with pytest.raises(ConfigError, match="slow: bad parameter"):
        parse("slow:rank=1,speed=2")
