"""Communication check on crafted all-reduce measurements and topologies: the likely cause is named."""

from __future__ import annotations

from musubi.preflight.checks.comm import check_comm, promised_busbw
from musubi.preflight.read.comm import parse_transports
from musubi.preflight.read.topology import parse_topo_matrix
from musubi.preflight.readings import CommReading, TopologyReading
from musubi.preflight.result import Status

from .crafted import A100, gpu, only

FOUR = [gpu(i) for i in range(4)]
NVSWITCH = TopologyReading(links={(a, b): "NV18" for a in range(4) for b in range(a + 1, 4)},
                           p2p={(a, b): "OK" for a in range(4) for b in range(a + 1, 4)}, source="nvml")

TOPO_PCIE = """\
\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tPXB\t0-31\t0\t\tN/A
GPU1\tPXB\t X \t0-31\t0\t\tN/A

Legend:

  X    = Self
"""


def measured(busbw: float, **kw) -> CommReading:
    return CommReading(**{"backend": "nccl", "ranks": 4, "nbytes": 256 << 20, "seconds": 0.002,
                          "busbw_gbps": busbw, "correct": True, "transports": ("P2P",), **kw})


def test_nvlink_far_below_promise_with_p2p_disabled_warns_naming_the_variable() -> None:
    r = only(check_comm(measured(22.0, transports=("SHM",)), NVSWITCH, FOUR, {"NCCL_P2P_DISABLE": "1"}))
    assert (r.check, r.status) == ("comm.bandwidth", Status.WARN)
    assert "22.0 GB/s bus bandwidth" in r.found and "6% of the ~360 GB/s NVLink (NV18) promises" in r.found
    assert r.fix == "likely cause: NCCL_P2P_DISABLE=1 is set: unset it"


def test_p2p_off_in_nvml_is_the_likely_cause() -> None:
    topo = TopologyReading(links={(0, 1): "PXB"}, p2p={(0, 1): "disabled by the driver (registry key)"})
    r = only(check_comm(measured(2.0, ranks=2), topo, FOUR[:2], {}))
    assert r.status is Status.WARN
    assert r.fix.startswith("likely cause: P2P is off between GPU 0 and 1 (disabled by the driver (registry key))")


def test_shm_transport_without_a_variable_points_at_peer_access() -> None:
    r = only(check_comm(measured(20.0, transports=("SHM",)), NVSWITCH, FOUR, {}))
    assert r.status is Status.WARN and "NCCL moved data via SHM (host memory), not P2P" in r.fix


def test_forced_nccl_algorithm_is_named_when_nothing_else_explains() -> None:
    r = only(check_comm(measured(50.0), NVSWITCH, FOUR, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}))
    assert r.fix == "likely cause: NCCL_ALGO=Tree, NCCL_PROTO=Simple override NCCL's tuning: unset them"


def test_a_hung_all_reduce_fails_with_the_likely_cause() -> None:
    hung = CommReading("nccl", 4, timed_out=True, timeout_s=90.0, error="no result after 90 s", log_path="/tmp/x.log")
    r = only(check_comm(hung, NVSWITCH, FOUR, {"NCCL_P2P_LEVEL": "LOC"}))
    assert (r.check, r.status) == ("comm.allreduce", Status.FAIL)
    assert r.found == "nccl all-reduce over GPU 0,1,2,3 did not finish in 90 s (log: /tmp/x.log)"
    assert r.fix == "likely cause: NCCL_P2P_LEVEL=LOC turns P2P off: unset it"


def test_a_failed_all_reduce_fails_with_its_error() -> None:
    err = CommReading("nccl", 2, error="DistBackendError: NCCL error: unhandled system error")
    r = only(check_comm(err, NVSWITCH, FOUR[:2], {}))
    assert r.status is Status.FAIL and r.found.endswith("failed: DistBackendError: NCCL error: unhandled system error")


def test_wrong_sums_fail_as_corruption() -> None:
    r = only(check_comm(measured(300.0, correct=False), NVSWITCH, FOUR, {}))
    assert r.status is Status.FAIL and "returned wrong sums: data is corrupted between GPUs" in r.found
    assert "IOMMU/ACS" in r.fix


def test_pcie_topology_at_its_speed_passes() -> None:
    topo = parse_topo_matrix(TOPO_PCIE)
    assert topo.links == {(0, 1): "PXB"} and topo.source == "nvidia-smi"
    two = [gpu(0, A100, pcie_gen_max=4), gpu(1, A100, pcie_gen_max=4)]
    assert round(promised_busbw(two, topo)[0], 1) == 25.2  # gen4 x16 x 0.8
    r = only(check_comm(measured(21.0, ranks=2), topo, two, {}))
    assert r.status is Status.PASS and "(~25 GB/s expected over PCIe gen4 x16 via PXB)" in r.found


def test_one_gpu_and_cpu_ranks_have_no_bandwidth_target() -> None:
    assert only(check_comm(None, NVSWITCH, FOUR[:1], {})).found == "one GPU (0): nothing to all-reduce"
    cpu = CommReading("gloo", 2, nbytes=4 << 20, seconds=0.003, busbw_gbps=1.4, correct=True)
    r = only(check_comm(cpu, TopologyReading(), [], {}))
    assert r.status is Status.PASS and r.found.endswith("(CPU ranks: no bandwidth target)")


def test_transports_are_read_from_nccl_info_lines() -> None:
    log = ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "h:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct\n")
    assert parse_transports(log) == ("P2P", "SHM")
