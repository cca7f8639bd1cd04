"""GPU checks: the GPUs exist, report their full memory, are idle and healthy, and are one model."""

from __future__ import annotations

from collections import Counter

from musubi.preflight.reference import HARDWARE_XIDS, SLOWDOWN_REASONS, expected_memory_gb, gpu_spec
from musubi.preflight.result import CheckResult, fail, passed, warn
from musubi.preflight.units import gib, indices
from musubi.topology.nvml import GpuReading, NvmlReading

#: Memory in use on an idle GPU that is still normal (driver reservations): bytes, or this share of the total.
IDLE_USED_BYTES = 1 << 30
IDLE_USED_SHARE = 0.02
#: Memory held by others above this share of a GPU fails the check (the run would OOM or be starved).
BUSY_FAIL_SHARE = 0.25
#: Reported total below this share of the model's memory means a slice or a limit, not the whole GPU.
FULL_MEMORY_SHARE = 0.85


def check_present(nvml: NvmlReading, requested: list[int] | None, in_use: list[int]) -> list[CheckResult]:
    """Requested GPUs exist; without GPUs the run is CPU ranks on gloo, a FAIL only when GPUs were asked for."""
    count = len(nvml.gpus)
    if requested:
        if not nvml.available or count == 0:
            why = f"NVML: {nvml.error}" if nvml.error else "NVML lists none"
            return [fail("gpus.present", f"--gpu-ids {indices(requested)} asks for GPUs but no NVIDIA GPU is reachable "
                                         f"({why})",
                         "load the NVIDIA driver (`nvidia-smi` must work) or drop --gpu-ids to run CPU ranks")]
        missing = [i for i in dict.fromkeys(requested) if not 0 <= i < count]
        if missing:
            return [fail("gpus.present", f"--gpu-ids asks for GPU {indices(missing)}; this machine has {count} "
                                         f"(0-{count - 1})", f"pick --gpu-ids from 0-{count - 1}")]
        return []
    if not in_use:
        if count:
            return [passed("gpus.present", f"{count} GPU(s) present but none visible: CPU ranks on gloo "
                                           "(pass --gpu-ids to require GPUs)")]
        why = f" (NVML: {nvml.error})" if nvml.error else ""
        return [passed("gpus.present", f"no GPU{why}: CPU ranks on gloo (pass --gpu-ids to require GPUs)")]
    return []


def _busy(g: GpuReading, own_pids: set[int]) -> CheckResult | None:
    """Memory held by processes other than ours (or by invisible ones: another container)."""
    others = [p for p in g.processes if p.pid not in own_pids]
    slack = max(IDLE_USED_BYTES, IDLE_USED_SHARE * g.memory_total)
    if others:
        held = sum(p.used_bytes or 0 for p in others) or g.memory_used
        who = ", ".join(f"pid {p.pid}" + (f" {p.name.rsplit('/', 1)[-1]}" if p.name else "") for p in others[:3])
        found = (f"GPU {g.index}: {len(others)} other process(es) hold {gib(held)} of {gib(g.memory_total)} "
                 f"({who})")
        fix = f"stop them (kill {' '.join(str(p.pid) for p in others[:3])}) or pick other --gpu-ids"
    elif g.memory_used > slack:
        held = g.memory_used
        found = (f"GPU {g.index}: {gib(held)} of {gib(g.memory_total)} in use by processes not visible here "
                 "(another container or user)")
        fix = f"free GPU {g.index} (nvidia-smi on the host shows who) or pick other --gpu-ids"
    else:
        return None
    if held > BUSY_FAIL_SHARE * g.memory_total:
        return fail("gpus.busy", found, fix)
    return warn("gpus.busy", found, fix)


