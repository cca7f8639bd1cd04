"""Words that fit the machine: on CPU ranks the fleet's lines, the report and the start-up say CPU slots and
cores, never GPUs (issue 45); core lists are said as cores, not as bare numbers that read as counts."""

from __future__ import annotations

import json
from pathlib import Path

from musubi.diagnose.fleet_view import fleet_section
from musubi.fleet.machine import cores_text, describe_cpus, device_unit
from musubi.fleet.packer import Demand, Packer
from musubi.fleet.placement import choose
from musubi.store.startup import components, summary_line

MARKS = {"spawned": 0.0, "launcher": 3.0, "import": 6.0, "first_step": 12.0}


def test_the_devices_are_named_for_the_machine() -> None:
    assert (device_unit("cuda"), device_unit("cpu")) == ("GPU", "CPU slot")
    assert choose(None, [1, 0], 1, unit="CPU slot").reason == "no topology known: the lowest free CPU slots"
    assert choose(None, [1, 0], 2, unit="CPU slot").reason == "all free CPU slots"
    assert choose(None, [1, 0], 1).reason == "no topology known: the lowest free GPUs"
    packer = Packer([0, 1], [Demand("a", 1), Demand("b", 1)], unit="CPU slot")
    placed = packer.place()
    assert len(placed) == 2 and all("GPU" not in packer.reasons[d.name] for d, _ in placed), packer.reasons


def test_core_lists_read_as_cores_not_counts() -> None:
    # "cores per rank 0" read as zero cores: the ranks and their cores are said as such
    assert describe_cpus("0;1") == "rank 0 on core 0, rank 1 on core 1"
    assert describe_cpus("0-7;8-15") == "rank 0 on cores 0-7, rank 1 on cores 8-15"
    assert (cores_text("3"), cores_text("0,2")) == ("core 3", "cores 0,2")


def test_start_up_and_the_fleet_report_of_a_cpu_fleet_say_cpu_slots(tmp_path: Path) -> None:
    comp = components(MARKS)
    assert "12.0 s to the first step (12.0 s of it on the CPU slots)" in summary_line(comp, "CPU slot")
    record = {"fleet": "f", "device": "cpu", "jobs": {
        "a": {"history": [{"attempt": 1, "gpus": [0, 1], "started": 0.0, "released": 10.0, "ended": 11.0,
                           "outcome": "done"}], "startup": comp}}}
    (tmp_path / "fleet.json").write_text(json.dumps(record))
    html = fleet_section(tmp_path)
    assert ">CPU slot 0</text>" in html and ">CPU slot 1</text>" in html and "on 2 CPU slot(s)" in html
    assert "GPU" not in html, [ln for ln in html.splitlines() if "GPU" in ln]
    # a fleet.json of an older musubi (no `device`): its jobs' job.json say what they ran on
    del record["device"]
    (tmp_path / "fleet.json").write_text(json.dumps(record))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "job.json").write_text(json.dumps({"device": "cpu"}))
    assert ">CPU slot 0</text>" in fleet_section(tmp_path)
