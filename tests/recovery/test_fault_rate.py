"""The job's own fault rate from its attempts' progress files, and the cadence plan the dry run shows."""

from __future__ import annotations

import json
from pathlib import Path

from musubi.config.job import CheckpointSpec
from musubi.recovery.fault_rate import cadence_plan, fault_history


def attempt(job_dir: Path, aid: str, t0: float, steps: int, end: bool, torn: bool = False) -> None:
    """A progress file as rank 0 writes it: start, one line per step, `end` when training finished."""
    d = job_dir / "progress"
    d.mkdir(parents=True, exist_ok=True)
    lines = [{"event": "start", "t": t0, "attempt": aid}] + [{"t": t0 + 1 + i, "step": i + 1} for i in range(steps)]
    if end:
        lines.append({"event": "end", "t": t0 + steps + 2, "step": steps})
    text = "".join(json.dumps(x) + "\n" for x in lines) + ('{"t": 99' if torn else "")
    (d / f"a{aid}.jsonl").write_text(text)


def test_faults_are_attempts_without_an_end(tmp_path: Path) -> None:
    attempt(tmp_path, "1.0", 1000.0, 30, end=False)  # killed after 30 s
    attempt(tmp_path, "1.1", 1040.0, 20, end=False, torn=True)  # a SIGKILL cut its last line: the one before counts
    attempt(tmp_path, "2.0", 1100.0, 10, end=True)  # a launch that finished
    attempt(tmp_path, "2.1", 1200.0, 5, end=False)  # the attempt running now: not a fault, its start kept
    h = fault_history(tmp_path, current="2.1")
    assert (h.faults, h.attempts, h.current_start) == (2, 3, 1200.0)
    assert h.exposure_s == 30 + 20 + 12
    assert fault_history(tmp_path).faults == 3  # seen from outside, the last one is an interruption too
    assert fault_history(tmp_path / "none").attempts == 0


def test_cadence_plan_names_the_rule_and_its_inputs(tmp_path: Path) -> None:
    assert cadence_plan(CheckpointSpec(every_steps=25), 2, None)["rule"] == "every 25 steps"
    assert cadence_plan(CheckpointSpec(), 2, None)["rule"] == "at the end of each epoch"
    assert "off" in cadence_plan(CheckpointSpec(enabled=False, every_steps="auto"), 2, None)["rule"]
    fresh = cadence_plan(CheckpointSpec(every_steps="auto"), 8, tmp_path / "new")
    assert fresh["mtbf_from"] == "prior" and fresh["mtbf_s"] == round(54 * 86_400 * 16_384 / 419 / 8, 1)
    assert "Llama 3" in fresh["rule"] and "for 8 rank(s)" in fresh["rule"] and "1800 s" in fresh["rule"]
    assert cadence_plan(CheckpointSpec(every_steps="auto", mtbf_s=600), 8, None)["mtbf_from"] == "checkpoint.mtbf_s"
    attempt(tmp_path, "1.0", 0.0, 60, end=False)
    attempt(tmp_path, "1.1", 100.0, 60, end=False)
    seen = cadence_plan(CheckpointSpec(every_steps="auto"), 2, tmp_path)
    assert (seen["faults"], seen["mtbf_s"]) == (2, 60.0) and "measured: 2 fault(s) in 120 s" in seen["rule"]
