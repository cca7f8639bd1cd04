"""How much a GEMM slows when communication runs beside it: the contention term FSDP's overlap pays.

    python bench/overlap_contention.py --mode copy [--out FILE.json]               # one GPU: an HBM copy beside
    torchrun --nproc-per-node 2 bench/overlap_contention.py --mode nccl [--out F]  # two or more: NCCL all-gather

Why (issue 48; docs/guides/planner-published-runs.md, session 22): on H100, PyTorch FSDP runs (torchtitan,
fms-fsdp, MosaicML) reach 30-65 % less than the planner predicts while Megatron runs on the same GPUs do not,
and the GEMMs alone run at the planner's rate (bench/gemm_shapes.py). FSDP overlaps an all-gather or a
reduce-scatter with nearly all of its compute; NCCL's kernels take SMs and HBM bandwidth from the GEMMs they
run beside. The planner prices overlapped communication as free up to the compute it hides under. This
script measures the price: TFLOP/s of a bf16 GEMM alone, the communication's GB/s alone, and both while
they run at the same time on two streams.

`--mode copy` (one GPU) runs a device-to-device copy of a large buffer as the neighbour: SM-driven HBM
traffic like NCCL's intra-node copy kernels, a proxy that needs no second GPU. `--mode nccl` (torchrun,
two or more GPUs, one process each) runs `all_gather_into_tensor` of --mib MiB per rank. `--device cpu`
(gloo) checks the script only: CPU "GEMMs" and gloo collectives share no SMs.
The JSON goes to --out, else $OUT/overlap_contention.json where $OUT is set, else bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import result_path, write_result  # noqa: E402


def _sync(torch: Any, dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def rate(torch: Any, dev: str, fn: Any, seconds: float) -> tuple[float, int]:
    """(seconds per call, calls) of `fn` run back to back for about `seconds`, after a warm-up."""
    for _ in range(2):
        fn()
    _sync(torch, dev)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
        if calls % 4 == 0:
            _sync(torch, dev)
    _sync(torch, dev)
    return (time.perf_counter() - start) / calls, calls


def together(torch: Any, dev: str, gemm: Any, comm: Any, seconds: float, g_alone: float,
             c_alone: float) -> tuple[float, float]:
    """(seconds per GEMM, seconds per communication) while both run at once on their own streams.

    Each round queues as many of each as take the same time alone (a 1.6-ms GEMM beside 0.1-ms copies gets
    ~16 copies), so both streams stay busy for the whole round. On CPU there are no streams: a thread runs
    the communication beside the GEMM loop.
    """
    if dev == "cuda":
        side = torch.cuda.Stream()
        per_round = 8 * max(g_alone, c_alone)  # ~8 of the slower one a round
        n_gemm, n_comm = max(1, round(per_round / g_alone)), max(1, round(per_round / c_alone))
        g_calls = c_calls = 0
        g_ms = c_ms = 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            # each stream's own span, timed by events on it: what one side took while the other ran beside it
            events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            with torch.cuda.stream(side):
                events[2].record(side)
                for _ in range(n_comm):
                    comm()
                events[3].record(side)
            events[0].record()
            for _ in range(n_gemm):
                gemm()
            events[1].record()
            torch.cuda.synchronize()
            g_ms += events[0].elapsed_time(events[1])
            c_ms += events[2].elapsed_time(events[3])
            g_calls, c_calls = g_calls + n_gemm, c_calls + n_comm
        return g_ms / 1e3 / g_calls, c_ms / 1e3 / c_calls
    import threading

    stop, c_count = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            comm()
            c_count[0] += 1

    worker = threading.Thread(target=loop)
    start = time.perf_counter()
    worker.start()
    per_gemm, _ = rate(torch, dev, gemm, seconds)
    stop.set()
    worker.join()
    return per_gemm, (time.perf_counter() - start) / max(1, c_count[0])


def measure(mode: str, dev: str, size: int, mib: float, seconds: float) -> dict[str, Any]:
    """The three measurements of one rank: GEMM alone, communication alone, both together."""
    import torch

    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    rank, world = 0, 1
    if mode == "nccl":
        import torch.distributed as dist

        dist.init_process_group("nccl" if dev == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if dev == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = f"cuda:{torch.cuda.current_device()}" if dev == "cuda" else "cpu"
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    numel = int(mib * 2**20) // 2
    if mode == "copy":
        src = torch.empty(numel, device=device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)

        def comm() -> None:
            dst.copy_(src)

        comm_bytes = 2 * numel * 2  # read + write
    else:
        import torch.distributed as dist

        shard = torch.empty(numel, device=device, dtype=torch.bfloat16)
        gathered = torch.empty(numel * world, device=device, dtype=torch.bfloat16)

        def comm() -> None:
            dist.all_gather_into_tensor(gathered, shard)

        comm_bytes = (world - 1) * numel * 2  # bytes each rank receives

    def gemm() -> None:
        torch.matmul(a, b, out=out)

    flops = 2 * size**3
    g_alone, _ = rate(torch, dev, gemm, seconds)
    c_alone, _ = rate(torch, dev, comm, seconds)
    g_both, c_both = together(torch, dev, gemm, comm, seconds, g_alone, c_alone)
    row = {"rank": rank, "world": world, "mode": mode, "gemm_size": size, "comm_mib": mib,
           "gemm_tflops_alone": flops / g_alone / 1e12, "gemm_tflops_with_comm": flops / g_both / 1e12,
           "comm_gbps_alone": comm_bytes / c_alone / 1e9, "comm_gbps_with_gemm": comm_bytes / c_both / 1e9}
    row["gemm_slowdown"] = row["gemm_tflops_alone"] / row["gemm_tflops_with_comm"] - 1
    if mode == "nccl":
        import torch.distributed as dist

        dist.destroy_process_group()
    return row


def main(argv: list[str] | None = None) -> int:
    """Measure and write the JSON (rank 0 only); 2 on a bad option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("copy", "nccl"), default="copy")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", type=int, default=8192, help="square GEMM side")
    parser.add_argument("--mib", type=float, default=256.0, help="MiB copied / gathered per rank per call")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of each of the three measurements")
    parser.add_argument("--out", type=Path, help="result JSON (default: $OUT/overlap_contention.json or bench/results)")
    args = parser.parse_args(argv)
    if args.size < 1 or args.mib <= 0 or args.seconds <= 0:
        print("error: --size, --mib and --seconds must be > 0", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU; use --device cpu to check the script", file=sys.stderr)
        return 2
    row = measure(args.mode, args.device, args.size, args.mib, args.seconds)
    print(json.dumps(row), flush=True)
    if row["rank"] != 0:
        return 0
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result = {"card": card, "torch": torch.__version__, "date": dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"), **row}
    write_result(result, result_path(args.out, "overlap_contention.json", f"overlap-contention-{{date}}-{args.mode}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
