"""Bringing one's own model and data (issue 45): a user task needs no `model:` and no `data:` (a built-in one is
refused in one line without them); the dry run, the console and summary.json describe the task's own data; the
shipped example (examples/own_model/) trains end to end on 2 gloo ranks and holds its stated floor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.job import JobSpec
from musubi.config.load import load_job
from musubi.contract.errors import ConfigError
from musubi.tasks.data_line import data_record, describe_data
from tests.conftest import REPO
from tests.recipes.floors import FLOORS

EXAMPLE = "examples/own_model/job.yaml"
TASK = "examples.own_model.spirals:make"
OWN_DATA = f"data: the task's own ({TASK}): 3072 train / 768 val samples"


def _job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "said"), [
    ("name: a\ntask: classification\ndata: {synthetic: {}}\n",
     "model: task classification needs a model name, e.g. model: resnet18; only a user task "
     "(`module:function`) builds its own (got None)"),
    ("name: a\ntask: lm\nmodel: gpt\n",
     "data: task lm needs a source: data.synthetic or data.train (+ data.val); only a user task "
     "(`module:function`) reads its own (got None)"),
    ("name: a\ntask: detection\nmodel: fcos_resnet50_fpn\ndata: {workers: 1}\n",
     "data: task detection needs a source"),
])
def test_a_built_in_task_without_model_or_data_is_refused_in_one_line(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(_job(tmp_path, text))
    assert str(e.value).startswith(f"{tmp_path / 'job.yaml'}: {said}"), str(e.value)
    assert "\n" not in str(e.value)


def test_a_user_task_needs_neither(tmp_path: Path) -> None:
    spec = load_job(REPO / EXAMPLE)
    assert spec.model is None and spec.own_data and not spec.builtin
    assert spec.data.synthetic is None and spec.data.train is None and spec.data.workers is None
    # the loader's fields alone are no data source either: still the task's own data
    spec = load_job(_job(tmp_path, f"name: a\ntask: {TASK}\ndata: {{workers: 0}}\n"))
    assert spec.own_data and spec.data.workers == 0 and spec.model_label() == "the task's own model"
    # a user task that reads a synthetic section is described by it
    tiny = JobSpec.model_validate({"name": "t", "task": "tests.support.tiny_task:make",
                                   "data": {"synthetic": {"train_size": 64, "val_size": 16}}})
    assert not tiny.own_data and describe_data(tiny) == "synthetic: 64 train / 16 val samples"


def test_the_data_line_says_the_tasks_sizes_or_who_provides_them() -> None:
    own = JobSpec.model_validate({"name": "a", "task": TASK})
    assert describe_data(own) == OWN_DATA.removeprefix("data: ")  # Spirals.data_sizes()
    silent = JobSpec.model_validate({"name": "t", "task": "tests.support.tiny_task:make"})
    assert describe_data(silent) == "provided by task tests.support.tiny_task:make"  # no data_sizes()
    assert describe_data(silent, {"train": 40, "val": 8}) == \
        "the task's own (tests.support.tiny_task:make): 40 train / 8 val samples"  # as the ranks counted them
    assert data_record(silent, 40, 8) == {"source": "task", "train": 40, "val": 8,
                                          "said": "the task's own (tests.support.tiny_task:make): 40 train / 8 "
                                                  "val samples"}
    files = JobSpec.model_validate({"name": "c", "task": "classification", "model": "resnet18",
                                    "data": {"train": {"path": "data/train"}}})
    assert describe_data(files) == "train data/train; val -" and data_record(files, 96, None)["source"] == "files"


def test_the_dry_run_describes_the_tasks_own_data(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["train", EXAMPLE, "--dry-run", "--no-check", "--nproc", "2", "--out",
                                   str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert f"job own-model: task {TASK}, its own model" in res.output
    assert OWN_DATA in res.output and "synthetic" not in res.output
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """The shipped example as a user runs it, once for every assertion below: 2 gloo CPU ranks from the root."""
    out = tmp_path_factory.mktemp("own") / "run"
    log = out.parent / "console.log"
    env = {**os.environ, "MUSUBI_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    with open(log, "w") as f:  # a file, not a pipe: no process left holding it can stall the test
        code = subprocess.run([sys.executable, "-m", "musubi.cli", "train", EXAMPLE, "--nproc", "2", "--out",
                               str(out)], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=500).returncode
    return code, log.read_text(), out / "own-model"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_example_reaches_its_floor(example_run: tuple[int, str, Path]) -> None:
    code, console, job = example_run
    assert code == 0, console[-4000:]
    acc = json.loads((job / "eval.json").read_text())["metrics"]["acc"]
    floor = FLOORS["own-model"]
    assert acc >= floor.floor, f"own-model acc {acc} < its floor {floor.floor}: {console[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_task_without_model_and_data_sections_trains_end_to_end(example_run: tuple[int, str, Path]) -> None:
    """No dummies: the recorded job has no model and no data source; the console and summary.json say whose
    data it was and how many samples the ranks counted; the loss's named parts reach metrics.jsonl."""
    code, console, job = example_run
    assert code == 0, console[-4000:]
    config = json.loads((job / "job.json").read_text())["config"]
    assert config["model"] is None and config["data"]["synthetic"] is None and config["data"]["train"] is None
    assert OWN_DATA in console and "synthetic" not in console
    summary = json.loads((job / "summary.json").read_text())
    assert summary["data"] == {"source": "task", "train": 3072, "val": 768, "said": OWN_DATA.removeprefix("data: ")}
    train = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert train and all({"loss_ce", "loss_radius"} <= set(r) for r in train)
    assert "oversubscribe" not in console  # the default loader workers fit the rank's core
