"""Scale-out fields of a fleet: nodes, after (dependencies), Slurm resources; refused where they cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.load import load_fleet
from musubi.contract.errors import ConfigError
from musubi.fleet.packer import Demand, Packer
from tests.fleet.test_fleet_config import tiny_fleet, write


@pytest.mark.parametrize(("jobs", "message"), [
    ([{"name": "a", "after": ["zz"]}], "after: 'zz' is no other job of this fleet"),
    ([{"name": "a", "after": ["a"]}], "after: 'a' is no other job of this fleet"),
    ([{"name": "a", "after": ["b"]}, {"name": "b", "after": ["a"]}], "wait for each other \\(a cycle\\); break it"),
    ([{"name": "x", "command": ["true"], "nodes": 2}], "external commands run on one node"),
    ([{"name": "a", "nodes": 0}], "nodes"),
])
def test_bad_scaleout_fields_are_refused(tmp_path: Path, jobs: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_fleet(write(tmp_path, tiny_fleet(jobs=jobs)))


def test_multi_node_job_needs_slurm_and_slurm_needs_its_commands(tmp_path: Path, monkeypatch) -> None:
    fleet = write(tmp_path, tiny_fleet(jobs=[{"name": "a", "nodes": 2}]))
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(tmp_path / "r"), "--no-check"])
    assert res.exit_code == 2 and "job 'a' asks for nodes: 2; the local executor has one machine" in res.output
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(tmp_path / "r"), "--executor", "slurm"])
    assert res.exit_code == 2 and "--executor slurm: sbatch not found on PATH" in res.output
    assert not (tmp_path / "r").exists()
    res = CliRunner().invoke(app, ["run", str(fleet), "--out", str(tmp_path / "r"), "--executor", "k8s"])
    assert res.exit_code == 2 and "--executor k8s: use local (this machine) or slurm" in res.output


def test_local_packer_starts_a_job_after_its_dependencies() -> None:
    p = Packer([0, 1, 2], [Demand("train", 1), Demand("report", 1, after=("train",)),
                           Demand("late", 1, after=("report",))])
    assert [d.name for d, _ in p.place()] == ["train"]  # free GPUs stay free until "train" ended well
    p.release("train")
    p.done.add("train")
    assert [d.name for d, _ in p.place()] == ["report"]
    # a dependency that failed for good takes its dependents (and theirs) out of the queue
    q = Packer([0], [Demand("a", 1), Demand("b", 1, after=("a",)), Demand("c", 1, after=("b",))])
    q.place()
    assert q.drop_dependents("a") == ["b", "c"] and not q.queue
