"""Collective time against message size, measured beside what the planner's comm model predicts (issue 48).

    torchrun --nproc-per-node 2 bench/nccl_sweep.py --gpu H200 [--out FILE.json]
    torchrun --nproc-per-node 2 bench/nccl_sweep.py --device cpu --gpu H200 --max-mib 1   # checks the script

Why: musubi/plan/comm.py prices a collective as NCCL's cheapest protocol for its size (latency + bytes / bus
bandwidth; NCCL's ring: an all-reduce moves 2 (n-1)/n S per rank, all-gather and reduce-scatter (n-1)/n S),
never under the per-call floor, with the `nvlink` fraction, `call_s` and `gather_share` of
musubi/plan/efficiency.py (the last two measured by this script: bench/results/nccl-sweep-2026-11-28-2xH200-*.json). The fixed-global-batch runs that lose throughput with
scale move smaller messages per collective; whether the latency term and the bandwidth fraction hold across
message sizes is a measurement, not a training run. This script times `all_reduce`, `all_gather_into_tensor`
and `reduce_scatter_tensor` of bf16 buffers from --min-kib to --max-mib (factors of 4), nccl-tests'
conventions: algbw = S / t, busbw = algbw x 2 (n-1)/n (all-reduce) or (n-1)/n (the other two), S the
whole buffer (all-gather's output, reduce-scatter's input). Each size: --warmup calls, then --iters calls
timed together; rank 0 writes one row per (collective, size) with the planner's time for the same message
on a group of this size inside one NVLink domain of the catalog GPU --gpu (`place_group`, `all_reduce_s`,
`reduce_scatter_s`), and the ratio measured / predicted. `--device cpu` uses gloo and checks the script
only (the prediction still names the GPU's NVLink tier, so the ratio means nothing there).
The JSON goes to --out, else $OUT/nccl_sweep.json where $OUT is set, else bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import result_path, write_result  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def sizes_bytes(min_kib: float, max_mib: float) -> list[int]:
    """Buffer sizes in bytes from min_kib KiB to max_mib MiB, by factors of 4 (both ends kept)."""
    lo, hi = int(min_kib * 1024), int(max_mib * 2**20)
    if lo < 2 or hi < lo:
        raise ValueError(f"sizes: need 2 bytes <= --min-kib ({min_kib} KiB) <= --max-mib ({max_mib} MiB)")
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= 4
    out.append(hi)
    return out


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests' busbw / algbw: 2 (n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter."""
    share = (world - 1) / world
    return 2 * share if collective == "all_reduce" else share


def predicted_s(collective: str, nbytes: float, world: int, gpu_name: str) -> float:
    """The planner's seconds for one collective of an `nbytes` buffer on `world` GPUs of one NVLink domain."""
    from musubi.plan.catalog import get_gpu
    from musubi.plan.cluster import make_cluster
    from musubi.plan.comm import all_reduce_s, place_group, reduce_scatter_s
    from musubi.plan.efficiency import DEFAULT_EFFICIENCY

    cluster = make_cluster(get_gpu(gpu_name), max(world, 2))
    link = place_group(cluster, DEFAULT_EFFICIENCY, 1, world)
    if collective == "all_reduce":
        return all_reduce_s(nbytes, link)
    return reduce_scatter_s(nbytes, link)


def time_collective(torch: Any, dist: Any, collective: str, nbytes: int, world: int, device: str,
                    warmup: int, iters: int) -> float:
    """Seconds per call of one collective on a bf16 buffer of `nbytes` (rounded to whole elements per rank)."""
    numel = max(world, nbytes // 2 // world * world)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32  # gloo reduces no bf16
    full = torch.ones(numel, device=device, dtype=dtype)
    shard = torch.ones(numel // world, device=device, dtype=dtype)
    if collective == "all_reduce":
        def call() -> None:
            dist.all_reduce(full)
    elif collective == "all_gather":
        def call() -> None:
            dist.all_gather_into_tensor(full, shard)
    else:
        def call() -> None:
            dist.reduce_scatter_tensor(shard, full)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()
        dist.barrier()

    for _ in range(warmup):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    if device != "cpu":
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    # every rank waits for the slowest: report the largest of the ranks' times, as nccl-tests does
    t = torch.tensor([elapsed], dtype=torch.float64, device=device if device != "cpu" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def sweep(device: str, gpu: str, min_kib: float, max_mib: float, warmup: int, iters: int) -> dict[str, Any]:
    """All (collective, size) rows of this rank's world, measured and predicted."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dev = f"cuda:{torch.cuda.current_device()}"
    rows = []
    for collective in COLLECTIVES:
        for nbytes in sizes_bytes(min_kib, max_mib):
            t = time_collective(torch, dist, collective, nbytes, world, dev, warmup, iters)
            p = predicted_s(collective, nbytes, world, gpu)
            algbw = nbytes / t / 1e9
            rows.append({"collective": collective, "bytes": nbytes, "seconds": t, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * bus_factor(collective, world), "predicted_s": p,
                         "measured_over_predicted": t / p})
    card = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "card": card, "gpu": gpu, "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else "",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Measure and write the JSON (rank 0 only); 2 on a bad option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpu", default="H200", help="catalog GPU whose NVLink tier the prediction uses")
    parser.add_argument("--min-kib", type=float, default=64.0, help="smallest buffer, KiB")
    parser.add_argument("--max-mib", type=float, default=1024.0, help="largest buffer, MiB")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, help="result JSON (default: $OUT/nccl_sweep.json or bench/results)")
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.iters < 1:
        print("error: --warmup must be >= 0 and --iters >= 1", file=sys.stderr)
        return 2
    if "WORLD_SIZE" not in os.environ:
        print("error: run under torchrun (torchrun --nproc-per-node 2 bench/nccl_sweep.py ...)", file=sys.stderr)
        return 2
    try:
        sizes_bytes(args.min_kib, args.max_mib)
        from musubi.plan.catalog import get_gpu

        get_gpu(args.gpu)
    except Exception as exc:  # a bad size range or an unknown GPU: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU; use --device cpu to check the script", file=sys.stderr)
        return 2
    result = sweep(args.device, args.gpu, args.min_kib, args.max_mib, args.warmup, args.iters)
    if result["rank"] != 0:
        return 0
    for r in result["rows"]:
        print(f"{r['collective']:15s} {r['bytes']:>12d} B  {r['seconds'] * 1e6:10.1f} us  busbw "
              f"{r['busbw_gbps']:7.1f} GB/s  predicted {r['predicted_s'] * 1e6:10.1f} us  "
              f"x{r['measured_over_predicted']:.2f}", flush=True)
    write_result(result, result_path(args.out, "nccl_sweep.json", "nccl-sweep-{date}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
