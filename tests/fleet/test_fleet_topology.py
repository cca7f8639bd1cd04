"""A fleet placed by a recorded topology (CPU slots standing for its GPUs): decisions and reasons in fleet.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musubi.cli import app

from ..topology.recorded import FIXTURES, PAIRS8

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXTERNAL = '''
import json, os, pathlib
if os.environ.get("RANK", "0") == "0":
    d = pathlib.Path(os.environ["MUSUBI_JOB_DIR"])
    (d / "eval.json").write_text(json.dumps({"metrics": {"top1": 0.5}, "primary_metric": "top1"}))
'''


def test_single_gpu_job_leaves_the_nvlink_pair_and_the_decisions_are_logged(tmp_path: Path) -> None:
    (tmp_path / "ext.py").write_text(EXTERNAL)
    data = {"name": "berth", "machine": {"topology": str(FIXTURES / PAIRS8)},
            "leaderboard": {"export_top": 0},
            "jobs": [{"name": "solo", "command": ["ext.py"], "priority": 5},
                     {"name": "duo", "command": ["ext.py"], "gpus": 2, "launch": "torchrun"}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "fleet.yaml"), "--out", str(out), "--device", "cpu",
                                   "--cpu-slots", "3", "--no-check"])
    assert res.exit_code == 0, res.output
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    # slots 0,1 are an NVLink pair (NV4) in the recorded machine, 2 is half of the next pair
    assert jobs["solo"]["gpus"] == [2] and jobs["duo"]["gpus"] == [0, 1]
    assert "leaves 0,1 (NV4 (4 NVLinks)) for queued duo" in jobs["solo"]["placement"]
    assert jobs["duo"]["placement"] == "all free CPU slots; worst link NV4 (4 NVLinks)"
    # the placement and pinning decisions reach the console and RUN/fleet.log
    log = (out / "fleet.log").read_text()
    for text in (res.output, log):
        assert "fleet: placing by topology: 8 GPUs" in text or "placing by topology: 8 GPUs" in text
        assert "start solo on CPU slot 2 (attempt 1): 1 of free 0,1,2; leaves 0,1 (NV4 (4 NVLinks)) for queued duo" \
            in text
        assert "start duo on CPU slot 0,1 (attempt 1): all free CPU slots; worst link NV4 (4 NVLinks)" in text
        assert "cores per CPU slot" in text or "no CPU pinning" in text
    assert "done solo" in log and "done duo" in log  # the whole story in fleet.log, not only the decisions


def _refused(tmp_path: Path, topology: str) -> str:
    (tmp_path / "ext.py").write_text(EXTERNAL)
    data = {"name": "berth", "machine": {"topology": topology}, "leaderboard": {"export_top": 0},
            "jobs": [{"name": "solo", "command": ["ext.py"]}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "fleet.yaml"), "--out", str(out), "--device", "cpu",
                                   "--cpu-slots", "6", "--no-check"])
    assert res.exit_code == 2, res.output
    assert not out.exists(), "a refused run must leave nothing that blocks a re-run"
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    return res.output


def test_typo_in_machine_topology_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = _refused(tmp_path, "nope.txt")
    assert "machine.topology" in out and "nope.txt" in out and "cannot be read" in out


def test_env_json_without_topology_is_refused(tmp_path: Path) -> None:
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"host": "cpu-box", "python": "3.12", "torch": "2.8", "gpus": []}))
    out = _refused(tmp_path, str(env))
    assert "without a `topology`" in out and "nvidia-smi topo -m" in out


def test_topology_not_covering_every_device_is_refused(tmp_path: Path) -> None:
    out = _refused(tmp_path, str(FIXTURES / "nvlink4_all.txt"))  # 4 GPUs; the fleet has 6 slots
    assert "4,5 not in it" in out and "record" in out


def test_dry_run_prints_the_placement_plan_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "ext.py").write_text(EXTERNAL)
    data = {"name": "berth", "machine": {"topology": str(FIXTURES / "pcie8_two_switches.txt")},
            "leaderboard": {"export_top": 0},
            "jobs": [{"name": "a", "command": ["ext.py"], "gpus": 2, "priority": 1, "launch": "torchrun"},
                     {"name": "b", "command": ["ext.py"], "gpus": 4, "launch": "torchrun"},
                     {"name": "c", "command": ["ext.py"], "gpus": 4, "launch": "torchrun"}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "fleet.yaml"), "--out", str(out), "--device", "cpu",
                                   "--cpu-slots", "8", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "dry run: nothing started" in res.output and "from recorded:pcie8_two_switches.txt" in res.output
    assert "at 0 s: a on CPU slot 0,1 (predicted 60 s): best-linked 2" in res.output
    assert "at 0 s: b on CPU slot 4,5,6,7" in res.output and "at 60 s: c on CPU slot" in res.output
    assert "predicted makespan 120 s" in res.output and "CPU slot 7 |" in res.output  # the per-slot timeline
    assert not out.exists()
