"""Program of the communication check: check an all-reduce's sum, then time it.

Two ways to run it, both through NCCL's own ring/tree over the same links:

* `--single` (default for GPUs on one node): ONE process drives every visible GPU through
  `torch.cuda.nccl.all_reduce` (ncclCommInitAll). No torchrun agent, no rendezvous and one torch
  import instead of N: it answers in a few seconds, which is what a preflight must do.
* under torchrun (`python -m torch.distributed.run --nproc-per-node N -m musubi.preflight.allreduce_probe`),
  one process per rank: the only way for gloo on CPU ranks and across nodes.

Rank 0 (or the single process) writes the measurement to F (JSON); a rank that fails writes
F.rank{r}.err; every rank writes its pid to F.rank{r}.pid first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

from musubi.contract.exits import EXIT_FAILED, EXIT_OK


def busbw_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth in GB/s (nccl-tests: algbw x 2(n-1)/n, comparable across rank counts)."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def _measure(backend: str, nbytes: int, iters: int, warmup: int, timeout_s: float) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    timeout = dt.timedelta(seconds=timeout_s)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)

        def sync() -> None:
            return None

    try:
        world = dist.get_world_size()
        numel = max(1, nbytes // 4)
        # Rank r adds r+1: every element must be n(n+1)/2 exactly (small integers are exact in fp32).
        # A broken P2P path (IOMMU, ACS) corrupts data silently; this catches it before training does.
        x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)  # also creates the communicator, so init time stays out of the timing
        correct = bool(torch.all(x == world * (world + 1) / 2).item())
        x.zero_()  # zeros stay zeros however many rounds run: no overflow in the timed loop
        for _ in range(warmup):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        seconds = (time.perf_counter() - t0) / iters
        # The slowest rank's time and any rank's wrong sum decide (float64: exact flags).
        stats = torch.tensor([seconds, 0.0 if correct else 1.0], dtype=torch.float64, device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        seconds, correct = float(stats[0].item()), stats[1].item() == 0.0
    finally:
        dist.destroy_process_group()
    return {"backend": backend, "ranks": world, "nbytes": numel * 4, "seconds": seconds,
            "busbw_gbps": busbw_gbps(numel * 4, seconds, world), "correct": correct}


def _measure_single(nbytes: int, iters: int, warmup: int) -> dict[str, object]:
    """All visible GPUs from this one process: same sum check and timing as the per-rank version."""
    import torch
    from torch.cuda import nccl

    world = torch.cuda.device_count()
    if world < 2:
        raise RuntimeError(f"the single-process probe needs 2 or more visible GPUs, found {world}")
    numel = max(1, nbytes // 4)
    xs = [torch.full((numel,), float(i + 1), dtype=torch.float32, device=f"cuda:{i}") for i in range(world)]

    def sync() -> None:
        for i in range(world):
            torch.cuda.synchronize(i)

    nccl.all_reduce(xs)  # creates (and caches) the communicators: init stays out of the timing
    sync()
    correct = all(bool(torch.all(x == world * (world + 1) / 2).item()) for x in xs)
    for x in xs:
        x.zero_()
    for _ in range(warmup):
        nccl.all_reduce(xs)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        nccl.all_reduce(xs)
    sync()
    seconds = (time.perf_counter() - t0) / iters
    return {"backend": "nccl", "ranks": world, "nbytes": numel * 4, "seconds": seconds,
            "busbw_gbps": busbw_gbps(numel * 4, seconds, world), "correct": correct, "launcher": "single"}


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the probe; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="musubi-allreduce-probe")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    ap.add_argument("--bytes", type=int, default=64 << 20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--single", action="store_true", help="one process drives every visible GPU (nccl only)")
    args = ap.parse_args(argv)
    if args.single and args.backend != "nccl":
        ap.error("--single needs --backend nccl")
    rank = int(os.environ.get("RANK", "0"))
    # torchrun starts each rank in its own session: the parent needs the pid to kill a hung rank.
    Path(f"{args.out}.rank{rank}.pid").write_text(str(os.getpid()), encoding="utf-8")
    try:
        result = (_measure_single(args.bytes, args.iters, args.warmup) if args.single
                  else _measure(args.backend, args.bytes, args.iters, args.warmup, args.timeout_s))
    except Exception as e:  # noqa: BLE001 - reported to the parent as a finding, with its type
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        Path(f"{args.out}.rank{rank}.err").write_text(msg[:2000], encoding="utf-8")
        print(f"rank {rank}: {msg}", file=sys.stderr)
        return EXIT_FAILED
    if rank == 0:
        from musubi.store.rundir import write_json

        write_json(args.out, result)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
