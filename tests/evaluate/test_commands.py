"""The typer commands (mounted on a test app as cli.py mounts them): output, exit codes, hostile strings."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from musubi.cli.evaluate import evaluate_command, export_command, leaderboard_command, registry_app
from tests.evaluate.jobs import TINY_USER, make_task_job, tiny_onnx
from tests.evaluate.runs import external_job, task_job

app = typer.Typer()
app.command("leaderboard")(leaderboard_command)
app.command("export")(export_command)
app.command("evaluate")(evaluate_command)
app.add_typer(registry_app, name="registry")

HOSTILE = "[bold red]evil[/bold red]<script>"


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    return res.exit_code, res.output


def test_leaderboard_table_and_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "alpha", metrics={"map50": 0.5}, fps=10.0)
    task_job(run, "beta", metrics={"map50": 0.25}, fps=20.0)
    code, out = invoke("leaderboard", str(run))
    assert code == 0, out
    assert "score = 0.7 x quality + 0.3 x fps_norm" in out and "alpha" in out and "beta" in out
    code, out = invoke("leaderboard", str(run), "--json", "--weights", "0.5,0.5", "--fps-target", "40")
    board = json.loads(out)
    assert board["weights"] == {"quality": 0.5, "fps": 0.5} and board["fps_target"] == 40.0
    assert [r["job"] for r in board["rows"]] == ["alpha", "beta"]


def test_hostile_strings_print_verbatim(tmp_path: Path) -> None:
    run = tmp_path / "run"
    external_job(run, "ext-x", {"metrics": {HOSTILE: 0.5}, "primary_metric": HOSTILE, "fps": {"fps": 5.0}})
    external_job(run, "ext-y", {"metrics": {"map50": 0.5}, "fps_missing": f"{HOSTILE} [link=http://x]y[/link]"})
    code, out = invoke("leaderboard", str(run))
    assert code == 0, out
    assert HOSTILE in out  # markup shown as text, not interpreted (nor stripped)
    assert "[link=http://x]y[/link]" in out


def test_bad_input_exit_codes(tmp_path: Path) -> None:
    code, out = invoke("leaderboard", str(tmp_path / "missing"))
    assert code == 2 and "error:" in out and "no such run directory" in out
    code, out = invoke("leaderboard", str(tmp_path), "--weights", "0.7")
    assert code == 2 and "--weights '0.7'" in out
    code, out = invoke("export", str(tmp_path / "nope"))
    assert code == 2 and out.strip() == f"error: {tmp_path / 'nope'}: no such job directory; give RUN/JOB of a run"
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "job.json").write_text(json.dumps({"status": "done"}))  # a record without its config
    code, out = invoke("export", str(tmp_path / "bare"))
    assert code == 2 and "job.json: no job config (key 'config')" in out, out
    code, out = invoke("export", str(tmp_path), "--format", "tflite")
    assert code == 2 and "use onnx or pt" in out


def test_export_evaluate_and_registry_commands(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    job = make_task_job(run, TINY_USER, steps=1, metrics={"acc": 0.5})
    code, out = invoke("export", str(job))
    assert code == 0 and "parity ok" in out and "opset 17" in out, out
    code, out = invoke("evaluate", str(job), "--device", "cpu", "--runs", "2", "--warmup", "0")
    assert code == 0 and "fps (torch-cpu" in out, out
    db = str(tmp_path / "runs" / "musubi.db")
    code, out = invoke("registry", "register", str(job))
    assert code == 0 and "registered mlp-tiny v1" in out, out
    code, out = invoke("registry", "list", "--db", db, "--json")
    assert [e["version"] for e in json.loads(out)] == [1]
    code, out = invoke("registry", "promote", "mlp-tiny", "1", "--db", db)
    assert code == 0 and "lists 1 model(s)" in out, out
    manifest = json.loads((tmp_path / "runs" / "manifest.json").read_text())
    assert manifest["models"][0]["name"] == "mlp-tiny"
    code, out = invoke("registry", "promote", "mlp-tiny", "9", "--db", db)
    assert code == 2 and "version 9" in out
    code, out = invoke("registry", "list", "--db", db)
    assert code == 0 and "mlp-tiny" in out and "yes" in out


def test_registry_list_escapes_external_strings(tmp_path: Path) -> None:
    job = tmp_path / "runs" / "r1" / "ext"
    tiny_onnx(job / "model.onnx")
    (job / "eval.json").write_text(json.dumps({"metrics": {HOSTILE: 0.1}, "primary_metric": HOSTILE}))
    assert invoke("registry", "register", str(job))[0] == 0
    code, out = invoke("registry", "list", "--db", str(tmp_path / "runs" / "musubi.db"))
    assert code == 0 and HOSTILE in out


def test_registry_commands_name_their_registry_and_refuse_a_missing_db(tmp_path: Path) -> None:
    """One rule (beside the run for register, runs/musubi.db or --db otherwise), printed; a missing --db exits 2."""
    job = tmp_path / "elsewhere" / "r1" / "ext"
    tiny_onnx(job / "model.onnx")
    (job / "eval.json").write_text(json.dumps({"metrics": {"acc": 0.5}, "primary_metric": "acc"}))
    code, out = invoke("registry", "register", str(job))
    db = tmp_path / "elsewhere" / "musubi.db"
    assert code == 0 and f"registry: {db} (the other registry commands read runs/musubi.db: give them --db {db})" \
        in " ".join(out.split()), out
    code, out = invoke("registry", "list", "--db", str(db))
    assert code == 0 and f"registry: {db}" in out and "ext" in out, out
    for args in (["list"], ["manifest"], ["promote", "ext", "1"], ["demote", "ext"]):
        code, out = invoke("registry", *args, "--db", str(tmp_path / "nope.db"))
        assert code == 2 and f"--db {tmp_path / 'nope.db'}: no such registry database" in out, (args, out)
        assert "no registered models" not in out
    assert not (tmp_path / "nope.db").exists()
