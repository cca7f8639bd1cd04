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


#: A detector's loss parts summed and queued under sync-debug "error" (worker/log_window.py): no host sync.
PARTS_SNIPPET = """
import json, sys, time
import torch
from musubi.worker.log_window import LogWindow, queue_line
dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
win = LogWindow(dev)
def parts(i):
    return {"loss_classifier": torch.full((), float(i), device=dev), "loss_box_reg": torch.full((), 2.0 * i, device=dev)}
win.add(torch.zeros((), device=dev), 1, parts(0))  # the first add allocates the sums: not steady state
if dev.type == "cuda":
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
lines = []
for i in range(1, 7):
    win.add(torch.full((), 3.0 * i, device=dev), 1, parts(i))
    if i % 3 == 0:
        lines.append(queue_line(win, i, 1, lambda t: t, time.perf_counter(), {}))
if dev.type == "cuda":
    torch.cuda.set_sync_debug_mode(0)
json.dump({"device": dev.type, "lines": [[ln.mean_loss(), ln.mean_parts()] for ln in lines]}, sys.stdout)
"""


@pytest.mark.parametrize("nproc", [pytest.param(1, marks=needs_gpus(1, lane="pair-a"))])
def test_loss_parts_are_summed_and_queued_without_a_host_sync(musubi, nproc: int) -> None:
    import sys

    res = musubi.run([sys.executable, "-c", PARTS_SNIPPET], [], nproc, None, 120, 0)
    got = json.loads(res.stdout)
    assert got["device"] == "cuda" or REHEARSAL
    # first window: the warm-up add (0) and steps 1-3; second: steps 4-6
    assert got["lines"] == [[18.0 / 4, {"loss_classifier": 6.0 / 4, "loss_box_reg": 12.0 / 4}],
                            [45.0 / 3, {"loss_classifier": 5.0, "loss_box_reg": 10.0}]]
