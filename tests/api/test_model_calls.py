"""`musubi.evaluate`, `musubi.export` and `musubi.load` on one small trained job (trained once for the module, in
process, saved with the runtime's own checkpointer), and their refusals: one line, keyword names, ConfigError."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import musubi
from musubi.contract.errors import ConfigError
from musubi.evaluate.python_api import Exported
from tests.evaluate.jobs import CLASSIFY, make_task_job

REPO = Path(__file__).resolve().parents[2]
IMAGE = np.zeros((32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ResNet-18 classification job on 32 px synthetic images, 2 steps, one committed checkpoint."""
    return make_task_job(tmp_path_factory.mktemp("runs") / "r1", CLASSIFY, steps=2, metrics={"top1": 0.5})


def test_evaluate_returns_the_eval_record(job: Path, tmp_path: Path) -> None:
    record = musubi.evaluate(job, device="cpu", runs=2, warmup=0, checkpoint="last")
    assert record == json.loads((job / "eval.json").read_text())  # what it returns is what it wrote
    assert record["fps"]["runs"] == 2 and record["fps"]["fps"] > 0 and record["metrics"] == {"top1": 0.5}
    assert record["checkpoint_step"] == 2


def test_export_onnx_and_pt_return_the_written_files(job: Path) -> None:
    onnx = musubi.export(job, checkpoint=2)
    assert isinstance(onnx, Exported) and onnx.format == "onnx" and onnx.step == 2
    assert onnx.path == job / "export" / "model.onnx" and onnx.path.is_file()
    assert json.loads(onnx.record_path.read_text())["sha256"] == onnx.record["sha256"]
    assert onnx.record["parity"]["ok"]
    pt = musubi.export(job, format="pt")
    assert pt.path == job / "export" / "model.pt" and pt.record_path == job / "export" / "weights.json"
    assert pt.record["tensors"] > 0 and pt.record["classes"] == ["class0", "class1", "class2", "class3"]


def test_load_gives_a_ready_model_that_predict_takes(job: Path) -> None:
    """A job, its ONNX and its .pt export load to the same classes and the same answer on one image."""
    musubi.export(job)
    musubi.export(job, format="pt")
    answers = []
    for model in (job, job / "export" / "model.onnx", job / "export" / "model.pt"):
        loaded = musubi.load(model, device="cpu")
        assert loaded.classes == ["class0", "class1", "class2", "class3"] and loaded.task == "classification"
        if model.suffix != ".onnx":
            assert loaded.model is not None and not loaded.model.training  # eval mode
        result = musubi.predict(loaded, IMAGE)
        answers.append((result.images[0].names, round(float(result.images[0].scores[0]), 3)))
    assert answers[0] == answers[1] == answers[2], answers


def test_bad_input_raises_one_line_with_keyword_names(job: Path, tmp_path: Path) -> None:
    cases = [
        (lambda: musubi.evaluate(tmp_path / "nope"), "nope: no such job directory"),
        (lambda: musubi.evaluate(job, checkpoint="bestest"),
         "checkpoint='bestest': give best, last or a step number (e.g. checkpoint=120)"),
        (lambda: musubi.evaluate(job, predictions=tmp_path), "predictions="),
        (lambda: musubi.export(job, format="tflite"), "format='tflite': use onnx or pt"),
        (lambda: musubi.export(job, exporter="x"), "exporter 'x': use auto, torchscript or dynamo"),
        (lambda: musubi.export(job, checkpoint=999), "999"),
        (lambda: musubi.load(job / "export" / "model.onnx", checkpoint="best"), "checkpoint=best: picks a job's"),
        (lambda: musubi.load(job, device="tpu"), "device 'tpu': not a device"),
        (lambda: musubi.load(tmp_path / "missing.pt"), "model="),
        (lambda: musubi.predict(musubi.load(job, device="cpu"), IMAGE, checkpoint="best"), "give them to musubi.load"),
    ]
    musubi.export(job)
    for call, expected in cases:
        with pytest.raises(ConfigError) as e:
            call()
        message = str(e.value)
        assert expected in message and "\n" not in message, message
        assert "--" not in message.split("`")[0], message  # a flag only inside a quoted command
    assert not (tmp_path / "nope").exists()


def test_musubi_evaluate_is_one_callable_name() -> None:
    """`musubi.evaluate` is the call (python_api.evaluate, a plain function) before and after a module of the
    package musubi.evaluate is imported, whichever comes first; the package is a plain module that keeps its
    modules and lazy names; importing either loads no torch."""
    code = ("import sys, types, inspect, {first}; import musubi; e = musubi.evaluate; "
            "assert 'torch' not in sys.modules; "
            "assert isinstance(e, types.FunctionType) and e.__module__ == 'musubi.evaluate.python_api'; "
            "assert 'checkpoint' in inspect.signature(e).parameters; "
            "import musubi.evaluate.job_eval; from musubi.evaluate import job_eval as j, leaderboard; "
            "from musubi.evaluate import build_leaderboard; "
            "assert musubi.evaluate is e and j.evaluate_job and build_leaderboard is leaderboard.build_leaderboard; "
            "assert type(sys.modules['musubi.evaluate']) is types.ModuleType; "
            "assert {{'evaluate', 'export', 'load'}} <= set(dir(musubi)); print('ok')")
    for first in ("musubi", "musubi.evaluate.leaderboard"):
        out = subprocess.run([sys.executable, "-c", code.format(first=first)], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.stdout.strip() == "ok", (first, out.stderr)


def test_no_code_reaches_the_evaluate_package_through_the_attribute() -> None:
    """`musubi.evaluate` is the call, so `import musubi.evaluate.X as Y` and monkeypatch's "musubi.evaluate.X.f"
    (both go through the attribute) fail at run time; `from musubi.evaluate import X` is the way."""
    bad = re.compile(r"^\s*import musubi\.evaluate\.\w+ as |[\"']musubi\.evaluate\.\w+\.\w+[\"']", re.M)
    hits = [f"{p.relative_to(REPO)}" for folder in ("musubi", "tests", "bench", "examples")
            for p in sorted((REPO / folder).rglob("*.py")) if bad.search(p.read_text(encoding="utf-8"))
            and p.name != "test_model_calls.py"]
    assert not hits, hits
