"""Preflight on a multi-GPU machine: how long `musubi check` takes, that a slow path warns, and that
two ranks on one GPU abort at start.

    python bench/preflight.py [--gpus 0,1,2,3] [--repeat 3] [--json OUT.json]

1. `musubi check --gpu-ids ... --json` `--repeat` times with the one-process NCCL probe (the default)
   and `--repeat` times with the per-rank torchrun probe (MUSUBI_COMM_PROBE=torchrun), interleaved:
   wall time of the whole command (what a user waits for) and the check's own figure.
2. The same with NCCL_P2P_DISABLE=1: the bandwidth check must WARN.
3. Two torchrun agents (`--nnodes 2`, one rank each, both LOCAL_RANK 0 on the same GPU) start a
   tiny lm job: every rank must exit at start with Musubi's binding error.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUSUBI = [sys.executable, "-m", "musubi.cli"]


def timed_check(gpus: str, out: Path, env: dict[str, str]) -> tuple[float, dict]:
    """(wall seconds, the --json report) of one `musubi check`."""
    t0 = time.perf_counter()
    res = subprocess.run([*MUSUBI, "check", "--gpu-ids", gpus, "--out", str(out), "--json"], env=env, cwd=REPO,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        report = json.loads(res.stdout)
    except ValueError:
        raise SystemExit(f"musubi check printed no JSON (exit {res.returncode}):\n{res.stdout[-2000:]}"
                         f"\n{res.stderr[-2000:]}") from None
    report["exit_code"] = res.returncode
    return wall, report


def lines(report: dict) -> list[str]:
    """The report's results as the console prints them."""
    return [f"{r['status']} {r['check']}: {r['found']}" + (f" -> {r['fix']}" if r.get("fix") else "")
            for r in report.get("results", [])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shared_gpu_drill(tmp: Path) -> dict:
    """Prepare a tiny lm job, then start it as two single-rank agents that both get GPU 0."""
    job = REPO / "examples" / "lm-fsdp.yaml"
    out = tmp / "dup"
    prep = subprocess.run([*MUSUBI, "train", str(job), "--nproc", "1", "--out", str(out), "--no-check",
                           "--max-steps", "1", "--set", "train.strategy=ddp"], cwd=REPO, capture_output=True,
                          text=True)
    if prep.returncode != 0:
        return {"error": f"preparing the job failed: {prep.stderr[-800:]}"}
    job_dir = next(out.rglob("job.json")).parent
    port = free_port()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0", MUSUBI_DEVICE="cuda", PYTHONUNBUFFERED="1")
    procs = []
    t0 = time.perf_counter()
    for node in range(2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--max-restarts=0", "-m", "musubi.worker.worker", str(job_dir)]
        procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        outs.append((p.returncode, text))
    seconds = time.perf_counter() - t0
    hits = [next((ln.strip() for ln in text.splitlines() if "share one GPU" in ln), None) for _, text in outs]
    return {"exit_codes": [code for code, _ in outs], "seconds": round(seconds, 1), "binding_error": hits,
            "ok": all(code not in (0, None) for code, _ in outs) and any(hits),
            "tail": [text[-600:] for _, text in outs] if not any(hits) else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="0,1,2,3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-dup", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    base = dict(os.environ)
    base.pop("NCCL_P2P_DISABLE", None)
    result: dict = {"gpus": args.gpus, "runs": {"single": [], "torchrun": []}}
    for i in range(args.repeat):
        for launcher in ("single", "torchrun") if i % 2 == 0 else ("torchrun", "single"):
            env = dict(base, MUSUBI_COMM_PROBE=launcher)
            wall, report = timed_check(args.gpus, tmp / "pf", env)
            comm = (report.get("readings") or {}).get("comm") or {}
            result["runs"][launcher].append({"wall_s": round(wall, 2), "check_s": report.get("seconds"),
                                             "probe_wall_s": comm.get("wall_s"), "busbw_gbps": comm.get("busbw_gbps"),
                                             "exit_code": report["exit_code"]})
            if launcher == "single" and i == 0:
                result["report"] = lines(report)
    for launcher, runs in result["runs"].items():
        result[f"median_wall_s_{launcher}"] = statistics.median(r["wall_s"] for r in runs)
    wall, report = timed_check(args.gpus, tmp / "pf", dict(base, NCCL_P2P_DISABLE="1"))
    result["p2p_disabled"] = {"wall_s": round(wall, 2), "exit_code": report["exit_code"], "report": lines(report),
                              "bandwidth_warns": any(r["check"] == "comm.bandwidth" and r["status"] == "WARN"
                                                     for r in report.get("results", []))}
    if not args.skip_dup:
        result["shared_gpu"] = shared_gpu_drill(tmp)
    print(json.dumps(result, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
