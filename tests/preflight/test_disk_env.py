"""Disk and environment checks on crafted readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.preflight.checks.disk import check_disk, checkpoint_bytes_estimate
from musubi.preflight.checks.environment import check_env
from musubi.preflight.read.machine import nodes_from_env, read_disk
from musubi.preflight.readings import DiskReading, EnvReading
from musubi.preflight.result import Status

from .crafted import GiB, only

RUN = Path("/data/runs/r1")


def disk(free: float, total: float = 1000, writable: bool = True) -> DiskReading:
    return DiskReading(path=RUN, probed=Path("/data/runs"), free_bytes=int(free * GiB), total_bytes=int(total * GiB),
                       writable=writable)


def test_too_little_space_for_kept_checkpoints_fails() -> None:
    r = only(check_disk(disk(30), ckpt_bytes=10 * GiB, keep=3))
    assert (r.check, r.status) == ("disk", Status.FAIL)
    assert r.found == ("30.0 GiB free of 1000.0 GiB at /data/runs (for /data/runs/r1); the run needs "
                       "3+1 checkpoints x 10.0 GiB = 40.0 GiB")
    assert r.fix == "free 10.0 GiB, lower checkpoint.keep_last, or choose another --out"


def test_little_headroom_warns_and_enough_passes() -> None:
    assert only(check_disk(disk(50), 10 * GiB, 3)).status is Status.WARN
    assert only(check_disk(disk(500), 10 * GiB, 3)).status is Status.PASS


def test_unwritable_out_fails_and_low_space_without_estimate_warns() -> None:
    r = only(check_disk(disk(500, writable=False), None, 3))
    assert r.status is Status.FAIL and r.found == "/data/runs (for /data/runs/r1) is not writable by this user"
    low = only(check_disk(disk(2), None, 3))
    assert low.status is Status.WARN and low.found.endswith("(no checkpoint estimate given)")


def test_read_disk_probes_the_nearest_existing_parent(tmp_path: Path) -> None:
    d = read_disk(tmp_path / "not" / "yet")
    assert d.probed == tmp_path and d.free_bytes > 0 and d.writable
    assert checkpoint_bytes_estimate(1_000_000) == 12_000_000  # fp32 weights + 2 AdamW slots


def env(nodes: int = 1, ranks: int = 8, cpus: int = 64, names: tuple[str, ...] = (), **variables: str) -> EnvReading:
    return EnvReading(variables=variables, nodes=nodes, ranks_per_node=ranks, cpu_count=cpus, gpu_names=names)


@pytest.mark.parametrize(("variables", "nodes", "check", "status", "found"), [
    ({"NCCL_P2P_DISABLE": "1"}, 1, "env.NCCL_P2P_DISABLE", Status.WARN,
     "NCCL_P2P_DISABLE=1: GPU-to-GPU traffic goes through host memory (all-reduce several times slower)"),
    ({"NCCL_IB_DISABLE": "1"}, 2, "env.NCCL_IB_DISABLE", Status.WARN,
     "NCCL_IB_DISABLE=1 on a 2-node job: InfiniBand/RoCE off, nodes talk over TCP sockets (10x+ slower)"),
    ({"NCCL_SOCKET_IFNAME": "lo"}, 4, "env.NCCL_SOCKET_IFNAME", Status.FAIL,
     "NCCL_SOCKET_IFNAME=lo on a 4-node job: other nodes cannot reach the loopback interface"),
    ({"GLOO_SOCKET_IFNAME": "lo"}, 2, "env.GLOO_SOCKET_IFNAME", Status.FAIL,
     "GLOO_SOCKET_IFNAME=lo on a 2-node job: gloo (CPU collectives, checkpoint staging) binds to loopback, "
     "other nodes cannot reach it"),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, 1, "env.CUDA_LAUNCH_BLOCKING", Status.WARN,
     "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the GPU (training several times slower)"),
    ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, 1, "env.TORCH_NCCL_BLOCKING_WAIT", Status.WARN,
     "TORCH_NCCL_BLOCKING_WAIT=1: the CPU blocks on every collective and the NCCL watchdog is off"),
    ({"OMP_NUM_THREADS": "64"}, 1, "env.OMP_NUM_THREADS", Status.WARN,
     "OMP_NUM_THREADS=64 x 8 ranks = 512 threads on 64 cores: oversubscribed (slow data loading and ops)"),
    ({"OMP_NUM_THREADS": "all"}, 1, "env.OMP_NUM_THREADS", Status.WARN,
     "OMP_NUM_THREADS='all' is not a positive integer"),
    ({"NCCL_DEBUG": "INFO"}, 1, "env.NCCL_DEBUG", Status.WARN, "NCCL_DEBUG=INFO: thousands of log lines per rank"),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, 1, "env.TORCH_NCCL_ASYNC_ERROR_HANDLING", Status.WARN,
     "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: a failed or timed-out collective hangs forever instead of ending the job"),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 1, "env.TORCH_NCCL_TRACE_BUFFER_SIZE", Status.WARN,
     "TORCH_NCCL_TRACE_BUFFER_SIZE=0: the flight recorder is off, a hang leaves no dump"),
    ({"MASTER_ADDR": "localhost"}, 2, "env.MASTER_ADDR", Status.FAIL,
     "MASTER_ADDR=localhost on a 2-node job: other nodes cannot reach it"),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, 1, "env.TORCH_DISTRIBUTED_DEBUG", Status.WARN,
     "TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective is checked across ranks first (a sync per call)"),
    ({"NCCL_ALGO": "Ring"}, 1, "env.NCCL_ALGO", Status.WARN,
     "NCCL_ALGO=Ring overrides NCCL's tuning (much slower at some message sizes)"),
])
def test_trap_variables_are_named_with_their_values(variables, nodes, check, status, found) -> None:
    r = only(check_env(env(nodes=nodes, **variables)))
    assert (r.check, r.status, r.found) == (check, status, found)
    assert r.fix


def test_node_local_variables_do_not_warn_on_one_node() -> None:
    r = only(check_env(env(nodes=1, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")))
    assert r.status is Status.PASS and "NCCL_IB_DISABLE=1" in r.found
    assert only(check_env(env(nodes=2, NCCL_SOCKET_IFNAME="^lo,docker"))).status is Status.PASS


def test_mixed_gpus_without_pci_bus_order_warn() -> None:
    r = only(check_env(env(names=("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"))))
    assert r.check == "env.CUDA_DEVICE_ORDER" and r.fix == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"


def test_nodes_come_from_the_scheduler_or_launcher() -> None:
    assert nodes_from_env({"SLURM_NNODES": "4"}) == 4
    assert nodes_from_env({"PET_NNODES": "2:8"}) == 8
    assert nodes_from_env({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}) == 2
    assert nodes_from_env({}) == 1
