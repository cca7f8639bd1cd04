"""Communication check: the all-reduce works, sums exactly, and reaches the bandwidth the topology promises."""

from __future__ import annotations

from collections.abc import Mapping

from musubi.preflight.readings import CommReading, TopologyReading
from musubi.preflight.reference import (
    BUSBW_EFFICIENCY,
    BUSBW_WARN_RATIO,
    NVLINK_GBPS_PER_LINK,
    PCIE_GBPS_PER_LANE,
    PCIE_PATH_FACTOR,
    SLOWDOWN_REASONS,
)
from musubi.preflight.result import CheckResult, fail, passed, warn
from musubi.preflight.units import indices, ms, size
from musubi.topology.nvml import GpuReading

_TRUE = {"1", "true", "yes", "on"}
#: Variables that override NCCL's own choice of algorithm, protocol or channels.
NCCL_OVERRIDES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_NTHREADS")


def promised_busbw(gpus: list[GpuReading], topo: TopologyReading) -> tuple[float, str] | None:
    """(GB/s, which link) an all-reduce over these GPUs should reach: the weakest link bounds the ring."""
    idx = [g.index for g in gpus]
    pairs = [(a, b) for n, a in enumerate(idx) for b in idx[n + 1:]]
    links = [topo.link(a, b) for a, b in pairs]
    if not pairs or any(link is None for link in links):
        return None
    nv = [int(link[2:]) for link in links if link and link.startswith("NV") and link[2:].isdigit()]
    if len(nv) == len(links):
        major = min(g.capability[0] for g in gpus)
        per_link = NVLINK_GBPS_PER_LINK.get(major, 25.0)
        return min(nv) * per_link * BUSBW_EFFICIENCY, f"NVLink (NV{min(nv)})"
    pcie = [link for link in links if link and not link.startswith("NV")]
    worst = min(pcie, key=lambda link: PCIE_PATH_FACTOR.get(link, 0.4))
    gens = [g.pcie_gen_max for g in gpus if g.pcie_gen_max]
    widths = [g.pcie_width_max for g in gpus if g.pcie_width_max]
    # Unknown generation or width: assume PCIe 3 x16, the slowest link a training GPU sits on.
    gen, width = (min(gens) if gens else 3), (min(widths) if widths else 16)
    gbps = PCIE_GBPS_PER_LANE.get(gen, 0.985) * width * BUSBW_EFFICIENCY * PCIE_PATH_FACTOR.get(worst, 0.4)
    return gbps, f"PCIe gen{gen} x{width} via {worst}"


def likely_cause(comm: CommReading, topo: TopologyReading, gpus: list[GpuReading], env: Mapping[str, str]) -> str:
    """The most likely reason an all-reduce is slow or stuck, from the variables, P2P status and NCCL's log."""
    if env.get("NCCL_P2P_DISABLE", "").strip().lower() in _TRUE:
        return f"NCCL_P2P_DISABLE={env['NCCL_P2P_DISABLE']} is set: unset it"
    if env.get("NCCL_P2P_LEVEL", "").strip().upper() in {"LOC", "0"}:
        return f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} turns P2P off: unset it"
    idx = [g.index for g in gpus]
    off = [(a, b, topo.p2p_status(a, b)) for n, a in enumerate(idx) for b in idx[n + 1:]
           if topo.p2p_status(a, b) not in (None, "OK")]
    if off:
        a, b, why = off[0]
        return (f"P2P is off between GPU {a} and {b} ({why}): check IOMMU/ACS in the BIOS or the VM's P2P "
                "support (`nvidia-smi topo -p2p r`)")
    if comm.transports and "P2P" not in comm.transports and {"SHM", "NET"} & set(comm.transports):
        via = "/".join(t for t in comm.transports if t != "P2P")
        return (f"NCCL moved data via {via} (host memory), not P2P: peer access is off (IOMMU/ACS, or a container "
                "without shared IPC) - see `nvidia-smi topo -p2p r`")
    forced = [f"{k}={env[k]}" for k in NCCL_OVERRIDES if k in env]
    if forced:
        return f"{', '.join(forced)} override NCCL's tuning: unset them"
    hot = [g for g in gpus if any(r in SLOWDOWN_REASONS for r in g.clock_events)]
    if hot:
        return f"GPU {indices(g.index for g in hot)} is throttled"
    shared = [g for g in gpus if g.processes]
    if shared:
        return f"GPU {indices(g.index for g in shared)} is shared with other processes"
    return (f"not found from here: compare with nccl-tests (all_reduce_perf -b 256M -e 256M -g {len(gpus)}) and "
            "`nvidia-smi topo -m`")


def check_comm(comm: CommReading | None, topo: TopologyReading, gpus: list[GpuReading],
               env: Mapping[str, str]) -> list[CheckResult]:
    """Judge the timed all-reduce: it finished, summed exactly, and was not far below the topology's promise."""
    if len(gpus) == 1:
        return [passed("comm", f"one GPU ({gpus[0].index}): nothing to all-reduce")]
    if comm is None:
        return [passed("comm", "all-reduce test not run (--no-comm)")]
    where = f"GPU {indices(g.index for g in gpus)}" if gpus else f"{comm.ranks} CPU ranks"
    what = f"{comm.backend} all-reduce over {where}"
    log = f" (log: {comm.log_path})" if comm.log_path else ""
    if comm.timed_out:
        cause = likely_cause(comm, topo, gpus, env) if gpus else "a rank could not start or reach the others"
        return [fail("comm.allreduce", f"{what} did not finish in {comm.timeout_s:.0f} s{log}",
                     f"likely cause: {cause}")]
    if comm.error is not None:
        cause = likely_cause(comm, topo, gpus, env) if gpus else "see the log"
        return [fail("comm.allreduce", f"{what} failed: {comm.error}{log}", f"likely cause: {cause}")]
    if comm.correct is False:
        return [fail("comm.allreduce", f"{what} returned wrong sums: data is corrupted between GPUs{log}",
                     "P2P is broken on this machine: disable the IOMMU/ACS for the GPUs' PCIe switches, or set "
                     "NCCL_P2P_DISABLE=1 as a slower workaround")]
    seconds, busbw = comm.seconds or 0.0, comm.busbw_gbps or 0.0
    measured = f"{what}: {size(comm.nbytes)} in {ms(seconds)}, {busbw:.1f} GB/s bus bandwidth, exact sums"
    if not gpus:
        return [passed("comm", f"{measured} (CPU ranks: no bandwidth target)")]
    promise = promised_busbw(gpus, topo)
    if promise is None:
        return [passed("comm", f"{measured} (topology unknown: no bandwidth target)")]
    target, link = promise
    if busbw < BUSBW_WARN_RATIO * target:
        return [warn("comm.bandwidth", f"{measured}: {busbw / target:.0%} of the ~{target:.0f} GB/s {link} promises",
                     f"likely cause: {likely_cause(comm, topo, gpus, env)}")]
    return [passed("comm", f"{measured} (~{target:.0f} GB/s expected over {link})")]
