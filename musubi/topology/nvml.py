"""GPU readings from NVML (no CUDA context is created): models, memory, processes, health, topology.

Read by the preflight (which judges them) and by the topology reader (which falls back to NVML's links
when `nvidia-smi topo -m` is not there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from musubi.topology.kernel_log import bus_key, read_xids
from musubi.topology.model import NodeTopology


@dataclass(frozen=True)
class ProcessReading:
    """A compute process holding memory on a GPU."""

    pid: int
    used_bytes: int | None  # None where NVML cannot attribute memory (containers)
    name: str = ""


@dataclass(frozen=True)
class GpuReading:
    """One physical GPU as NVML reports it (index = nvidia-smi's number)."""

    index: int
    name: str
    uuid: str
    memory_total: int  # bytes
    memory_used: int  # bytes, by anyone
    capability: tuple[int, int]  # (major, minor): (9, 0) is sm_90
    pci_bus_id: str = ""
    processes: tuple[ProcessReading, ...] = ()
    ecc_uncorrected: int | None = None  # volatile (since driver load) uncorrected errors; None: not reported
    remap_pending: bool | None = None  # a row remap / page retirement waits for a GPU reset
    remap_failed: bool | None = None  # a row remap failed: the memory is bad
    clock_events: tuple[str, ...] = ()  # active throttle reasons, e.g. ('HwThermalSlowdown',)
    mig_enabled: bool | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    xids: tuple[int, ...] | None = None  # Xid codes in the kernel log since boot; None: log not readable
    error: str | None = None  # NVML could not read this GPU at all (e.g. 'GPU is lost')


@dataclass(frozen=True)
class NvmlReading:
    """All GPUs of the machine, or why NVML could not be read."""

    available: bool
    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None  # e.g. 'NVML Shared Library Not Found'
    driver_version: str | None = None  # e.g. '570.124.06'
    driver_cuda_version: str | None = None  # newest CUDA the driver supports natively, e.g. '12.8'


# pynvml's NVML_P2P_CAPS_INDEX_READ is a one-element tuple (a stray comma), so the indices are spelled here.
_P2P_READ, _P2P_NVLINK = 0, 2
_P2P_STATUS = {0: "OK", 1: "chipset does not support P2P", 2: "GPU does not support P2P",
               3: "PCIe topology does not support P2P", 4: "disabled by the driver (registry key)",
               5: "not supported", 6: "unknown"}
# NVML common-ancestor levels in `nvidia-smi topo -m` words.
_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_CLOCK_EVENTS = ("GpuIdle", "ApplicationsClocksSetting", "SwPowerCap", "HwSlowdown", "SyncBoost",
                 "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown", "DisplayClockSetting")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_nvml(with_xids: bool = True) -> tuple[NvmlReading, NodeTopology]:
    """Every GPU of the machine and how they are linked; an unavailable NVML is a reading, not an error."""
    try:
        import pynvml
    except ImportError:
        return NvmlReading(False, error="nvidia-ml-py is not installed"), NodeTopology()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return NvmlReading(False, error=_text(e)), NodeTopology()

    def get(fn: Callable[..., Any], *args: Any) -> Any:
        # Many queries are unsupported on some boards (ECC on GeForce, remapping before Ampere): None.
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    try:
        driver = get(pynvml.nvmlSystemGetDriverVersion)
        cuda = get(pynvml.nvmlSystemGetCudaDriverVersion_v2) or get(pynvml.nvmlSystemGetCudaDriverVersion)
        xids = read_xids() if with_xids else None
        gpus, handles = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpus.append(_read_gpu(pynvml, get, i, h, xids))
                handles.append(h)
            except pynvml.NVMLError as e:
                # One lost GPU (fallen off the bus) is a finding about that GPU, not a reason to see none.
                gpus.append(GpuReading(index=i, name="?", uuid="", memory_total=0, memory_used=0,
                                       capability=(0, 0), error=_text(e)))
        healthy = [g for g in gpus if g.error is None]
        topo = _read_topology(pynvml, get, handles, [g.pci_bus_id for g in healthy], [g.index for g in healthy])
        reading = NvmlReading(
            True, gpus=tuple(gpus), driver_version=_text(driver) if driver else None,
            driver_cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        )
        return reading, topo
    except pynvml.NVMLError as e:
        return NvmlReading(False, error=_text(e)), NodeTopology()
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _read_gpu(pynvml: Any, get: Callable[..., Any], index: int, h: Any,
              xids: dict[str, tuple[int, ...]] | None) -> GpuReading:
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    pci = get(pynvml.nvmlDeviceGetPciInfo, h)
    bus = _text(pci.busId) if pci is not None else ""
    procs = []
    for p in get(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or ():
        name = get(pynvml.nvmlSystemGetProcessName, p.pid)
        procs.append(ProcessReading(pid=int(p.pid), used_bytes=p.usedGpuMemory, name=_text(name) if name else ""))
    ecc = get(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
              pynvml.NVML_VOLATILE_ECC)
    rows = get(pynvml.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failed), Ampere+
    pages_pending = get(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)  # before Ampere
    pending = None if rows is None and pages_pending is None else bool((rows and rows[2]) or pages_pending)
    events_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = get(events_fn, h) or 0
    events = tuple(n for n in _CLOCK_EVENTS if mask & getattr(pynvml, f"nvmlClocksThrottleReason{n}", 0))
    mig = get(pynvml.nvmlDeviceGetMigMode, h)
    cap = get(pynvml.nvmlDeviceGetCudaComputeCapability, h) or (0, 0)
    return GpuReading(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(h)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
        memory_total=int(mem.total),
        memory_used=int(mem.used),
        capability=(int(cap[0]), int(cap[1])),
        pci_bus_id=bus,
        processes=tuple(procs),
        ecc_uncorrected=int(ecc) if ecc is not None else None,
        remap_pending=pending,
        remap_failed=bool(rows[3]) if rows is not None else None,
        clock_events=events,
        mig_enabled=bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE) if mig is not None else None,
        pcie_gen_max=get(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        pcie_width_max=get(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        xids=None if xids is None else xids.get(bus_key(bus), ()) if bus else None,
    )


def _nvlinks(pynvml: Any, get: Callable[..., Any], h: Any) -> list[str]:
    """Remote bus id of each active NVLink of one GPU (a GPU's, or an NVSwitch's)."""
    remotes = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if get(pynvml.nvmlDeviceGetNvLinkState, h, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        pci = get(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        remotes.append(bus_key(_text(pci.busId)) if pci is not None else "?")
    return remotes


def _read_topology(pynvml: Any, get: Callable[..., Any], handles: list[Any], buses: list[str],
                   index: list[int]) -> NodeTopology:
    """Pairwise links (NV# from NVLink state, else the PCIe common ancestor) and P2P read status."""
    if len(handles) < 2:
        return NodeTopology(source="nvml")
    gpu_keys = [bus_key(b) for b in buses]
    remotes = [_nvlinks(pynvml, get, h) for h in handles]
    links: dict[tuple[int, int], str] = {}
    p2p: dict[tuple[int, int], str] = {}
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            direct = sum(r == gpu_keys[j] for r in remotes[i])
            # Links to something that is not a GPU of this machine go to an NVSwitch: all pairs share them.
            switched_i = sum(r not in gpu_keys for r in remotes[i])
            switched_j = sum(r not in gpu_keys for r in remotes[j])
            nv = direct or min(switched_i, switched_j)
            pair = (index[i], index[j])
            if nv and get(pynvml.nvmlDeviceGetP2PStatus, handles[i], handles[j], _P2P_NVLINK) == 0:
                links[pair] = f"NV{nv}"
            else:
                level = get(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
                if level is not None:
                    links[pair] = _LEVEL.get(int(level), "SYS")
            status = get(pynvml.nvmlDeviceGetP2PStatus, handles[i], handles[j], _P2P_READ)
            if status is not None:
                p2p[pair] = _P2P_STATUS.get(int(status), "unknown")
    return NodeTopology(links=links, p2p=p2p, source="nvml")
