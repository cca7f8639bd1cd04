"""`musubi check` through typer on this machine: CPU ranks pass, asking for a GPU that is not there fails."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from musubi.cli.check import check_command

app = typer.Typer(add_completion=False)
app.command("check")(check_command)


@app.command("other")
def _other() -> None:  # a second command, so `check` is a sub-command as in musubi.cli
    """Unused."""


def invoke(*args: str):
    return CliRunner().invoke(app, ["check", *args])


def _lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


def test_cpu_machine_passes_one_line_per_result_and_writes_preflight_json(tmp_path: Path) -> None:
    res = invoke("--out", str(tmp_path / "run"))  # the whole check, gloo all-reduce included
    assert res.exit_code == 0, res.output
    lines = _lines(res.output)
    assert all(ln.split()[0] in {"PASS", "WARN", "FAIL"} for ln in lines[:-1])
    assert any("CPU ranks on gloo" in ln for ln in lines) and lines[-1].startswith("preflight passed:")
    saved = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert saved["ok"] is True and saved["readings"]["mode"] == "cpu"
    comm = saved["readings"]["comm"]  # the real probe: a torchrun of 2 gloo ranks
    assert comm["backend"] == "gloo" and comm["correct"] is True and comm["launcher"] == "torchrun"
    assert comm["error"] is None and not comm["timed_out"] and comm["ranks"] == 2 and comm["nbytes"] == 4 << 20
    assert comm["seconds"] and comm["seconds"] > 0 and comm["busbw_gbps"] and comm["busbw_gbps"] > 0
    (said,) = [r for r in saved["results"] if r["check"] == "comm"]
    assert said["status"] == "PASS" and said["found"].startswith("gloo all-reduce over 2 CPU ranks: 4 MiB in ")
    assert f"PASS comm: {said['found']}" in lines
    assert {r["check"] for r in saved["results"]} >= {"stack", "gpus.present", "binding", "comm", "disk", "env"}


def test_asking_for_a_gpu_on_a_gpu_less_machine_fails_with_exit_1() -> None:
    res = invoke("--gpu-ids", "0", "--no-comm", "--json")
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    failed = {r["check"]: r for r in report["results"] if r["status"] == "FAIL"}
    assert report["ok"] is False
    if not report["readings"]["nvml"]["available"]:  # no driver here; on a GPU host only the binding fails
        assert failed["gpus.present"]["found"].startswith("--gpu-ids 0 asks for GPUs but no NVIDIA GPU is reachable")
    # conftest hides GPUs (CUDA_VISIBLE_DEVICES=''): the binding check names that too.
    assert failed["binding.visible"]["found"] == "CUDA_VISIBLE_DEVICES='' hides every GPU but --gpu-ids asks for 0"


def test_bad_gpus_spelling_is_a_usage_error() -> None:
    res = invoke("--gpu-ids", "0,one")
    assert res.exit_code == 2 and "'one' is not a GPU number" in res.output


def test_gpus_is_a_count_and_its_old_list_form_names_the_flag_that_takes_a_list() -> None:
    """One dialect: --gpus N is a count in check, run and plan; a list goes to --gpu-ids."""
    res = invoke("--gpus", "0,1")
    lines = _lines(res.output)
    assert res.exit_code == 2 and len(lines) == 1 and "use --gpu-ids 0,1" in lines[0], res.output
    res = invoke("--gpus", "1", "--no-comm", "--json")  # the first GPU: none here, so the check fails (exit 1)
    assert res.exit_code == 1 and json.loads(res.output)["ok"] is False


def test_bad_data_fails_the_check(tmp_path: Path) -> None:
    res = invoke("--no-comm", "--data", str(tmp_path / "missing.json"))
    assert res.exit_code == 1
    assert f"FAIL data.missing: {tmp_path / 'missing.json'}: no such file or directory" in res.output
