"""Training on 2 real GPUs: FSDP2 resumes exactly (and its memory figure), a real OOM is recovered
without a deadlock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.conftest import (
    REHEARSAL,
    figure,
    needs_gpus,
    read_jsonl,
    stop_resume_equals_uninterrupted,
    write_job,
)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

# ~67 M parameters: 16 bytes/parameter of model state (fp32 weights, grads, two AdamW moments) is
# ~1.07 GB unsharded, ~0.54 GB a rank when FSDP2 shards it over 2 GPUs.
GPT_FSDP = {
    "name": "gptfsdp", "task": "lm", "model": "gpt",
    "model_args": {"layers": 4, "hidden": 1024, "heads": 16} if not REHEARSAL else {"layers": 2, "hidden": 64,
                                                                                   "heads": 4},
    "data": {"synthetic": {"train_size": 4096, "val_size": 32, "seq_len": 128, "vocab": 8192}, "workers": 1},
    "train": {"epochs": 1, "max_steps": 10, "batch": 4, "optimizer": "adamw", "lr": 3e-4, "base_batch": 8,
              "precision": "fp32" if REHEARSAL else "bf16", "deterministic": True, "strategy": "fsdp",
              "log_every": 2},
    "checkpoint": {"every_steps": 3, "keep_last": 10},
}


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=needs_gpus(2, lane="pair-b"))])
def test_fsdp2_gpt_stop_resume_is_bitwise_and_its_memory(musubi, tmp_path: Path, nproc: int) -> None:
    full = stop_resume_equals_uninterrupted(musubi, tmp_path, GPT_FSDP, nproc, stop=5)
    peaks = [r["mem_peak_allocated_gib"] for r in read_jsonl(full / "telemetry" / "rank0.jsonl")
             if r.get("kind") == "memory"]
    if not REHEARSAL:
        assert peaks, "no memory figures from a GPU rank"
        figure("fsdp2_gpt67m_x2_peak_allocated_gib", max(peaks))


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=needs_gpus(2, lane="pair-a"))])
def test_real_oom_recovers_without_deadlock(musubi, tmp_path: Path, nproc: int) -> None:
    """16384 images of 224 px a GPU cannot fit resnet18's activations (~26 GB for the first conv alone):
    a real CUDA OOM in the first step, a coordinated restart, a probe, and training at what fits."""
    job = {"name": "oom", "task": "classification", "model": "resnet18",
           "data": {"synthetic": {"train_size": 2 * 2 * 16384, "val_size": 32, "image_size": 224,
                                  "num_classes": 10, "on_device": not REHEARSAL}, "workers": 0},
           "train": {"epochs": 1, "max_steps": 2, "batch": 16384, "lr": 0.1, "base_batch": 32768,
                     "precision": "bf16", "log_every": 1},
           "checkpoint": {"enabled": False}}
    if REHEARSAL:  # no real OOM on CPU ranks: the injected one, at a small size
        job["data"]["synthetic"].update(train_size=256, image_size=32)
        job["train"].update(batch=64, base_batch=128, precision="fp32")
    path = write_job(tmp_path / "oom.yaml", job)
    musubi("train", str(path), "--nproc", str(nproc), "--out", str(tmp_path / "r"), "--no-check", gpus=nproc,
           inject="oom_above:batch=16" if REHEARSAL else None, timeout=420)
    jd = tmp_path / "r" / "oom"
    batch = json.loads((jd / "memory" / "batch.json").read_text())
    summary = json.loads((jd / "summary.json").read_text())
    assert summary["restarts"] >= 1 and summary["steps"] == 2, summary
    assert batch["per_rank"] < job["train"]["batch"] and batch["global_batch"] == job["train"]["base_batch"], batch
    figure("oom_recovered_per_rank_batch", batch["per_rank"])
    figure("oom_recovered_accumulation", batch["accumulation"])


