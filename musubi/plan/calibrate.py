"""Calibration: replace the global efficiency constants with what one machine measured.

Input, one JSON object (every field but `gpu` optional):

    {
      "gpu": "H100-SXM",                  # catalog name the measurements were taken on
      "matmul_tflops": 700.0,             # large bf16 GEMM throughput, TFLOP/s (e.g. 8192^3)
      "hbm_gbps": 2600.0,                 # device-to-device copy bandwidth, GB/s
      "allreduce_busbw_gbps": {           # nccl-tests all_reduce_perf bus bandwidth, GB/s, large messages
        "nvlink": 360.0,                  #   inside one node
        "network": 45.0                   #   across nodes, one GPU per node (per-GPU NIC share)
      },
      "step_time_s": 1.23,                # a measured step of the run below (needs model + layout)
      "model": "llama3-8b",               # preset name, or a spec mapping as in a spec YAML
      "layout": "tp=1,pp=1,dp=8,zero=3,micro=2",
      "gpus": 8, "nodes": 1, "global_batch": 16
    }

What is fitted, and nothing else: matmul = matmul_tflops / catalog bf16 peak; hbm =
hbm_gbps / catalog bandwidth; each tier's bus-bandwidth fraction = busbw / the tier's
per-GPU link rate; and, when a step is given, one `step_scale` = measured / predicted
(with the fitted constants) that absorbs whatever the model still misses on that machine.
A step measured on a weight-sharded layout (zero=3, FSDP) sets `step_scale_sharded`, used for
sharded layouts only (and `step_scale` too when no replicated run was calibrated before it):
give `--calibrate` twice, a DDP run and an FSDP run, to predict both kinds on that machine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from musubi.plan.catalog import GPU, get_gpu
from musubi.plan.cluster import make_cluster
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.errors import PlanError
from musubi.plan.layout import parse_layout
from musubi.plan.predict import predict
from musubi.plan.spec import preset, spec_from_dict

_KEYS = ("gpu", "matmul_tflops", "hbm_gbps", "allreduce_busbw_gbps", "step_time_s", "model", "layout", "gpus",
         "nodes", "global_batch", "precision")


def _fraction(name: str, measured: Any, peak: float) -> float:
    if not isinstance(measured, (int, float)) or isinstance(measured, bool) or measured <= 0:
        raise PlanError(f"calibration {name}: expected a positive number, got {measured!r}")
    frac = float(measured) / peak
    if frac > 1.05:  # a measurement above the datasheet peak is a unit or GPU mix-up
        raise PlanError(f"calibration {name}: {measured} is {frac:.0%} of the catalog peak {peak:g}; check the "
                        "units and the gpu field")
    return min(frac, 1.0)


def _tier_rate(gpu: GPU, tier: str) -> float:
    rates = {"nvlink": gpu.nvlink_gbps, "pcie": gpu.pcie_gbps, "network": gpu.nic_gbps}
    if tier not in rates:
        raise PlanError(f"calibration allreduce_busbw_gbps.{tier}: unknown tier; use nvlink, pcie or network")
    if rates[tier] <= 0:
        raise PlanError(f"calibration allreduce_busbw_gbps.{tier}: {gpu.name} has no {tier} link")
    return rates[tier]


def calibrate(data: dict[str, Any], base: Efficiency = DEFAULT_EFFICIENCY) -> tuple[Efficiency, dict[str, Any]]:
    """Fitted efficiency constants and a report of each fitted value and what it came from."""
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        raise PlanError(f"calibration: unknown field {unknown[0]!r}; known: {', '.join(_KEYS)}")
    if "gpu" not in data:
        raise PlanError("calibration: missing field 'gpu' (the catalog name the measurements were taken on)")
    gpu = get_gpu(str(data["gpu"]))
    precision = str(data.get("precision", "bf16"))
    eff, report = base, {"gpu": gpu.name}
    if "matmul_tflops" in data:
        eff = replace(eff, matmul=_fraction("matmul_tflops", data["matmul_tflops"], gpu.peak(precision) / 1e12),
                      measured=eff.measured | {"matmul"})
        report["matmul"] = eff.matmul
    if "hbm_gbps" in data:
        eff = replace(eff, hbm=_fraction("hbm_gbps", data["hbm_gbps"], gpu.hbm_gbps))
        report["hbm"] = eff.hbm
    busbw = data.get("allreduce_busbw_gbps", {})
    if not isinstance(busbw, dict):
        raise PlanError("calibration allreduce_busbw_gbps: expected a mapping tier -> GB/s")
    for tier, value in busbw.items():
        frac = _fraction(f"allreduce_busbw_gbps.{tier}", value, _tier_rate(gpu, tier))
        eff = replace(eff, **{tier: frac}, measured=eff.measured | {tier})  # a measured network beats --fabric
        report[tier] = frac
    if "step_time_s" in data:
        eff = _fit_step(data, gpu, eff, precision)
        report["step_scale"] = eff.step_scale
        if eff.step_scale_sharded is not None:
            report["step_scale_sharded"] = eff.step_scale_sharded
    return eff, report


def _fit_step(data: dict[str, Any], gpu: GPU, eff: Efficiency, precision: str) -> Efficiency:
    for key in ("model", "layout", "gpus", "global_batch"):
        if key not in data:
            raise PlanError(f"calibration step_time_s needs {key!r} too (the run the step was measured on)")
    raw_model = data["model"]
    spec = spec_from_dict(dict(raw_model), "calibration") if isinstance(raw_model, dict) else preset(str(raw_model))
    cluster = make_cluster(gpu, int(data["gpus"]), data.get("nodes"))
    measured = data["step_time_s"]
    if not isinstance(measured, (int, float)) or measured <= 0:
        raise PlanError(f"calibration step_time_s: expected a positive number, got {measured!r}")
    layout = parse_layout(str(data["layout"]))
    predicted = predict(spec, cluster, layout, int(data["global_batch"]),
                        replace(eff, step_scale=1.0, step_scale_sharded=None), precision).step_time_s
    scale = float(measured) / predicted
    if layout.zero >= 3:
        return replace(eff, step_scale_sharded=scale, **({} if eff.step_fitted else {"step_scale": scale}))
    return replace(eff, step_scale=scale, step_fitted=True)


def load_calibrations(paths: list[Path], base: Efficiency = DEFAULT_EFFICIENCY
                      ) -> tuple[Efficiency, dict[str, Any] | None]:
    """Apply several calibrations in order (e.g. a DDP run, then an FSDP run); one merged report."""
    eff, merged = base, None
    for path in paths:
        eff, report = load_calibration(path, eff)
        if merged is not None and report["gpu"] != merged["gpu"]:
            raise PlanError(f"--calibrate {path} was measured on {report['gpu']}, the one before it on "
                            f"{merged['gpu']}; calibrate from runs of one machine")
        merged = {**(merged or {}), **report, "sources": [*(merged or {}).get("sources", []),
                                                            report.get("from_run", {}).get("job_dir", str(path))]}
    return eff, merged


def load_calibration(path: Path, base: Efficiency = DEFAULT_EFFICIENCY) -> tuple[Efficiency, dict[str, Any]]:
    """Read a calibration JSON file, or a Musubi run directory, and fit it (format: module docstring)."""
    if path.is_dir():
        from musubi.plan.from_run import calibration_from_run

        data = calibration_from_run(path)
        source = data.pop("_source")
        eff, report = calibrate(data, base)
        return eff, {**report, "from_run": source, "measured_step_time_s": data["step_time_s"]}
    if not path.is_file():
        raise PlanError(f"calibration file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PlanError(f"calibration file {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise PlanError(f"calibration file {path}: expected a JSON object")
    return calibrate(data, base)
