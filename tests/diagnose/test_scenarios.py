"""The scenario suite end to end: real torchrun + gloo ranks, faults through MUSUBI_INJECT, diagnosis.

CI runs one run each of healthy, data stall, 10 %-slow rank and checkpoint stall (the 30 %-slow rank is
covered by synthetic records in test_classify.py); `MUSUBI_DRILLS=healthy,data_stall,slow_1.1,slow_1.3,ckpt_stall
MUSUBI_DRILL_RUNS=10`
runs the issue's full suite (or `python bench/telemetry.py --cpu --runs 10`). Each drill is `musubi train` through
the CLI in this process (what `drills.train_once` runs as a subprocess, whose launcher imported torch again:
~4-7 s of CPU a drill on the 2-core machine); the ranks are real torchrun processes either way.

A loaded machine's noise can reach a 10 %-slow rank's excess (the GPU machine's 8 xdist workers before each had
cores of its own: healthy steps of 95 ms, the slow run's 205 ms, for 33 ms idle); the detector then rightly names
no one. Such a drill is judged against the noise the healthy run beside it measured (`slow_rank_against_noise`):
right only where that noise could not decide a rank 10 % slower, and the slowdown still shows in the telemetry.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from musubi.contract.env import MUSUBI_INJECT
from musubi.diagnose import drills
from musubi.diagnose.report import build_report
from tests.diagnose.noise import slow_rank_against_noise

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAMES = os.environ.get("MUSUBI_DRILLS", "healthy,data_stall,slow_1.1,ckpt_stall").split(",")
RUNS = int(os.environ.get("MUSUBI_DRILL_RUNS", "1"))

def test_scenarios_get_the_right_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def train_in_process(job: Path, out: Path, nproc: int, device: str, steps: int, inject: str,
                         sets: tuple[str, ...]) -> tuple[Path, float]:
        monkeypatch.setenv(MUSUBI_INJECT, inject)
        t0 = time.perf_counter()
        res = CliRunner().invoke(app, drills.train_args(job, out, nproc, device, steps, sets))
        if res.exit_code != 0:
            raise RuntimeError(f"musubi train failed ({res.exit_code}): {res.output[-2500:]}")
        return drills.job_folder(out), time.perf_counter() - t0

    job = tmp_path / "drill.yaml"
    job.write_text(yaml.safe_dump(drills.CPU_DRILL_JOB), encoding="utf-8")
    work = tmp_path / "suite"
    rows = drills.run_suite(job, NAMES, RUNS, 2, "cpu", 60, drills.CPU_STEP_MS, work, keep=True,
                            train=train_in_process)
    threshold = drills.CPU_DRILL_JOB["telemetry"]["straggler_threshold"]
    flagged_slow = []
    for r in rows:
        if "flagged_at" in r and not (r["ok"] and r["flagged_in_time"]) and "healthy" in NAMES:
            # On a machine too loaded to tell a rank 10 % slower from its noise, the detector rightly names no
            # one (or names it late): asserted against the noise the healthy run beside it measured.
            right, figures = slow_rank_against_noise(r, drills.job_folder(work / f"healthy-{r['run']}"),
                                                     drills.job_folder(work / f"{r['scenario']}-{r['run']}"),
                                                     threshold)
            print(json.dumps({"scenario": r["scenario"], "run": r["run"], "not flagged, against the noise": figures}))
            assert right, (r, figures)
            continue
        flagged_slow += [r] if "flagged_at" in r else []
        assert r["ok"], r
        assert r["coverage_min"] >= 0.95, r  # the spans cover each step's wall time
        if "flagged_at" in r:
            assert r["flagged_in_time"], r
        else:
            assert not r["false_straggler"], r
    if any(r["scenario"] == "slow_1.1" and r["run"] == 0 for r in flagged_slow):
        run = work / "slow_1.1-0"
        log = (run / "drill" / "logs" / "rank0.log").read_text(encoding="utf-8")
        assert "straggler: rank 1" in log and "backward" in log  # the live flag names rank and section
        other = (run / "drill" / "logs" / "rank1.log").read_text(encoding="utf-8")
        assert "straggler: rank" not in other and "straggler now" not in other  # the watch is rank 0's alone
        page = Path(build_report(run)["html"]).read_text(encoding="utf-8")
        assert 'data-label="straggler"' in page and page.count("<svg") >= 5
    if "data_stall" in NAMES:
        # Through the real loop, step by step on each rank: the injected stall is recorded as the wait for the
        # batch (`data`), not as the host-to-device copy (`h2d`).
        stall_ms = float(drills.SCENARIOS["data_stall"].inject(drills.CPU_STEP_MS).split("ms=")[1])
        teles = sorted((work / "data_stall-0").glob("*/telemetry/rank*.jsonl"))
        assert len(teles) == 2, teles
        for tele in teles:
            steps = [r for r in map(json.loads, tele.read_text().splitlines()) if r.get("kind") == "step"
                     and r["step"] > 1]
            assert steps, tele
            for r in steps:
                assert r["host"].get("data", 0.0) >= stall_ms - 5 and r["host"].get("h2d", 0.0) < 30.0, r["host"]
