"""The Python API speaks the CLI's dialect: the same options under keyword names, errors worded for a caller."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import typer

import musubi
from musubi.api import TRAIN_KEYWORDS
from musubi.cli import app
from musubi.contract.errors import ConfigError

#: CLI option (click's parameter name) -> musubi.train keyword. The CLI's `--set` and positional overrides are
#: the API's **overrides.
CLI_TO_API = {"nproc": "nproc", "out": "out", "resume": "resume", "max_steps": "max_steps", "device": "device",
              "no_check": "check", "dry_run": "dry_run", "oversubscribe": "oversubscribe",
              "allow_changes": "allow_changes", "set_": "**overrides", "overrides": "**overrides", "job": "job"}
#: Options the API leaves to the command line, and why.
CLI_ONLY = {"probe_only": "prints JSON for the fleet", "fleet_member": "started by musubi run",
            "nnodes": "multi-node: one command per node", "node_rank": "multi-node", "rdzv_endpoint": "multi-node",
            "rdzv_id": "multi-node", "rdzv_timeout": "multi-node", "iface": "multi-node"}
#: Keywords the API adds: quiet (rank 0's console discarded, it is also in logs/rank0.log).
API_ONLY = {"quiet"}


def test_the_api_and_the_cli_take_the_same_options() -> None:
    cli = {p.name for p in typer.main.get_command(app).commands["train"].params if p.name != "help"}
    assert cli == set(CLI_TO_API) | set(CLI_ONLY), sorted(cli ^ (set(CLI_TO_API) | set(CLI_ONLY)))
    params = inspect.signature(musubi.train).parameters
    api = {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD}
    assert api == {v for v in CLI_TO_API.values() if v != "**overrides"} | API_ONLY
    assert set(TRAIN_KEYWORDS) == api - {"job"}
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_errors_name_keywords_and_the_job_mapping(tiny_job, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown keyword 'epochs'.*train=\{'epochs': 3\}"):
        musubi.train(tiny_job(), epochs=3)
    with pytest.raises(ConfigError) as e:
        musubi.train(tiny_job(), train={"epocs": 3}, dry_run=True)
    assert "the override train.epocs=3: unknown key train.epocs; did you mean 'epochs'" in str(e.value)
    assert "--set" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        musubi.train({"name": "mine", "task": "classification", "model": "resnet1800",
                      "data": {"synthetic": {}}}, dry_run=True)
    assert "unknown classification model" in str(e.value)
    with pytest.raises(ConfigError) as e:
        musubi.train({"name": "mine", "task": "classification", "model": "resnet18", "data": {"synthetic": {}},
                      "trian": {}}, dry_run=True)
    assert str(e.value).startswith("musubi.train(job=<mapping>): unknown key trian"), str(e.value)
    with pytest.raises(ConfigError, match="allow_changes goes with resume=True"):
        musubi.train(tiny_job(), allow_changes=["train.lr"])
    cores = 64
    with pytest.raises(ConfigError) as e:
        musubi.train(tiny_job(), nproc=cores, device="cpu", out=tmp_path / "r")
    assert f"nproc={cores} CPU ranks" in str(e.value) and "oversubscribe=True" in str(e.value)
    assert "--" not in str(e.value) and not (tmp_path / "r").exists()


def test_dry_run_returns_the_plan_and_dir_lists_the_api(tiny_job, tmp_path: Path) -> None:
    lines = musubi.train(tiny_job(), nproc=3, oversubscribe=True, device="cpu", out=tmp_path / "r", dry_run=True,
                         check=False)
    assert "ranks: 3 CPU (gloo) ranks" in lines and lines[-1].startswith("checks passed:")
    assert not (tmp_path / "r").exists()
    assert {"train", "run", "predict"} <= set(dir(musubi))


#: The evaluate, export and predict commands beside their calls: CLI parameter name -> API keyword (typer's
#: `format_` is the flag --format). Every other parameter has the same name on both sides.
RENAMED = {"export": {"format_": "format"}}
#: The commands' arguments: the calls take them positionally, under these names.
ARGUMENTS = {"evaluate": ("job_dir",), "export": ("job_dir",), "predict": ("model", "source")}


@pytest.mark.parametrize("command", ["evaluate", "export", "predict"])
def test_evaluate_export_predict_take_their_commands_options(command: str) -> None:
    """Same options, same names, same defaults; the call's keywords are its documented keyword list."""
    from musubi.api import PREDICT_KEYWORDS
    from musubi.evaluate.python_api import EVALUATE_KEYWORDS, EXPORT_KEYWORDS

    params = typer.main.get_command(app).commands[command].params
    renamed = RENAMED.get(command, {})
    cli = {renamed.get(p.name, p.name): p for p in params if p.name != "help"}
    call = getattr(musubi.api, command)
    api = inspect.signature(call).parameters
    assert set(cli) == set(api), sorted(set(cli) ^ set(api))
    keywords = {"evaluate": EVALUATE_KEYWORDS, "export": EXPORT_KEYWORDS, "predict": PREDICT_KEYWORDS}[command]
    assert set(keywords) == set(api) - set(ARGUMENTS[command])
    for name in ARGUMENTS[command]:
        assert api[name].kind is api[name].POSITIONAL_OR_KEYWORD and api[name].default is api[name].empty
    for name in keywords:
        assert api[name].kind is api[name].KEYWORD_ONLY, name
        assert api[name].default == cli[name].default, (name, api[name].default, cli[name].default)


def test_load_takes_predicts_model_options() -> None:
    """musubi.load(model, ...) picks the model as `musubi predict` does: its checkpoint, device and db options."""
    from musubi.evaluate.python_api import LOAD_KEYWORDS

    cli = {p.name: p for p in typer.main.get_command(app).commands["predict"].params}
    api = inspect.signature(musubi.load).parameters
    assert set(api) == {"model", *LOAD_KEYWORDS}
    for name in LOAD_KEYWORDS:
        assert api[name].default == cli[name].default, name
