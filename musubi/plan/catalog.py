"""The hardware catalog: peak FLOP/s, memory and the bandwidth of each tier, per GPU (data/gpus.yaml)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from musubi.plan.errors import PlanError

CATALOG_PATH = Path(__file__).with_name("data") / "gpus.yaml"

_REQUIRED = ("peak_tflops", "memory_gib", "hbm_gbps", "nvlink_gbps", "nvlink_domain", "gpus_per_node",
             "pcie_gbps", "nic_gbps")


@dataclass(frozen=True)
class GPU:
    """One catalog entry; bandwidths in GB/s per GPU and per direction, peaks dense."""

    name: str
    peak_tflops: dict[str, float]
    memory_gib: float
    hbm_gbps: float
    nvlink_gbps: float
    nvlink_domain: int
    gpus_per_node: int
    pcie_gbps: float
    nic_gbps: float
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = field(default=(), compare=False)
    #: Achieved fractions of peak measured on this GPU by public micro-benchmarks (`matmul`: large
    #: bf16 GEMM, `flash`: FlashAttention fwd+bwd); they replace Efficiency's global default for it.
    achieved: dict[str, float] = field(default_factory=dict, compare=False)

    def peak(self, precision: str) -> float:
        """Dense tensor-core peak in FLOP/s for `precision` (bf16, fp16, fp8, tf32, fp32)."""
        if precision not in self.peak_tflops:
            known = ", ".join(sorted(self.peak_tflops))
            raise PlanError(f"{self.name} has no {precision} peak in the catalog; known: {known}")
        return self.peak_tflops[precision] * 1e12


def _gpu_from(name: str, raw: dict[str, Any]) -> GPU:
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise PlanError(f"catalog entry {name}: missing {', '.join(missing)}")
    return GPU(
        name=name,
        peak_tflops={str(k): float(v) for k, v in raw["peak_tflops"].items()},
        memory_gib=float(raw["memory_gib"]),
        hbm_gbps=float(raw["hbm_gbps"]),
        nvlink_gbps=float(raw["nvlink_gbps"]),
        nvlink_domain=int(raw["nvlink_domain"]),
        gpus_per_node=int(raw["gpus_per_node"]),
        pcie_gbps=float(raw["pcie_gbps"]),
        nic_gbps=float(raw["nic_gbps"]),
        aliases=tuple(str(a) for a in raw.get("aliases", ())),
        sources=tuple(str(s) for s in raw.get("sources", ())),
        achieved={str(k): float(v) for k, v in (raw.get("achieved") or {}).items()},
    )


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> dict[str, GPU]:
    """Every GPU of the catalog file, by canonical name."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {name: _gpu_from(name, entry) for name, entry in raw.items()}


def gpu_names() -> list[str]:
    """Canonical names of the catalog, in file order."""
    return list(load_catalog())


def get_gpu(name: str) -> GPU:
    """The catalog GPU for a name or alias (case-insensitive); the error suggests the nearest name."""
    catalog = load_catalog()
    wanted = name.strip().lower()
    for gpu in catalog.values():
        if wanted == gpu.name.lower() or wanted in (a.lower() for a in gpu.aliases):
            return gpu
    names = list(catalog)
    close = difflib.get_close_matches(name, names + [a for g in catalog.values() for a in g.aliases], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise PlanError(f"unknown GPU {name!r}{hint}; known: {', '.join(names)}")


#: CUDA/NVML device names (without "NVIDIA ") -> catalog names, first match wins. Device names
#: are not catalog names: "NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe" the card.
_DEVICE_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("GB200",), "GB200-NVL72"),
    (("B200",), "B200"),
    (("H200",), "H200"),
    (("H100", "PCIE"), "H100-PCIe"),
    (("H100",), "H100-SXM"),
    (("A100", "80GB"), "A100-80GB"),
    (("A100",), "A100-40GB"),
    (("RTX PRO 6000",), "RTX-PRO-6000-Blackwell"),
    (("A6000",), "RTX-A6000"),
    (("L40S",), "L40S"),
)


def gpu_for_device(device_name: str) -> GPU | None:
    """The catalog entry of a GPU as torch/NVML name it ("NVIDIA H200"), or None if the catalog lacks it."""
    upper = device_name.upper().replace("NVIDIA ", "").strip()
    for needles, name in _DEVICE_RULES:
        if all(n in upper for n in needles):
            return load_catalog().get(name)
    return None
