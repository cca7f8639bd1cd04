"""`musubi plan` through typer's CliRunner, registered the way cli.py does: app.command("plan")(plan_command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from musubi.cli.plan import plan_command

app = typer.Typer(add_completion=False)
app.command("plan")(plan_command)


@app.command("version")
def _version() -> None:  # a second command, so "plan" stays a sub-command as in the real CLI
    print("0")


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["plan", *args])
    return res.exit_code, res.output


def one_line_error(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    return lines[0]


def test_search_table() -> None:
    code, out = run("--model", "llama3-70b", "--gpu", "H100-SXM", "--gpus", "64", "--top", "3")
    assert code == 0, out
    assert "llama3-70b on 64 x H100-SXM" in out and "tp=" in out and "rejected" in out


def test_search_json() -> None:
    code, out = run("--model", "llama3-8b", "--gpu", "H100", "--gpus", "16", "--nodes", "2", "--seq", "4096",
                    "--global-batch", "64", "--top", "2", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["gpus"] == 16 and data["global_batch"] == 64 and len(data["candidates"]) == 2
    best = data["candidates"][0]
    for key in ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                "memory_gib_per_gpu", "bubble_fraction", "straggler_tax", "comm_s", "exposed_comm_s"):
        assert key in best
    assert best["seq"] == 4096 and set(best["comm_s"]) == {"nvlink", "pcie", "network"}
    assert data["rejected"]["count"] == sum(k["count"] for k in data["rejected"]["by_kind"])


def test_one_layout_table_and_json(tmp_path: Path) -> None:
    spec = tmp_path / "m.yaml"
    spec.write_text("layers: 32\nhidden: 4096\nheads: 32\nkv_heads: 8\nffn_hidden: 14336\nvocab: 128256\n"
                    "seq: 8192\n")
    args = ("--spec", str(spec), "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "16",
            "--layout", "tp=2,zero=1,recompute=selective,micro=1")
    code, out = run(*args)
    assert code == 0, out
    assert "step time" in out and "MFU / HFU" in out and "pipeline bubble" in out
    code, out = run(*args, "--json")
    data = json.loads(out)
    assert data["layout"].startswith("tp=2,pp=1,dp=4,cp=1") and data["micro_batches"] == 4
    assert data["hfu"] >= data["mfu"] > 0 and data["fits"] is True


def test_layout_that_does_not_fit_is_reported_not_refused() -> None:
    code, out = run("--model", "llama3-70b", "--gpu", "A100-80GB", "--gpus", "8", "--global-batch", "8",
                    "--layout", "tp=1", "--json")
    assert code == 0 and json.loads(out)["fits"] is False


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpu", "H100-SXM", "--gpus", "8"), "exactly one of --model"),
    (("--model", "llama3-8b", "--spec", "x.yaml", "--gpu", "H100-SXM", "--gpus", "8"), "exactly one of --model"),
    (("--model", "llama3-8b", "--gpus", "8"), "--gpu TYPE and --gpus N"),
    (("--model", "llama3-8b", "--gpu", "H100-SMX", "--gpus", "8"), "unknown GPU"),
    (("--model", "llama3-8c", "--gpu", "H100-SXM", "--gpus", "8"), "did you mean llama3-8b"),
    (("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--layout", "tp=8,pp=2,dp=2"),
     "tp=8 x pp=2 x dp=2 x cp=1 = 32 GPUs, but there are 8"),
    (("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--nodes", "3"), "--nodes 3 does not divide"),
    (("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "12", "--layout", "micro=1"),
     "global batch 12 is not a multiple of dp=8"),
    (("--spec", "missing.yaml", "--gpu", "H100-SXM", "--gpus", "8"), "does not exist"),
    (("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--top", "0"), "--top 0"),
    (("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--nic-gbps", "0"), "--nic-gbps 0: must be > 0"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    code, out = run(*args)
    assert code == 2, out
    assert needle in one_line_error(out)


def test_nothing_fits_exits_1() -> None:
    code, out = run("--model", "llama3-405b", "--gpu", "L40S", "--gpus", "8", "--global-batch", "8")
    assert code == 1 and "no layout fits" in out


def test_calibration_file_changes_the_prediction(tmp_path: Path) -> None:
    base = ("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "8", "--layout",
            "zero=1", "--json")
    slow = tmp_path / "cal.json"
    slow.write_text(json.dumps({"gpu": "H100-SXM", "matmul_tflops": 500.0}))
    _, out = run(*base)
    _, cal_out = run(*base, "--calibrate", str(slow))
    assert json.loads(cal_out)["step_time_s"] > json.loads(out)["step_time_s"]
    assert json.loads(cal_out)["calibration"]["matmul"] == pytest.approx(500 / 989.5)
    other = tmp_path / "a100.json"
    other.write_text(json.dumps({"gpu": "A100-80GB", "matmul_tflops": 250.0}))
    code, out = run(*base, "--calibrate", str(other))
    assert code == 2 and "measured on A100-80GB" in one_line_error(out)


def test_validate_prints_fit_and_heldout_tables_per_regime() -> None:
    code, out = run("--validate")
    assert code == 0, out
    assert "fit set" in out and "held-out set (no fit reads it)" in out
    assert "fsdp" in out and "ms-175b-12288" in out and "llama3-405b-16k" in out
    assert "leave one source out" in out and "without Narayanan2021-Table1: matmul" in out
    assert "bloom-176b-384" in out


def test_nic_gbps_sets_the_clusters_network() -> None:
    """A slower network (Jean Zay: 4x 100 Gb/s Omni-Path for 8 GPUs = 6.25 GB/s a GPU) lengthens a step whose
    data-parallel traffic crosses nodes."""
    base = ("--model", "gpt3-175b", "--gpu", "A100-80GB", "--gpus", "384", "--global-batch", "1536", "--layout",
            "tp=4,pp=12,zero=1,recompute=full,micro=2,overlap=none", "--json")
    _, dgx = run(*base)
    _, slow = run(*base, "--nic-gbps", "6.25")
    assert json.loads(slow)["step_time_s"] > json.loads(dgx)["step_time_s"]


def test_one_layout_explains_its_terms() -> None:
    code, out = run("--model", "llama3-70b", "--gpu", "H100", "--gpus", "256", "--global-batch", "256",
                    "--layout", "tp=8,pp=1,zero=3,recompute=full")
    assert code == 0, out
    assert "step time by term" in out and "<- dominant" in out and "exposed comm (network)" in out


def test_one_layout_says_why_gemm_efficiency_and_dp_traffic_against_its_window() -> None:
    """The sharded-DP regime in the user's words: small-micro-batch GEMMs, traffic per GPU, what could hide it."""
    code, out = run("--model", "gpt3-175b", "--gpu", "A100-80GB", "--gpus", "1536", "--global-batch", "1536",
                    "--layout", "tp=1,pp=1,zero=3,recompute=full,micro=1")
    assert code == 0, out
    assert "GEMMs at micro-batch 1 (2,048 tokens)" in out and "% of peak" in out
    assert "data-parallel traffic (network)" in out and "at 20 GB/s" in out  # one HDR NIC x 0.8
    assert "compute it can hide under" in out
    code, js = run("--model", "gpt3-175b", "--gpu", "A100-80GB", "--gpus", "1536", "--global-batch", "1536",
                   "--layout", "tp=1,pp=1,zero=3,recompute=full,micro=1", "--json")
    dp = json.loads(js)["data_parallel"]
    assert dp["tier"] == "network" and dp["exposed_s"] > dp["window_s"] > 0


def test_the_why_names_the_last_gradient_bucket() -> None:
    """A sharded optimizer across nodes: the exposed part is the last bucket (test_dp_buckets.py), and it says so."""
    args = ("--model", "llama3-70b", "--gpu", "H100-SXM", "--gpus", "256", "--global-batch", "64",
            "--layout", "tp=8,dp=32,zero=1,micro=2,recompute=none")
    code, out = run(*args)
    assert code == 0, out
    assert "of which the last gradient bucket" in out
    code, js = run(*args, "--json")
    dp = json.loads(js)["data_parallel"]
    assert 0 < dp["tail_s"] <= dp["exposed_s"] < dp["busy_s"]
