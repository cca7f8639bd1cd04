"""`musubi env`: one paste-able block (versions, GPUs, topology, training variables)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from musubi.cli import app


def test_env_block_and_json(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    res = CliRunner().invoke(app, ["env"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("musubi ") and "torch: " in res.output and "gpus: none visible" in res.output
    assert "NCCL_DEBUG=WARN" in res.output and "UNRELATED_SECRET" not in res.output
    rec = json.loads(CliRunner().invoke(app, ["env", "--json"]).output)
    assert rec["env"]["NCCL_DEBUG"] == "WARN" and "UNRELATED_SECRET" not in rec["env"]
