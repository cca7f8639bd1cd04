"""`musubi plan --calibrate RUN`: the runtime's plan.json plus the run's own measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.config.batch_plan import BatchPlan
from musubi.config.load import job_from_dict
from musubi.plan.calibrate import load_calibration
from musubi.plan.errors import PlanError
from musubi.plan.from_run import calibration_from_run, measured_step_time
from musubi.tasks.registry import build_task
from musubi.worker.plan_record import plan_record

GPT_JOB = {"name": "lm", "task": "lm", "model": "gpt", "model_args": {"layers": 4, "hidden": 512, "heads": 8},
           "data": {"synthetic": {"train_size": 512, "seq_len": 256, "vocab": 8000}},
           "train": {"batch": 8, "optimizer": "adamw", "lr": 1e-3, "strategy": "fsdp"}}


def _record(world: int = 4, device: str | None = "NVIDIA H200") -> dict:
    spec = job_from_dict(GPT_JOB)
    model = build_task(spec).plan_spec()
    return plan_record(spec, model, world, BatchPlan(8, 1, world, 1e-3), "bf16", device)


def test_plan_record_describes_the_job_as_the_runtime_runs_it() -> None:
    rec = _record()
    assert rec["layout"] == "dp=4,zero=3,micro=8,gather=node" and rec["global_batch"] == 32 and rec["gpu"] == "H200"
    assert rec["memory_precision"] == "amp" and rec["model"]["mlp"] == "gelu" and rec["model"]["tied_embeddings"]
    mem = rec["predicted"]["memory_gib"]
    # 4 layers x 12 x 512^2 + 8000 x 512 embedding + positions: ~17 M parameters, 16 bytes each over 4 shards
    assert 0.05 < mem["weights"] + mem["grads"] + mem["optimizer"] < 0.1
    assert rec["predicted"]["step_time_s"] > 0


def test_plan_record_on_cpu_ranks_has_memory_but_no_step_time() -> None:
    rec = _record(device=None)
    assert rec["gpu"] is None and "step_time_s" not in rec["predicted"] and rec["predicted"]["memory_gib"]


def _run_dir(tmp_path: Path, rates: list[float], busbw: float | None = 300.0) -> Path:
    job = tmp_path / "run" / "lm"
    job.mkdir(parents=True)
    (job / "plan.json").write_text(json.dumps(_record()))
    lines = [{"step": 5 * (i + 1), "kind": "train", "samples_per_s": r} for i, r in enumerate(rates)]
    lines.append({"step": 99, "kind": "val", "val_loss": 1.0})
    (job / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut")
    if busbw is not None:
        comm = {"backend": "nccl", "busbw_gbps": busbw, "correct": True}
        (tmp_path / "run" / "preflight.json").write_text(json.dumps(
            {"readings": {"comm": comm, "topology": {"links": {"0,1": "NV18"}}}}))
    return tmp_path / "run"


def test_calibration_from_a_run_reads_step_time_and_bandwidth(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [10.0, 320.0, 300.0, 340.0])  # the first record (warm-up) is skipped
    data = calibration_from_run(run)
    assert data["step_time_s"] == pytest.approx(32 / 320.0)
    assert data["allreduce_busbw_gbps"] == {"nvlink": 300.0} and data["layout"] == "dp=4,zero=3,micro=8,gather=node"
    eff, report = load_calibration(run)
    assert report["from_run"]["log_records"] == 3 and eff.step_scale > 0 and report["gpu"] == "H200"
    # Calibrated on its own run, the planner predicts that run's step time exactly.
    from musubi.plan.catalog import get_gpu
    from musubi.plan.cluster import make_cluster
    from musubi.plan.layout import parse_layout
    from musubi.plan.predict import predict
    from musubi.plan.spec import spec_from_dict

    pred = predict(spec_from_dict(data["model"]), make_cluster(get_gpu("H200"), 4, 1),
                   parse_layout(data["layout"]), 32, eff)
    assert pred.step_time_s == pytest.approx(32 / 320.0, rel=1e-6)


def test_calibrate_from_a_run_through_the_cli(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [10.0, 320.0, 320.0])
    res = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H200", "--gpus", "8",
                                   "--global-batch", "64", "--layout", "tp=1,dp=8,zero=3,micro=8",
                                   "--calibrate", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["calibration"]["from_run"]["job_dir"].endswith("lm") and out["calibration"]["nvlink"] > 0


@pytest.mark.parametrize("case, message", [
    ("no-plan", "no job of this run has plan.json"),
    ("one-record", "fewer than 2 training log records"),
    ("cpu", "which the GPU catalog lacks"),
])
def test_runs_that_cannot_calibrate_say_why(tmp_path: Path, case: str, message: str) -> None:
    run = _run_dir(tmp_path, [100.0] if case == "one-record" else [100.0, 100.0])
    if case == "no-plan":
        (run / "lm" / "plan.json").unlink()
    if case == "cpu":
        (run / "lm" / "plan.json").write_text(json.dumps(_record(device=None)))
    with pytest.raises(PlanError, match=message):
        load_calibration(run)
    res = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpu", "H200", "--gpus", "8",
                                   "--global-batch", "64", "--calibrate", str(run)])
    assert res.exit_code == 2 and message in res.output


def test_measured_step_time_needs_metrics(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no metrics.jsonl"):
        measured_step_time(tmp_path, 8)


def test_a_ddp_run_then_an_fsdp_run_calibrate_each_kind_of_layout(tmp_path: Path) -> None:
    from musubi.plan.calibrate import load_calibrations

    fsdp = _run_dir(tmp_path / "f", [1.0, 200.0, 200.0])  # _record() is an FSDP job: 32 / 200 s a step
    ddp_rec = {**_record(), "layout": "dp=4,zero=0,micro=8"}
    ddp = _run_dir(tmp_path / "d", [1.0, 320.0, 320.0])
    (ddp / "lm" / "plan.json").write_text(json.dumps(ddp_rec))
    alone, _ = load_calibrations([fsdp])
    assert alone.step_scale == alone.step_scale_sharded  # one sharded run: used for every layout
    both, report = load_calibrations([ddp, fsdp])
    assert both.scale_for(0) != both.scale_for(3) and both.scale_for(3) == alone.step_scale_sharded
    assert report["sources"] == [str(ddp / "lm"), str(fsdp / "lm")]
