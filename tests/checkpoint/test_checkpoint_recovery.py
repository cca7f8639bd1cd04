"""Checkpoints: partial or damaged ones are skipped; bad resumes fail with one line and destroy nothing."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from musubi.checkpoint.checkpoint import MARKER, committed_checkpoints, latest_checkpoint, verify
from musubi.launch.launch import prepare
from musubi.launch.request import TrainRequest
from tests.cli.helpers import one_line_error
from tests.conftest import write_tiny_job
from tests.support.runs import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


#: The module's one run: saves every 3 steps, the last 2 kept and the best 1 (keep_best's test reads them).
CHECKPOINT = {"every_steps": 3, "keep_last": 2, "keep_best": 1}


#: What the module's run said on the console (test_resume_before_the_first_checkpoint reads it).
CONSOLE: dict[str, str] = {}
EARLIER = "earlier attempt: stopped before its first checkpoint"


@pytest.fixture(scope="module")
def _trained_once(tmp_path_factory) -> Path:
    """One 2-rank run for the module (a torchrun launch costs seconds); tests get copies of it.

    It is the `--resume` of a run stopped before its first checkpoint (its launcher got as far as job.json, its
    rank 0 wrote a log line and a metrics record, as a preemption during start-up leaves it): it trains from step
    0 in the same folder, the same 16 steps a new run trains."""
    d = tmp_path_factory.mktemp("trained")
    job = write_tiny_job(d, checkpoint=CHECKPOINT)
    prepare(TrainRequest(job_path=job, nproc=2, out=d / "run", device="cpu", check=False, oversubscribe=True))
    (d / "run" / "tiny" / "logs").mkdir(parents=True, exist_ok=True)
    (d / "run" / "tiny" / "logs" / "rank0.log").write_text(EARLIER + "\n")
    (d / "run" / "tiny" / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 9.0, "kind": "train"}) + "\n")
    code, out = train(str(job), "--nproc", "2", "--out", str(d / "run"), "--resume")
    assert code == 0, out
    CONSOLE["out"] = out
    return d / "run"


def test_resume_before_the_first_checkpoint_starts_from_step_0(finished_run: Path) -> None:
    """A preempted run with no committed checkpoint goes on with the same --out: from step 0, nothing lost."""
    assert "no committed checkpoint" in CONSOLE["out"] and "starting from step 0 in this folder" in CONSOLE["out"]
    record = json.loads((finished_run / "job.json").read_text())
    assert record["from_start"] is True and record["resume"] is True and record["attempts"] == 2
    assert record["status"] == "done" and len(record["history"]) == 1
    log = (finished_run / "logs" / "rank0.log").read_text()
    assert log.startswith(EARLIER) and "no intact committed checkpoint" in log  # kept; then the rank said why
    steps = [json.loads(ln)["step"] for ln in (finished_run / "metrics.jsonl").read_text().splitlines()
             if json.loads(ln).get("kind") == "train"]
    assert steps == sorted(steps) and 9.0 not in [json.loads(ln).get("loss") for ln in
                                                  (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert [p.name for p in (finished_run / "progress").glob("a*.jsonl")] == ["a2.0.jsonl"]


@pytest.fixture
def finished_run(_trained_once: Path, tmp_path: Path) -> Path:
    """A 2-rank run of 16 steps (8 an epoch) with committed checkpoints at steps 15, 16 and the best: this
    test's own copy, so a test that damages, resumes or refuses it leaves the next one the same run."""
    shutil.copytree(_trained_once, tmp_path / "run", symlinks=True)
    return tmp_path / "run" / "tiny"


