"""The input layer on crafted sources: an NVML library that answers like a 4-GPU NVSwitch box, kernel logs."""

from __future__ import annotations

import sys
import types
from typing import Any

import pynvml
import pytest

from musubi.topology.kernel_log import bus_key, parse_xids
from musubi.topology.nvml import read_nvml

GiB = 2**30


class FakeNvml(types.ModuleType):
    """pynvml's constants and error type, with functions answering for crafted GPUs (names checked against pynvml)."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        super().__init__("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlClocks")) or name.startswith("NVMLError"):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith("nvmlClocks"):
            assert hasattr(pynvml, name), f"pynvml has no {name}: the reader would fail on a real machine"
        return super().__getattribute__(name)

    def _raise(self, code: int) -> None:
        raise pynvml.NVMLError(code)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: return "580.82.07"
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: return 13000
    def nvmlDeviceGetCount(self) -> int: return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if self.gpus[i].get("lost"):
            self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetName(self, h: int) -> str: return "NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetUUID(self, h: int) -> str: return f"GPU-{h:04d}"
    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(total=80 * GiB, used=self.gpus[h].get("used", 0), free=0)
    def nvmlDeviceGetPciInfo(self, h: int) -> Any: return types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")
    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.gpus[h].get("procs", [])]
    def nvmlSystemGetProcessName(self, pid: int) -> bytes: return b"/usr/bin/python3"
    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return self.gpus[h].get("ecc", 0)
    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]: return (0, 0, self.gpus[h].get("pending", 0), 0)
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int: self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int: return self.gpus[h].get("clocks", 0x1)
    def nvmlDeviceGetMigMode(self, h: int) -> list[int]: return [0, 0]
    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]: return (9, 0)
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int: return 5
    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int: return 16

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        return pynvml.NVML_FEATURE_ENABLED if link < 18 else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return types.SimpleNamespace(busId=f"00000000:{0xA0 + link % 4:02X}:00.0")  # NVSwitches, not GPUs

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert isinstance(index, int)  # pynvml's READ constant is a tuple; the reader must pass an int
        return self.gpus[a].get("p2p", pynvml.NVML_P2P_STATUS_OK)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int: return pynvml.NVML_TOPOLOGY_SYSTEM


def _read(monkeypatch: pytest.MonkeyPatch, gpus: list[dict[str, Any]]):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
    return read_nvml(with_xids=False)


def test_nvml_reader_builds_readings_and_an_nvswitch_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [{}, {"procs": [(4242, 3 * GiB)], "used": 3 * GiB}, {"ecc": 2, "pending": 1}, {"clocks": 0x40 | 0x1}]
    nv, topo = _read(monkeypatch, gpus)
    assert nv.available and nv.driver_version == "580.82.07" and nv.driver_cuda_version == "13.0"
    g0, g1, g2, g3 = nv.gpus
    assert (g0.name, g0.uuid, g0.capability, g0.memory_total, g0.pci_bus_id) == (
        "NVIDIA H100 80GB HBM3", "GPU-0000", (9, 0), 80 * GiB, "00000000:18:00.0")
    assert g1.processes[0].pid == 4242 and g1.processes[0].used_bytes == 3 * GiB and g1.processes[0].name
    assert g2.ecc_uncorrected == 2 and g2.remap_pending is True and g2.remap_failed is False
    assert g3.clock_events == ("GpuIdle", "HwThermalSlowdown") and g0.mig_enabled is False
    assert topo.source == "nvml" and topo.link(0, 3) == "NV18" and topo.p2p_status(1, 2) == "OK"


def test_a_lost_gpu_and_p2p_off_are_readings_not_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    nv, topo = _read(monkeypatch, [{"p2p": pynvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY}, {}, {"lost": True}])
    assert nv.available and nv.gpus[2].error == str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert topo.link(0, 1) == "SYS"  # NVLink present but P2P over it refused: the PCIe path is what counts
    assert topo.p2p_status(0, 1) == "disabled by the driver (registry key)" and topo.link(0, 2) is None


def test_xids_are_matched_to_gpus_by_pci_bus() -> None:
    log = ("[  12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "[  99.0] NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception\n")
    xids = parse_xids(log)
    assert xids[bus_key("00000000:3B:00.0")] == (79,) and xids[bus_key("0000:18:00")] == (13,)
