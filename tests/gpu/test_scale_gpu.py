"""The whole machine: DDP on 2 and 4 GPUs resumes bitwise, and the demo fleet on the machine's GPUs (4, or 2
where only 2 are lent) ends with no failure, no restart and every model learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.conftest import (
    GPUS,
    REHEARSAL,
    figure,
    needs_gpus,
    stop_resume_equals_uninterrupted,
    train_losses,
)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

RESNET = {
    "name": "resnet", "task": "classification", "model": "resnet18",
    "data": {"synthetic": {"train_size": 4096, "val_size": 64, "image_size": 64, "num_classes": 10,
                           "on_device": not REHEARSAL}, "workers": 0},
    "train": {"epochs": 1, "max_steps": 12, "batch": 32, "lr": 0.1, "base_batch": 128,
              "precision": "fp32" if REHEARSAL else "bf16", "deterministic": True, "log_every": 2},
    "checkpoint": {"every_steps": 3, "keep_last": 10},
}


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=needs_gpus(2, lane="pair-b")),
                                   pytest.param(4, marks=needs_gpus(4))])
def test_ddp_resnet_stop_resume_is_bitwise(musubi, tmp_path: Path, nproc: int) -> None:
    stop_resume_equals_uninterrupted(musubi, tmp_path, RESNET, nproc, stop=7)


# The whole machine, up to 4 GPUs: one demo run a tier (a second on a 4-GPU machine would add minutes).
DEMO_GPUS = 4 if GPUS >= 4 else 2


@pytest.mark.parametrize("nproc", [pytest.param(DEMO_GPUS, marks=needs_gpus(2, uses=DEMO_GPUS))])
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
            # Loss falling: the last quarter's mean below the untrained model's first logged loss. Not
            # below the first quarter's mean: a two-stage detector's total loss dips while its RPN
            # proposes nothing (the ROI head sees only easy background) and climbs back as proposals
            # find objects (box regression on positives); on 2026-11-26 frcnn-320-ddp logged
            # 1.70 1.78 1.12 ... 1.46 on 4x H100 and 1.77 2.62 1.47 1.06 ... 1.46 on CPU ranks while its
            # validation mAP50 rose 0.15 -> 0.41. The mAP50 floor below is the learning proof.
            losses = train_losses(jd)
            k = max(1, len(losses) // 4)
            assert sum(losses[-k:]) / k < losses[0], f"{name} did not learn: {losses}"
        ev = json.loads((jd / "eval.json").read_text())
        maps[name] = ev.get("metrics", {}).get("map50")
        # visibly learning: generated objects a trained detector finds (0.0004 was a model that learned
        # nothing: SSDlite and the external job on 2026-11-26 before the demo was fixed)
        assert maps[name] is not None and maps[name] >= 0.1, (name, ev.get("metrics"))
    figure("demo_fleet_map50", maps)
    # The external job has no sampler of its own: the fleet sampled its GPU (fleet/gpu_watch.py), so its
    # utilisation and peak memory are known (what GPU sharing decides by).
    from musubi.records.evidence import gpu_peak_gib, gpu_utilisation

    external = out / "external-frcnn"
    util, peak = gpu_utilisation(external), gpu_peak_gib(external)
    assert util and 0.0 < max(util.values()) <= 1.0 and peak and peak > 0.1, (util, peak)
    figure("demo_external_gpu_util_peak_gib", [round(max(util.values()), 3), round(peak, 2)])
    figure("demo_fleet_tail", res.stdout.strip().splitlines()[-3:])
