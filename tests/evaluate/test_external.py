"""External jobs: eval.json validation (one-line errors naming file and field), FPS from model.onnx."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.contract.errors import ConfigError
from musubi.evaluate import build_leaderboard, evaluate_job
from musubi.evaluate.external import read_external_eval
from tests.evaluate.jobs import tiny_onnx


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_contract_defaults(tmp_path: Path) -> None:
    p = write(tmp_path / "eval.json", json.dumps({"metrics": {"map50": 0.4, "map": 0.2}, "fps": 87.5,
                                                  "notes": "kept"}))
    out = read_external_eval(p)
    assert out["primary_metric"] == "map50"
    assert out["fps"] == {"fps": 87.5}
    assert out["notes"] == "kept"
    single = write(tmp_path / "one.json", json.dumps({"metrics": {"dice": 0.7}}))
    assert read_external_eval(single)["primary_metric"] == "dice"


@pytest.mark.parametrize("content, field", [
    ("{not json", "not valid JSON (line 1"),
    ("[1, 2]", "the top level must be an object"),
    ('{"metric": {"map50": 0.5}}', "metrics is required"),
    ('{"metrics": {}}', "metrics:"),
    ('{"metrics": {"map50": "high"}}', "metrics.map50:"),
    ('{"metrics": {"map50": NaN}}', "metrics.map50:"),
    ('{"metrics": {"map50": true}}', "metrics.map50:"),
    ('{"metrics": {"a": 0.1, "b": 0.2}}', "primary_metric is required"),
    ('{"metrics": {"map50": 0.3}, "primary_metric": "top1"}', "primary_metric 'top1' is not a key"),
    ('{"metrics": {"map50": 0.3}, "fps": -1}', "fps.fps:"),
    ('{"metrics": {"map50": 0.3}, "fps": {"runtime": "trt"}}', "fps.fps is required"),
    ('{"metrics": {"map50": 0.3}, "input_shape": [1, 0]}', "input_shape: Input should be greater than or equal to 1"),
])
def test_bad_eval_json_is_one_line_naming_file_and_field(tmp_path: Path, content: str, field: str) -> None:
    p = write(tmp_path / "job" / "eval.json", content)
    with pytest.raises(ConfigError) as info:
        read_external_eval(p)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{p}:")
    assert field in message


def test_missing_and_oversized(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="eval.json: missing"):
        read_external_eval(tmp_path / "eval.json")
    big = write(tmp_path / "big.json", '{"metrics": {"a": 1}, "pad": "' + "x" * (1 << 20) + '"}')
    with pytest.raises(ConfigError, match="larger than"):
        read_external_eval(big)


def test_external_fps_reported_is_kept(tmp_path: Path) -> None:
    job = tmp_path / "run" / "ext"
    write(job / "eval.json", json.dumps({"metrics": {"map50": 0.5}, "fps": {"fps": 40.0, "device": "orin"}}))
    record = evaluate_job(job)
    assert record["kind"] == "external" and record["fps"]["fps"] == 40.0 and record["fps"]["device"] == "orin"
    assert record["fps"]["runtime"] == "reported by the external program"
    assert json.loads((job / "eval.json").read_text())["fps"]["fps"] == 40.0
    assert evaluate_job(job)["fps"]["fps"] == 40.0  # evaluating again changes nothing


def test_external_model_onnx_timed_when_no_fps(tmp_path: Path) -> None:
    job = tmp_path / "run" / "ext"
    write(job / "eval.json", json.dumps({"metrics": {"top1": 0.8}}))
    tiny_onnx(job / "model.onnx")
    record = evaluate_job(job, device="cpu", fps_runs=3, fps_warmup=1)
    assert record["fps"]["runtime"] == "onnxruntime-cpu" and record["fps"]["runs"] == 3
    assert record["fps"]["input_shape"] == [1, 4]
    row = build_leaderboard(tmp_path / "run")[0]
    assert row["rank"] == 1 and row["kind"] == "external" and row["metric"] == "top1"


def test_external_without_fps_is_unranked_with_reason(tmp_path: Path) -> None:
    job = tmp_path / "run" / "ext"
    write(job / "eval.json", json.dumps({"metrics": {"map50": 0.5}}))
    record = evaluate_job(job)
    assert "reported no fps and wrote no model.onnx" in record["fps_missing"]
    row = build_leaderboard(tmp_path / "run")[0]
    assert row["rank"] is None and "reported no fps" in row["reason"]


def test_external_bad_eval_fails_the_step(tmp_path: Path) -> None:
    job = tmp_path / "run" / "ext"
    write(job / "eval.json", json.dumps({"metrics": {"map50": "n/a"}}))
    with pytest.raises(ConfigError, match=r"eval.json: metrics.map50"):
        evaluate_job(job)
    with pytest.raises(ConfigError, match="no such job directory"):
        evaluate_job(tmp_path / "nope")


def test_export_of_an_external_job_says_where_its_model_is(tmp_path: Path) -> None:
    """`musubi export RUN/JOB` of an external job: no job.json to name; where its model is, or how to get one."""
    from musubi.evaluate.onnx_export import export_job

    job = tmp_path / "run" / "ext"
    write(job / "eval.json", json.dumps({"metrics": {"map50": 0.5}}))
    with pytest.raises(ConfigError) as info:
        export_job(job)
    said = str(info.value)
    assert "job.json" not in said and "an external job with no model.onnx" in said and "metrics_from: ultralytics" \
        in said
    tiny_onnx(job / "model.onnx")
    with pytest.raises(ConfigError, match=f"its model is already ONNX: {job / 'model.onnx'}"):
        export_job(job)
    with pytest.raises(ConfigError, match="no such job directory"):
        export_job(tmp_path / "run" / "nope")
