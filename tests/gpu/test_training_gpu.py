"""Training on real GPUs: DDP on 4 GPUs and FSDP2 on 2 resume exactly, a real OOM is recovered without a
deadlock, and the demo fleet on 4 GPUs ends with no failure, no restart and every model learning."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from musubi.runtime.drill import final_tensors
from tests.gpu.conftest import REHEARSAL, assert_same_tensors, needs_gpus, read_jsonl, train_losses, write_job

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

RESNET = {
    "name": "resnet", "task": "classification", "model": "resnet18",
    "data": {"synthetic": {"train_size": 4096, "val_size": 64, "image_size": 64, "num_classes": 10,
                           "on_device": not REHEARSAL}, "workers": 0},
    "train": {"epochs": 1, "max_steps": 12, "batch": 32, "lr": 0.1, "base_batch": 128,
              "precision": "fp32" if REHEARSAL else "bf16", "deterministic": True, "log_every": 2},
    "checkpoint": {"every_steps": 3, "keep_last": 10},
}

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


def _figure(name: str, value: object) -> None:
    """Record a figure for the tier's result file (bench/gpu_tier.py collects MUSUBI_GPU_FIGURES)."""
    path = os.environ.get("MUSUBI_GPU_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"figure": name, "value": value}) + "\n")


def _stop_resume_equals_uninterrupted(musubi, tmp_path: Path, job: dict, nproc: int, stop: int) -> Path:
    path = write_job(tmp_path / f"{job['name']}.yaml", job)
    base = ("train", str(path), "--nproc", str(nproc), "--no-check")
    musubi(*base, "--out", str(tmp_path / "full"), gpus=nproc)
    musubi(*base, "--out", str(tmp_path / "cut"), "--max-steps", str(stop), gpus=nproc)
    musubi(*base, "--out", str(tmp_path / "cut"), "--resume", gpus=nproc)
    full, cut = tmp_path / "full" / job["name"], tmp_path / "cut" / job["name"]
    losses = train_losses(full)
    assert losses[-1] < losses[0], f"{job['name']} did not learn: {losses}"
    assert_same_tensors(final_tensors(cut), final_tensors(full), f"{job['name']} x{nproc}: stop at {stop}, resume")
    return full


@pytest.mark.parametrize("nproc", [pytest.param(4, marks=needs_gpus(4))])
def test_ddp_resnet_stop_resume_is_bitwise(musubi, tmp_path: Path, nproc: int) -> None:
    _stop_resume_equals_uninterrupted(musubi, tmp_path, RESNET, nproc, stop=7)


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=needs_gpus(2))])
def test_fsdp2_gpt_stop_resume_is_bitwise_and_its_memory(musubi, tmp_path: Path, nproc: int) -> None:
    full = _stop_resume_equals_uninterrupted(musubi, tmp_path, GPT_FSDP, nproc, stop=5)
    summary = json.loads((full / "summary.json").read_text())
    peaks = [r["mem_peak_allocated_gib"] for r in read_jsonl(full / "telemetry" / "rank0.jsonl")
             if r.get("kind") == "memory"]
    if not REHEARSAL:
        assert peaks, "no memory figures from a GPU rank"
        _figure("fsdp2_gpt67m_x2_peak_allocated_gib", max(peaks))
    _figure("fsdp2_gpt_strategy", summary.get("strategy"))


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=needs_gpus(2))])
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
    _figure("oom_recovered_per_rank_batch", batch["per_rank"])
    _figure("oom_recovered_accumulation", batch["accumulation"])


@pytest.mark.parametrize("nproc", [pytest.param(4, marks=needs_gpus(4))])
def test_demo_fleet_has_no_failure_and_every_model_learns(musubi, tmp_path: Path, nproc: int) -> None:
    out = tmp_path / "demo"
    res = musubi("run", "examples/fleet-demo.yaml", "--out", str(out), gpus=nproc, timeout=540)
    jobs = json.loads((out / "fleet.json").read_text())["jobs"]
    for name, st in jobs.items():
        assert st["state"] == "done", (name, st)
        assert st.get("restarts", 0) == 0 and not st.get("failures"), (name, st)
    checklist = json.loads((out / "checklist.json").read_text())
    assert checklist["ok"], [i for i in checklist["items"] if i["status"] == "FAIL"]
    maps = {}
    for name in jobs:
        jd = out / name
        if (jd / "metrics.jsonl").is_file() and train_losses(jd):
            losses = train_losses(jd)
            k = max(1, len(losses) // 4)
            assert sum(losses[-k:]) / k < sum(losses[:k]) / k, f"{name} did not learn: {losses}"
        ev = json.loads((jd / "eval.json").read_text())
        maps[name] = ev.get("metrics", {}).get("map50")
        assert maps[name] is not None and maps[name] > 0.0, (name, ev.get("metrics"))
    _figure("demo_fleet_map50", maps)
    _figure("demo_fleet_tail", res.stdout.strip().splitlines()[-3:])
