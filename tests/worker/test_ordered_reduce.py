"""The deterministic gradient all-reduce: the same sums whatever DDP's bucket layout (4 gloo ranks).

A resumed run's first step uses DDP's initial buckets while the uninterrupted run is on rebuilt
ones; with 3+ ranks a ring all-reduce then rounds differently. Here two DDP models differ only in
their bucket size (so every gradient lands at other offsets of other buckets): with the ordered
hook their averaged gradients are bitwise equal, and equal DDP's mean up to rounding.

Plain DDP does not round differently in this small case on gloo (its sums happened to agree); the
divergence it fixes was seen on whole jobs: resnet18 on 4 gloo ranks, stopped at step 3 and resumed,
differed from the uninterrupted run in 137 of 208 checkpoint tensors without the hook and in none of
its weights with it (2026-11-26). The GPU tier checks the same on 4 GPUs with NCCL.
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grads(bucket_cap_mb: float, ordered: bool) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from musubi.worker.ordered_reduce import ordered_allreduce_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    if ordered:
        ddp.register_comm_hook(None, ordered_allreduce_hook)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    # values of very different magnitudes: the order of the additions shows in the rounding
    x = torch.randn(32, 512, generator=g) * (10.0 ** (dist.get_rank() * 3))
    ddp(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    del ddp
    gc.collect()  # gloo: no DDP reducer may outlive destroy_process_group (it would hang there)
    return grads


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = {}
        for ordered in (False, True):
            small, big = _grads(1.0, ordered), _grads(25.0, ordered)  # 1 vs 4 buckets
            result[ordered] = all(torch.equal(a, b) for a, b in zip(small, big, strict=True))
            # and the hook computes the mean DDP would (up to rounding)
            if ordered:
                plain = _grads(25.0, False)
                result["close"] = all(torch.allclose(a, b, rtol=1e-5, atol=1e-3) for a, b in zip(big, plain, strict=True))
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def test_ordered_hook_makes_gradients_independent_of_bucket_layout(tmp_path: Path) -> None:
    out = tmp_path / "result.pt"
    # Forked from a server that imported torch once, not 4 interpreters importing it each (~5 s of CPU apiece);
    # fresh processes all the same (not forks of this test process and its threads).
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel"])
    mp.start_processes(_worker, args=(4, _free_port(), str(out)), nprocs=4, start_method="forkserver", join=True)
    result = torch.load(out)
    assert result[True], "ordered all-reduce: gradients depend on the bucket layout"
    assert result["close"], "ordered all-reduce is not DDP's mean"
