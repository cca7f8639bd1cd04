"""The soak's console (bench/soak_job.Console), shared by one job's soak and the fleet's: one copy of the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.soak_job import Console


def test_a_line_is_timestamped_named_printed_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job, fleet = Console(tmp_path / "job.log", "job1"), Console(tmp_path / "fleet.log")
    job.say("fault 1: kill")
    fleet.say("launched 2 jobs")
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] job1: fault 1: kill\n", (tmp_path / "job.log").read_text())
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] launched 2 jobs\n", (tmp_path / "fleet.log").read_text())
    assert capsys.readouterr().out.splitlines()[0].endswith("] job1: fault 1: kill")
    Console(tmp_path / "job.log", "job1").say("again")  # a relaunch appends
    assert len((tmp_path / "job.log").read_text().splitlines()) == 2