def test_partial_and_damaged_checkpoints_are_skipped(finished_run: Path, tiny_job, tmp_path: Path) -> None:
    root = finished_run / "checkpoints"
    assert [c.step for c in committed_checkpoints(root)][-2:] == [15, 16]
    # a save that died before its marker
    no_marker = root / "step-000000024"
    shutil.copytree(root / "step-000000016", no_marker)
    (no_marker / MARKER).unlink()
    # a committed save whose shard was truncated afterwards
    damaged = root / "step-000000032"
    shutil.copytree(root / "step-000000016", damaged)
    marker = json.loads((damaged / MARKER).read_text())
    marker["step"] = 32
    (damaged / MARKER).write_text(json.dumps(marker))
    shard = next(damaged.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    assert verify(no_marker) is None and verify(damaged) is None
    assert latest_checkpoint(root).step == 16
    # resume takes step 16 (a run recorded as stopped there: a finished one is reported without a launch)
    record = json.loads((finished_run / "job.json").read_text())
    (finished_run / "job.json").write_text(json.dumps({**record, "status": "stopped"}))
    code, out = train(str(tiny_job(checkpoint=CHECKPOINT)), "--nproc", "2", "--out", str(finished_run.parent),
                      "--resume")
    assert code == 0, out
    assert "resumed from step-000000016" in (finished_run / "logs" / "rank0.log").read_text()


def test_resume_with_nothing_to_resume(tiny_job, tmp_path: Path) -> None:
    code, out = train(str(tiny_job()), "--nproc", "2", "--out", str(tmp_path / "none"), "--resume")
    assert code == 2 and "nothing to resume" in out
    assert not (tmp_path / "none").exists()


def test_existing_run_is_never_overwritten(finished_run: Path, tiny_job) -> None:
    before = (finished_run / "metrics.jsonl").read_bytes()
    code, out = train(str(tiny_job(checkpoint=CHECKPOINT)), "--nproc", "2", "--out", str(finished_run.parent))
    assert code == 2 and "already holds a run" in out and "--resume" in out
    assert (finished_run / "metrics.jsonl").read_bytes() == before


def files_of(run: Path) -> dict[str, tuple[int, int]]:
    """Every file under `run` with its size and modification time: what a refusal must leave as it was."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run.rglob("*"))
            if p.is_file()}


def test_checkpoint_of_another_model_is_refused(finished_run: Path, tiny_job) -> None:
    """Refused by the launch (the changed job's model built on the meta device against the signature in the
    checkpoint's marker): before torchrun starts and before a byte is written; the dry run refuses the same."""
    before = files_of(finished_run.parent)
    for extra in ([], ["--dry-run"]):
        code, out = train(str(tiny_job(model_args={"hidden": 48}, checkpoint=CHECKPOINT)), "--nproc", "2", "--out",
                          str(finished_run.parent), "--resume", "--allow-changes", "model_args", *extra)
        assert code == 2 and "checkpoint is of another model" in one_line_error(out), out
        assert files_of(finished_run.parent) == before


def test_other_world_size_is_refused(finished_run: Path, tiny_job) -> None:
    """Refused by the launch from the checkpoint's marker (its world_size), before torchrun starts and before a
    byte is written; the dry run refuses the same."""
    record = json.loads((finished_run / "job.json").read_text())  # stopped, not finished: the checks decide
    (finished_run / "job.json").write_text(json.dumps({**record, "status": "stopped"}))
    before = files_of(finished_run.parent)
    for extra in ([], ["--dry-run"]):
        code, out = train(str(tiny_job(checkpoint=CHECKPOINT)), "--nproc", "1", "--out", str(finished_run.parent),
                          "--resume", *extra)
        line = one_line_error(out)
        assert code == 2 and "written by 2 ranks, this run has 1" in line and "use --nproc 2" in line, out
        assert files_of(finished_run.parent) == before


def test_keep_best_ranks_evaluated_weights_and_readers_verify_checksums(finished_run: Path, caplog) -> None:
    """keep_best keeps a checkpoint whose metric was measured on its own weights (saves at eval steps);
    evaluate/export's loader skips a checkpoint that fails its checksum for the previous good one."""
    from musubi.checkpoint.checkpoint import read_full_state
    from musubi.contract.errors import ConfigError
    from musubi.evaluate.model_io import load_job_model

    root = finished_run / "checkpoints"
    kept = committed_checkpoints(root)
    # validation runs at steps 8 and 16 only: every metric a marker carries is its own step's
    val_steps = {json.loads(ln)["step"] for ln in (root.parent / "metrics.jsonl").read_text().splitlines()
                 if json.loads(ln).get("kind") == "val"}
    assert val_steps == {8, 16}
    assert all(c.step in val_steps for c in kept if c.marker["metric"]), [(c.step, c.marker["metric"]) for c in kept]
    assert {c.step for c in kept if c.marker["metric"]} & val_steps and kept[-1].step == 16
    # the report's Reliability section lists every save's blocked and durable time
    from musubi.diagnose.page import _reliability

    section = _reliability(root.parent)
    assert "blocked (s)" in section and "to durable (s)" in section and "0 failure(s)" in section
    # one byte flipped in the newest checkpoint (same size): readers fall back to the previous good one
    assert [c.step for c in kept][-2:] == [15, 16], [c.step for c in kept]
    shard = next(kept[-1].path.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="not a committed, intact checkpoint"):
        read_full_state(kept[-1].path)
    with caplog.at_level(logging.WARNING, logger="musubi.checkpoint"):
        model = load_job_model(root.parent)
    assert model.step == 15
    assert any(str(kept[-1].path) in r.getMessage() and "checksum" in r.getMessage() for r in caplog.records)


def test_checkpoint_choice_best_last_and_step(finished_run: Path, tmp_path: Path) -> None:
    """`--checkpoint best|last|STEP` (evaluate, export, predict): best by the metric each marker recorded at its
    validation, a step by number; a missing one is one line that lists the committed steps."""
    from typer.testing import CliRunner

    from musubi.checkpoint.select import select_checkpoint
    from musubi.cli import app
    from musubi.contract.errors import ConfigError
    from musubi.evaluate.model_io import load_job_model

    root = finished_run / "checkpoints"
    kept = committed_checkpoints(root)
    scored = [c for c in kept if "acc" in c.marker["metric"]]
    assert scored, [(c.step, c.marker["metric"]) for c in kept]
    best = max(scored, key=lambda c: c.marker["metric"]["acc"])  # the tiny task's primary metric
    assert load_job_model(finished_run, "best").step == best.step
    assert load_job_model(finished_run, "last").step == 16 and load_job_model(finished_run, 15).step == 15
    assert json.loads((root / "step-000000016" / "state.json").read_text())["classes"] is None  # a user task: none
    res = CliRunner().invoke(app, ["export", str(finished_run), "--format", "pt", "--checkpoint", "best"])
    assert res.exit_code == 0 and f"step {best.step}" in res.output, res.output
    assert json.loads((finished_run / "export" / "weights.json").read_text())["step"] == best.step
    res = CliRunner().invoke(app, ["evaluate", str(finished_run), "--checkpoint", "15", "--device", "cpu",
                                   "--runs", "2", "--warmup", "0"])
    assert res.exit_code == 0, res.output
    assert json.loads((finished_run / "eval.json").read_text())["checkpoint_step"] == 15
    steps = ", ".join(str(c.step) for c in kept)
    for args, message in ((["export", str(finished_run), "--checkpoint", "3"], f"committed steps: {steps})"),
                          (["evaluate", str(finished_run), "--checkpoint", "newest"], "give best, last or a step")):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and message in res.output.replace("\n", ""), res.output
    for c in kept:  # markers without a validation metric: no best to choose
        marker = json.loads((c.path / MARKER).read_text())
        (c.path / MARKER).write_text(json.dumps({**marker, "metric": {}}))
    with pytest.raises(ConfigError, match=r"no checkpoint of tiny records a validation acc .*use --checkpoint "
                                          r"last or a step"):
        select_checkpoint(root, "best", "acc")
