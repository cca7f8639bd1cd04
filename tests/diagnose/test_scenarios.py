"""The scenario suite end to end: real torchrun + gloo ranks, faults through MUSUBI_INJECT, diagnosis.

CI runs one run each of healthy, data stall, 10 %-slow rank and checkpoint stall (the 30 %-slow rank is
covered by synthetic records in test_classify.py); `MUSUBI_DRILLS=healthy,data_stall,slow_1.1,slow_1.3,ckpt_stall
MUSUBI_DRILL_RUNS=10`
runs the issue's full suite (or `python bench/telemetry.py --cpu --runs 10`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from musubi.diagnose import drills
from musubi.diagnose.report import build_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAMES = os.environ.get("MUSUBI_DRILLS", "healthy,data_stall,slow_1.1,ckpt_stall").split(",")
RUNS = int(os.environ.get("MUSUBI_DRILL_RUNS", "1"))


def test_scenarios_get_the_right_label(tmp_path: Path) -> None:
    job = tmp_path / "drill.yaml"
    job.write_text(yaml.safe_dump(drills.CPU_DRILL_JOB), encoding="utf-8")
    rows = drills.run_suite(job, NAMES, RUNS, 2, "cpu", 60, drills.CPU_STEP_MS, tmp_path / "suite", keep=True)
    for r in rows:
        assert r["ok"], r
        assert r["coverage_min"] >= 0.95, r  # the spans cover each step's wall time
        if "flagged_at" in r:
            assert r["flagged_in_time"], r
        else:
            assert not r["false_straggler"], r
    if "slow_1.1" in NAMES:
        run = tmp_path / "suite" / "slow_1.1-0"
        log = (run / "drill" / "logs" / "rank0.log").read_text(encoding="utf-8")
        assert "straggler: rank 1" in log and "backward" in log  # the live flag names rank and section
        other = (run / "drill" / "logs" / "rank1.log").read_text(encoding="utf-8")
        assert "straggler: rank" not in other and "straggler now" not in other  # the watch is rank 0's alone
        page = Path(build_report(run)["html"]).read_text(encoding="utf-8")
        assert 'data-label="straggler"' in page and page.count("<svg") >= 5
