"""`musubi train`'s launcher never imports torch: the launch's checks that need it (the task's own checks, its
metrics, the model on the meta device, torch's side of the preflight) run in a child of the warm spare, which imports
torch for the ranks anyway (launch/task_checks.py). Their refusals read as they did when the launcher ran them itself:
the same one line and exit code with the spare as without it; a crash in a task's check is raised by the launcher as
before.

One fresh interpreter (no torch imported, as the `musubi` command starts) runs the cases through the CLI, in an order
that keeps torch out of it until the last: two refusals, one real 2-rank launch with the preflight on, a --resume of
it with another model, then the crash (read again in process, so torch is imported after it). The comparison side runs in pytest's process, which has torch:
there the launcher reads the task itself and starts no spare before the checks passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.contract.env import MUSUBI_WARM_SPARE
from tests.conftest import REPO, write_tiny_job

REFUSING = "tests.launch.refusing_task:make"

#: Each case: its job's changes, and what a refusal must say (None: the launch must succeed).
CASES: dict[str, dict] = {
    "task refuses": {"task": REFUSING, "model_args": {"refuse": "config"}},
    "metric not reported": {"checkpoint": {"keep_best": 1, "best_metric": "accuracy"}, "train": {"epochs": 1}},
    "trains": {"train": {"epochs": 1}},
    # --resume of the run "trains" made, with a model of another width: the checkpoint's signature refuses it
    "resume another model": {"train": {"epochs": 1}, "model_args": {"hidden": 64}},
    "task crashes": {"task": REFUSING, "model_args": {"refuse": "crash"}},
}
#: What a case adds to `musubi train JOB --nproc 2 --device cpu --out RUN`.
RESUME = ["--resume", "--allow-changes", "model_args"]

SCRIPT = """
import json, sys
from typer.testing import CliRunner
from musubi.cli import app
out = {}
for name, job, run, extra in json.loads(sys.argv[1]):
    res = CliRunner().invoke(app, ["train", job, "--nproc", "2", "--device", "cpu", "--out", run, *extra])
    out[name] = {"code": res.exit_code, "output": res.output, "torch": "torch" in sys.modules,
                 "exception": repr(res.exception) if res.exception is not None and res.exit_code not in (0, 2) else None}
print("RESULT " + json.dumps(out))
"""


def cli_train(job: Path, run: Path, *extra: str) -> tuple[int, str]:
    """`musubi train` in this process (torch imported: no spare before the checks passed)."""
    res = CliRunner().invoke(app, ["train", str(job), "--nproc", "2", "--device", "cpu", "--out", str(run), *extra])
    return res.exit_code, res.output


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    """The cases run in order by one fresh interpreter with the warm spare on; (folder, results by case)."""
    tmp = tmp_path_factory.mktemp("fresh")
    cases = []
    for name, changes in CASES.items():
        (tmp / name).mkdir()
        resume = name == "resume another model"
        cases.append([name, str(write_tiny_job(tmp / name, **changes)), str(tmp / ("trains" if resume else name) / "run"),
                      RESUME if resume else []])
    env = dict(os.environ, MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    env.pop(MUSUBI_WARM_SPARE, None)
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    yield tmp, json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_launcher_trains_without_importing_torch(fresh: tuple[Path, dict]) -> None:
    tmp, results = fresh
    trained = results["trains"]
    assert trained["code"] == 0, trained["output"]
    assert not any(r["torch"] for name, r in results.items() if name != "task crashes"), results
    logs = tmp / "trains" / "run" / "tiny" / "logs"
    spare_log = (logs / "spare.log").read_text()
    # the checks' child, then torchrun's agent and two ranks, all forked by the one spare; none fell back
    assert spare_log.count("musubi.launch.task_checks pid ") == 1 and spare_log.count("rank pid ") == 2, spare_log
    assert "warm spare not used" not in (logs / "torchrun.log").read_text()
    # the preflight judged the stack whose torch side the spare's child read, and the checkpoint size from the
    # parameter count of the model it built on the meta device
    import torch

    found = {r["check"]: r["found"] for r in json.loads((tmp / "trains" / "run" / "preflight.json").read_text())["results"]}
    assert found["stack"].startswith(f"torch {torch.__version__};") and "+1 checkpoints x " in found["disk"], found


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["task refuses", "metric not reported"])
def test_a_refusal_reads_the_same_with_and_without_the_spare(fresh: tuple[Path, dict], tmp_path: Path,
                                                             case: str) -> None:
    """One line, exit 2, nothing written, whether the spare's child or the launcher read the task."""
    tmp, results = fresh
    spared = results[case]
    code, out = cli_train(write_tiny_job(tmp_path, **CASES[case]), tmp_path / "run")
    assert (spared["code"], error_lines(spared["output"])) == (code, error_lines(out)) == (2, error_lines(out))
    assert len(error_lines(out)) == 1, out
    assert not (tmp / case / "run").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_resume_of_another_model_is_refused_alike(fresh: tuple[Path, dict], tmp_path: Path) -> None:
    """The spare's child builds the changed model on the meta device; the launcher compares its signature with the
    checkpoint's, with the line it always had (the comparison side: this process reads it, against the same run)."""
    tmp, results = fresh
    spared = results["resume another model"]
    run = tmp / "trains" / "run"
    job_json = (run / "tiny" / "job.json").read_text()
    code, out = cli_train(write_tiny_job(tmp_path, **CASES["resume another model"]), run, *RESUME)
    assert (spared["code"], error_lines(spared["output"])) == (code, error_lines(out))
    assert code == 2 and len(error_lines(out)) == 1 and "checkpoint is of another model" in out, out
    assert (run / "tiny" / "job.json").read_text() == job_json  # refused before anything was written


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_crash_in_a_tasks_check_is_raised_by_the_launcher_as_before(fresh: tuple[Path, dict], tmp_path: Path) -> None:
    """The spare's child cannot carry another exception's traceback: the launcher reads the task again itself and
    raises it there, as it did before the spare ran the checks."""
    tmp, results = fresh
    crashed = results["task crashes"]
    assert crashed["code"] == 1 and crashed["torch"], crashed
    assert "RuntimeError(\"the task's own check crashed\")" == crashed["exception"], crashed
    res = CliRunner().invoke(app, ["train", str(write_tiny_job(tmp_path, **CASES["task crashes"])), "--nproc", "2",
                                   "--device", "cpu", "--out", str(tmp_path / "run")])
    assert res.exit_code == 1 and repr(res.exception) == crashed["exception"]
    assert not (tmp / "task crashes" / "run").exists() and not (tmp_path / "run").exists()
