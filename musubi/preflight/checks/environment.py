"""Environment check: NCCL, CUDA and torch variables that are known traps, with their values."""

from __future__ import annotations

from musubi.preflight.readings import EnvReading
from musubi.preflight.result import CheckResult, fail, passed, warn

_TRUE = {"1", "true", "yes", "on", "y"}
_LOOPBACK = {"lo", "localhost", "127.0.0.1", "::1"}


def _on(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def _selects_loopback(ifname: str) -> bool:
    """True when NCCL_SOCKET_IFNAME picks the loopback interface ('lo', 'lo0', '=lo'; '^lo' excludes it)."""
    if ifname.startswith("^"):
        return False
    names = [n.strip() for n in ifname.lstrip("=").split(",")]
    return any(n == "lo" or (not ifname.startswith("=") and n.startswith("lo")) for n in names)


def _threads(env: EnvReading) -> list[CheckResult]:
    raw = env.variables.get("OMP_NUM_THREADS")
    per_rank = max(1, env.cpu_count // max(1, env.ranks_per_node))
    if raw is None:
        return []
    if not raw.strip().isdigit() or int(raw) < 1:
        return [warn("env.OMP_NUM_THREADS", f"OMP_NUM_THREADS={raw!r} is not a positive integer",
                     f"unset it (musubi gives each rank {per_rank}) or set a number")]
    total = int(raw) * env.ranks_per_node
    if total > env.cpu_count:
        return [warn("env.OMP_NUM_THREADS", f"OMP_NUM_THREADS={raw} x {env.ranks_per_node} ranks = {total} threads "
                                            f"on {env.cpu_count} cores: oversubscribed (slow data loading and ops)",
                     f"set OMP_NUM_THREADS={per_rank} or unset it")]
    return []


def check_env(env: EnvReading) -> list[CheckResult]:
    """One WARN/FAIL per trap variable found; a PASS naming what is set when none is."""
    v = env.variables
    multi = env.nodes > 1
    out: list[CheckResult] = []

    def flag(name: str, status: str, found: str, fix: str) -> None:
        out.append((fail if status == "FAIL" else warn)(f"env.{name}", found, fix))

    if _on(v.get("NCCL_P2P_DISABLE")):
        flag("NCCL_P2P_DISABLE", "WARN", f"NCCL_P2P_DISABLE={v['NCCL_P2P_DISABLE']}: GPU-to-GPU traffic goes through "
             "host memory (all-reduce several times slower)",
             "unset it; if P2P is really broken here, fix IOMMU/ACS instead")
    if v.get("NCCL_P2P_LEVEL", "").strip().upper() in {"LOC", "0"}:
        flag("NCCL_P2P_LEVEL", "WARN", f"NCCL_P2P_LEVEL={v['NCCL_P2P_LEVEL']}: P2P is never used",
             "unset it and let NCCL pick from the topology")
    if _on(v.get("NCCL_SHM_DISABLE")):
        flag("NCCL_SHM_DISABLE", "WARN", f"NCCL_SHM_DISABLE={v['NCCL_SHM_DISABLE']}: where P2P is off, ranks on "
             "one node fall back to sockets", "unset it")
    if multi and _on(v.get("NCCL_IB_DISABLE")):
        flag("NCCL_IB_DISABLE", "WARN", f"NCCL_IB_DISABLE={v['NCCL_IB_DISABLE']} on a {env.nodes}-node job: "
             "InfiniBand/RoCE off, nodes talk over TCP sockets (10x+ slower)", "unset it")
    if multi and "NCCL_SOCKET_IFNAME" in v and _selects_loopback(v["NCCL_SOCKET_IFNAME"]):
        flag("NCCL_SOCKET_IFNAME", "FAIL", f"NCCL_SOCKET_IFNAME={v['NCCL_SOCKET_IFNAME']} on a {env.nodes}-node job: "
             "other nodes cannot reach the loopback interface", "set it to the cluster interface (eth0, ib0, ...) "
             "or unset it")
    if multi and "GLOO_SOCKET_IFNAME" in v and _selects_loopback(v["GLOO_SOCKET_IFNAME"]):
        flag("GLOO_SOCKET_IFNAME", "FAIL", f"GLOO_SOCKET_IFNAME={v['GLOO_SOCKET_IFNAME']} on a {env.nodes}-node "
             "job: gloo (CPU collectives, checkpoint staging) binds to loopback, other nodes cannot reach it",
             "set it to the cluster interface (eth0, ...) or unset it (musubi train --iface sets it)")
    if multi and v.get("NCCL_NET", "").strip().lower() == "socket":
        flag("NCCL_NET", "WARN", f"NCCL_NET={v['NCCL_NET']} on a {env.nodes}-node job: TCP sockets, not "
             "InfiniBand/RoCE", "unset it")
    if multi and v.get("MASTER_ADDR", "").strip().lower() in _LOOPBACK:
        flag("MASTER_ADDR", "FAIL", f"MASTER_ADDR={v['MASTER_ADDR']} on a {env.nodes}-node job: other nodes cannot "
             "reach it", "set it to node 0's address (or let Slurm/torchrun's rendezvous set it)")
    if _on(v.get("CUDA_LAUNCH_BLOCKING")):
        flag("CUDA_LAUNCH_BLOCKING", "WARN", f"CUDA_LAUNCH_BLOCKING={v['CUDA_LAUNCH_BLOCKING']}: every kernel launch "
             "waits for the GPU (training several times slower)", "unset it (it is for debugging)")
    for name in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"):
        if _on(v.get(name)):
            flag(name, "WARN", f"{name}={v[name]}: the CPU blocks on every collective and the NCCL watchdog is off",
                 "unset it (musubi's defaults end a hung collective with a dump)")
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        if v.get(name, "").strip() == "0":
            flag(name, "WARN", f"{name}=0: a failed or timed-out collective hangs forever instead of ending the job",
                 "unset it")
    if v.get("TORCH_NCCL_ENABLE_MONITORING", "").strip() == "0":
        flag("TORCH_NCCL_ENABLE_MONITORING", "WARN", "TORCH_NCCL_ENABLE_MONITORING=0: a stuck NCCL watchdog is "
             "never killed", "unset it")
    if v.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "").strip() == "0":
        flag("TORCH_NCCL_TRACE_BUFFER_SIZE", "WARN", "TORCH_NCCL_TRACE_BUFFER_SIZE=0: the flight recorder is off, "
             "a hang leaves no dump", "unset it (musubi sets 20000)")
    if v.get("NCCL_DEBUG", "").strip().upper() in {"INFO", "TRACE"}:
        flag("NCCL_DEBUG", "WARN", f"NCCL_DEBUG={v['NCCL_DEBUG']}: thousands of log lines per rank"
             + (" and slower collectives" if v["NCCL_DEBUG"].strip().upper() == "TRACE" else ""),
             "unset it or use NCCL_DEBUG=WARN")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        if name in v:
            flag(name, "WARN", f"{name}={v[name]} overrides NCCL's tuning (much slower at some message sizes)",
                 "unset it unless you measured it faster")
    if v.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper() == "DETAIL":
        flag("TORCH_DISTRIBUTED_DEBUG", "WARN", "TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective is checked "
             "across ranks first (a sync per call)", "unset it or use INFO")
    if len(set(env.gpu_names)) > 1 and v.get("CUDA_DEVICE_ORDER", "").strip().upper() != "PCI_BUS_ID":
        flag("CUDA_DEVICE_ORDER", "WARN", "GPU models differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
             "GPUs fastest first, nvidia-smi by PCI bus, so GPU 0 is not the same GPU", "export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    out += _threads(env)
    if not out:
        shown = [f"{k}={val}" for k, val in v.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))]
        threads = (f"OMP_NUM_THREADS={v['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in v else
                   f"OMP_NUM_THREADS unset (musubi sets {max(1, env.cpu_count // max(1, env.ranks_per_node))} "
                   "per rank)")
        out.append(passed("env", "no known-trap variables; " + ", ".join([*shown[:6], threads])))
    return out
