"""Asynchronous checkpoints with CUDA tensors and NCCL: every mode, several saves, exact resume; a rank
SIGKILLed mid-run restarts by itself and ends with the same weights.

One uninterrupted reference (GPT, 2 GPUs, deterministic, 12 steps, a save every 3) is shared by the
module. Each mode then stops at step 7 (saves at 3, 6 and 7) and resumes to 12 (saves at 9 and 12):
five saves through one Checkpointer per attempt — torch 2.11 crashed at the second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.runtime.drill import final_tensors
from tests.gpu.conftest import REHEARSAL, assert_same_tensors, needs_gpus, read_jsonl, train_losses, write_job

pytestmark = [*needs_gpus(2), pytest.mark.timeout(600)]

GPT = {
    "name": "gpt", "task": "lm", "model": "gpt",
    "model_args": {"layers": 2, "hidden": 256, "heads": 4},
    "data": {"synthetic": {"train_size": 4096, "val_size": 64, "seq_len": 64, "vocab": 512}, "workers": 1},
    "train": {"epochs": 1, "max_steps": 12, "batch": 8, "optimizer": "adamw", "lr": 1e-3, "base_batch": 16,
              "precision": "fp32" if REHEARSAL else "bf16", "deterministic": True, "log_every": 2},
    "checkpoint": {"every_steps": 3, "keep_last": 10},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    from tests.gpu.conftest import Musubi

    tmp = tmp_path_factory.mktemp("ref")
    job = write_job(tmp / "gpt.yaml", GPT)
    Musubi(tmp)("train", str(job), "--nproc", "2", "--out", str(tmp / "run"), "--no-check", gpus=2)
    jd = tmp / "run" / "gpt"
    losses = train_losses(jd)
    assert losses[-1] < losses[0], f"the reference did not learn: {losses}"
    return final_tensors(jd)


@pytest.mark.parametrize("mode", ["process", "thread", "off"])
def test_saves_in_every_mode_then_resume_equals_uninterrupted(musubi, tmp_path: Path, reference: dict,
                                                              mode: str) -> None:
    job = write_job(tmp_path / "gpt.yaml", GPT)
    out = tmp_path / "run"
    args = ("train", str(job), "--nproc", "2", "--out", str(out), "--no-check", "--set",
            f"checkpoint.async_mode={mode}")
    musubi(*args, "--max-steps", "7", gpus=2)
    musubi(*args, "--resume", gpus=2)
    jd = out / "gpt"
    saves = [r for r in read_jsonl(jd / "metrics.jsonl") if r.get("kind") == "checkpoint"]
    assert len(saves) >= 4 and all(r["ok"] for r in saves), saves
    expected_mode = {"off": "sync"}.get(mode, mode)
    assert {r["mode"] for r in saves} == {expected_mode}, saves
    summary = json.loads((jd / "summary.json").read_text())
    assert summary["restarts"] == 0, f"a rank crashed and torchrun restarted it ({summary['restarts']} restarts)"
    assert_same_tensors(final_tensors(jd), reference, f"resume with async_mode={mode}")


def test_rank_killed_mid_run_restarts_with_the_same_weights(musubi, tmp_path: Path, reference: dict) -> None:
    job = write_job(tmp_path / "gpt.yaml", GPT)
    out = tmp_path / "run"
    musubi("train", str(job), "--nproc", "2", "--out", str(out), "--no-check", gpus=2,
           inject="kill:rank=1,step=8")
    jd = out / "gpt"
    goodput = json.loads((jd / "goodput.json").read_text())
    assert len(goodput["failures"]) == 1, goodput["failures"]
    assert json.loads((jd / "summary.json").read_text())["restarts"] == 1
    assert_same_tensors(final_tensors(jd), reference, "after a SIGKILL of rank 1 at step 8")
