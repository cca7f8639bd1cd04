"""The recovery drill when saves go through DCP's checkpoint process (the GPU default): end to end, real torchrun.

Its own file (the drill of test_recovery_drill.py takes as long again), so that `make test`'s two workers,
which take a file at a time, can run the two drills side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from tests.recovery.conftest import DRILL_JOB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(540)]


def test_drill_with_dcp_checkpoint_process(tiny_job, tmp_path: Path, drill_reference: Path) -> None:
    """The same guarantees when saves go through DCP's checkpoint process (`async_mode: process`,
    the GPU default): a rank killed, and the writer killed in the daemon while it writes a shard.
    Compared with the session's shared reference, saved by threads: how saves are written must not
    change a single bit of the weights."""
    job = tiny_job(**{**DRILL_JOB, "checkpoint": {**DRILL_JOB["checkpoint"], "async_mode": "process"}})
    # Seed 5 draws phase=write for the writer kill: the daemon dies inside a shard.
    res = CliRunner().invoke(app, ["drill", str(job), "--faults", "kill,ckpt_kill", "--repeat", "1", "--nproc", "2", "--device", "cpu",
                                   "--out", str(tmp_path / "drill"), "--seed", "5", "--reference",
                                   str(drill_reference), "--json"])
    drill = json.loads((tmp_path / "drill" / "drill.json").read_text())
    assert res.exit_code == 0 and all(r["ok"] for r in drill["runs"]), (res.output, drill["runs"])
    assert drill["reference_reused"] and drill["reference"] == str(drill_reference / "reference" / "tiny")
    assert any("phase=write" in r["inject"] for r in drill["runs"])
    s = drill["summary"]
    assert s["kill"]["weights_equal"] == 1 and s["ckpt_kill"]["weights_equal"] == 1
    assert s["ckpt_kill"]["partial_loads"] == 0
    recs = [json.loads(line) for r in drill["runs"]
            for line in (Path(r["run"]) / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert {r["mode"] for r in recs if r.get("kind") == "checkpoint"} == {"process"}
