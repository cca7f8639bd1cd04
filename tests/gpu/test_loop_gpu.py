"""Musubi's training loop never makes the host wait for the GPU in steady state, log steps included.

A log line used to read its loss with `.item()`, a wait for every queued kernel each log interval: 0.7 % of
resnet50's step on one H200 (bench/loop_ab.py, 2026-11-27). Now the line is read an interval late
(worker/log_window.py). Here bench/loop_ab.py trains a small classification job through Trainer.train_step with
torch.cuda.set_sync_debug_mode("error") over blocks that cross log steps: any host sync in the loop raises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.conftest import REHEARSAL, needs_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]


@pytest.mark.parametrize("nproc", [pytest.param(1, marks=needs_gpus(1, lane="pair-a"))])
def test_the_loop_never_syncs_the_host(musubi, tmp_path: Path, nproc: int) -> None:
    out = tmp_path / "loop.json"
    sets = ["model=resnet18", "train.batch=64", "data.synthetic.image_size=64", "train.log_every=5"]
    args = [a for s in sets for a in ("--set", s)]
    musubi.torchrun("bench/loop_ab.py", "examples/resnet50-bench.yaml", *args, "--cycles", "2", "--block", "12",
                    "--warmup", "3", "--modes", "plain,loop,loop_sync,job", "--forbid-sync", "--json", str(out),
                    gpus=nproc, timeout=300)
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"plain", "loop", "loop_sync", "job"}
    assert res["device"] != "cpu" or REHEARSAL
    # every block of every mode ran its steps: 2 cycles, each crossing two log steps (12 steps, log every 5)
    assert all(len(r["block_ms"]) == 2 for r in res["modes"].values())
    assert res["settled"] and res["gc_frozen"] > 0