def _health(g: GpuReading, own_pids: set[int]) -> list[CheckResult]:
    if g.error is not None:
        return [fail("gpus.lost", f"GPU {g.index} cannot be read (NVML: {g.error})",
                     f"reset GPU {g.index} or reboot the node (dmesg | grep Xid says why); pick other --gpu-ids")]
    out: list[CheckResult] = []
    expected = expected_memory_gb(g.name)
    if g.mig_enabled:
        out.append(warn("gpus.memory", f"GPU {g.index} ({g.name}) has MIG on: torch sees one slice, not the GPU",
                        f"turn MIG off (nvidia-smi -i {g.index} -mig 0, as admin) or use another GPU"))
    elif expected and g.memory_total < FULL_MEMORY_SHARE * expected * 2**30:
        out.append(warn("gpus.memory", f"GPU {g.index} ({g.name}) reports {gib(g.memory_total)}, "
                                       f"the model has {expected:.0f} GB: a slice or a memory limit",
                        "use the whole GPU (no MIG/vGPU profile) or plan for the smaller memory"))
    busy = _busy(g, own_pids)
    if busy is not None:
        out.append(busy)
    if g.ecc_uncorrected:
        out.append(fail("gpus.ecc", f"GPU {g.index} ({g.name}) has {g.ecc_uncorrected} uncorrected ECC error(s) "
                                    "since the driver loaded", f"reset GPU {g.index} (nvidia-smi -r -i {g.index}) "
                                                               "or pick other --gpu-ids; report it if it recurs"))
    if g.remap_failed:
        out.append(fail("gpus.ecc", f"GPU {g.index} ({g.name}): a memory row remap failed (bad memory)",
                        f"take GPU {g.index} out of service (RMA) and pick other --gpu-ids"))
    elif g.remap_pending:
        out.append(fail("gpus.ecc", f"GPU {g.index} ({g.name}): a memory row remap / page retirement waits for "
                                    "a reset", f"reset GPU {g.index} (nvidia-smi -r -i {g.index}) before training"))
    slow = [r for r in g.clock_events if r in SLOWDOWN_REASONS]
    if slow:
        out.append(warn("gpus.throttle", f"GPU {g.index} ({g.name}) is throttled now ({', '.join(slow)}): it "
                                         "will be the straggler every step paces",
                        "check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)"))
    bad = [x for x in dict.fromkeys(g.xids or ()) if x in HARDWARE_XIDS]
    if bad:
        what = ", ".join(f"Xid {x} ({HARDWARE_XIDS[x]})" for x in bad[:3])
        out.append(warn("gpus.xid", f"GPU {g.index} ({g.name}) logged {what} since boot",
                        f"if it recurs, reset GPU {g.index} or drain the node (dmesg | grep Xid)"))
    return out


def _speed_key(g: GpuReading, all_known: bool) -> tuple[float, tuple[int, int], int]:
    spec = gpu_spec(g.name)
    return (spec[1] if (spec and all_known) else 0.0, g.capability, g.memory_total)


def check_models(gpus: list[GpuReading]) -> list[CheckResult]:
    """One GPU model across ranks; else a WARN naming the slowest (synchronous steps wait for it)."""
    counts = Counter(g.name for g in gpus)
    if len(counts) < 2:
        return []
    all_known = all(gpu_spec(g.name) for g in gpus)
    slowest = min(gpus, key=lambda g: _speed_key(g, all_known))
    fastest = max(gpus, key=lambda g: _speed_key(g, all_known))
    mix = ", ".join(f"{n}x {name} ({indices(g.index for g in gpus if g.name == name)})"
                    for name, n in counts.most_common())
    rate = ""
    if all_known:
        rate = f", ~{gpu_spec(slowest.name)[1]:.0f} vs {gpu_spec(fastest.name)[1]:.0f} TFLOPS"  # type: ignore[index]
    keep = [g.index for g in gpus if g.name == fastest.name]
    return [warn("gpus.models", f"GPU models differ: {mix}; the slowest, GPU {slowest.index} ({slowest.name}{rate}), "
                                "paces every synchronous step",
                 f"use one model (--gpu-ids {indices(keep)}) or expect the step time of the slowest")]


def check_gpus(nvml: NvmlReading, requested: list[int] | None, in_use: list[int],
               own_pids: set[int] | None = None) -> list[CheckResult]:
    """Presence, memory, other processes, ECC, throttling, Xids and models of the GPUs the run will use."""
    results = check_present(nvml, requested, in_use)
    if results and results[0].check == "gpus.present":
        return results
    gpus = [g for g in nvml.gpus if g.index in in_use]
    for g in gpus:
        results += _health(g, own_pids or set())
    results += check_models([g for g in gpus if g.error is None])
    if not results and gpus:
        names = Counter(g.name for g in gpus)
        what = ", ".join(f"{n}x {name}" for name, n in names.items())
        results.append(passed("gpus", f"{what} (GPU {indices(g.index for g in gpus)}), "
                                      f"{gib(min(g.memory_total for g in gpus))} each; idle, no ECC errors, "
                                      "not throttled"))
    return results
