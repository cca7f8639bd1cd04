"""The untimed warm-up a bench gives the machine before what it compares (bench/fleet.py, bench/watchtower.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The warm-up each GPU gets before anything is timed: what a job imports, then bf16 matmuls for a few seconds.
WARM_UP = ("import sys, time, torch, torchvision, onnxruntime, musubi.cli.app, musubi.tasks.detection\n"
           "if sys.argv[2] == 'cuda':\n"
           "    x = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); t = time.time()\n"
           "    while time.time() - t < float(sys.argv[1]): x @ x\n"
           "    torch.cuda.synchronize()")


def warm_up(device: str, gpus: int = 1, seconds: float = 8.0) -> None:
    """Untimed, before what is compared: one process per GPU (one on CPU) imports what a job imports and keeps its
    GPU busy `seconds`, all at once. On a machine started minutes before (4x H200, 2026-11-27) the first (a)
    ran with 35-54 s start-ups (the launcher's torch import 12 s, each rank's 8-9 s) against 11-17 s for the same
    jobs in the fleet right after, and its training 4-20 % slower: a cold machine measured, not the jobs (on 2
    CPU cores the second of two identical fleet runs was 1.46x faster without a warm-up). The same day on 2x
    H200 the first timed run of bench/watchtower.py's overhead part (resnet50, telemetry on) was 3.3 % slower
    than the same mode's second run: it had no warm-up. With this warm-up, on 4x H200 later that day, the first
    timed run (resnet50, telemetry on) was still 3.45 % slower than the next (off): what the warm-up removes is
    not measured."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WARM_UP, str(seconds), device], cwd=REPO,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(g) if device == "cuda" else ""})
             for g in range(gpus if device == "cuda" else 1)]
    codes = [p.wait() for p in procs]
    print(f"warm-up ({len(procs)} process(es)): {time.perf_counter() - t0:.1f} s, exit codes {codes}", flush=True)
