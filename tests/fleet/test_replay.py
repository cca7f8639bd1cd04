"""The fleet simulator: a recorded fleet replayed by the packer, and the seed's fleet on paper."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.load import load_fleet
from musubi.fleet.replay import replay
from musubi.fleet.run import FleetRequest, plan_fleet
from tests.topology.recorded import FIXTURES, NVSWITCH8, PAIRS8, PCIE8

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
#: Real `musubi run`s of recorded-cpu-fleet.yaml on 2 CPU slots (5 jobs, one of them on both slots, one an
#: external program), their fleet.json as written: machine.overlap false, and true (the -overlap file).
RECORDED = DATA / "recorded-cpu-fleet.json"


@pytest.mark.parametrize("name", ["recorded-cpu-fleet.json", "recorded-cpu-fleet-overlap.json"])
def test_replay_reproduces_the_recorded_cpu_fleet(name: str) -> None:
    record = json.loads((DATA / name).read_text())
    r = replay(record, load_fleet(DATA / "recorded-cpu-fleet.yaml"))
    assert len(r.recorded) == 5 and r.devices == [0, 1]
    assert abs(r.error) <= 0.05, (r.simulated_s, r.recorded_s)
    # the same placements: every attempt on the slots it had, in the same order of starts
    got = {b.name: b.gpus for b in r.simulated}
    assert got == {b.name: b.gpus for b in r.recorded}


def test_replay_reproduces_the_demo_fleet_recorded_on_4_gpus() -> None:
    """examples/fleet-demo.yaml as the GPU tier ran it on 4x H200 (2026-11-26, 3e9311f): a 2-GPU job beside
    three 1-GPU jobs, the fourth started when the external one ended. Same makespan, same placements."""
    record = json.loads((DATA / "recorded-4xH200-demo-fleet.json").read_text())
    r = replay(record, load_fleet(REPO / "examples" / "fleet-demo.yaml"))
    assert len(r.recorded) == 4 and r.devices == [0, 1, 2, 3]
    assert abs(r.error) <= 0.05, (r.simulated_s, r.recorded_s)
    assert {b.name: b.gpus for b in r.simulated} == {b.name: b.gpus for b in r.recorded}


def test_replay_sees_a_fleet_that_did_not_follow_its_packer() -> None:
    # the second job could have started on the free slot at once, but started 50 s late: no packer does that
    record = {"fleet": "x", "jobs": {
        "a": {"history": [{"gpus": [0], "started": 0.0, "released": 100.0, "ended": 100.0}]},
        "b": {"history": [{"gpus": [1], "started": 50.0, "released": 100.0, "ended": 100.0}]}}}
    r = replay(record)
    assert r.recorded_s == 100.0 and r.simulated_s == 100.0  # b's 50 s fit in beside a
    late = {"fleet": "x", "jobs": {**record["jobs"], "b": {"history": [
        {"gpus": [1], "started": 50.0, "released": 150.0, "ended": 150.0}]}}}
    assert replay(late).error == pytest.approx(100.0 / 150.0 - 1)


def test_replay_command_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RECORDED, run / "fleet.json")
    res = CliRunner().invoke(app, ["run", str(DATA / "recorded-cpu-fleet.yaml"), "--dry-run", "--replay", str(run)])
    assert res.exit_code == 0, res.output
    assert "replay of 5 recorded attempt(s) on 2 GPUs" in res.output and "simulated:" in res.output
    res = CliRunner().invoke(app, ["run", str(REPO / "examples" / "fleet-demo.yaml"), "--dry-run", "--replay",
                                   str(run)])
    assert res.exit_code == 2 and "not 'demo-fleet'" in res.output, res.output
    res = CliRunner().invoke(app, ["run", str(DATA / "recorded-cpu-fleet.yaml"), "--replay", str(run)])
    assert res.exit_code == 2 and "goes with --dry-run" in res.output


@pytest.mark.parametrize("topology", [None, PCIE8, PAIRS8, NVSWITCH8])
def test_seed_fleet_on_8_gpus_on_paper(tmp_path: Path, topology: str | None) -> None:
    fleet = REPO / "examples" / "fleet-seed.yaml"
    if topology is not None:  # the recorded 8-GPU machines
        data = yaml.safe_load(fleet.read_text())
        data["machine"] = {"topology": str(FIXTURES / topology)}
        for job in data["jobs"]:  # scripts are found relative to the fleet file, which moves to tmp_path
            if "command" in job:
                job["command"] = [str(REPO / "examples" / job["command"][0]), *job["command"][1:]]
        fleet = tmp_path / "seed.yaml"
        fleet.write_text(yaml.safe_dump(data))
    lines = plan_fleet(FleetRequest(fleet_path=fleet, dry_run=True, gpus=8))
    text = "\n".join(lines)
    assert "fleet seed-fleet: 42 jobs on 8 GPUs" in text and "GPU 7 |" in text
    speedup = next(ln for ln in lines if ln.startswith("one job at a time"))
    over_a = float(speedup.split("-> ")[1].split("x")[0])
    assert over_a >= 7.2, speedup  # the target (the seed reached 5.4x)
    assert "yolonas-l-rgb on GPU" in text and all(  # YOLO-NAS never gets more than its one GPU
        "," not in ln.split(" on GPU ")[1].split()[0] for ln in lines if ln.startswith("at ") and "yolonas" in ln)
