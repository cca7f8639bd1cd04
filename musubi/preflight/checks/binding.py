"""Binding checks: `--gpu-ids` and CUDA_VISIBLE_DEVICES agree, and no GPU is listed twice.

CUDA reads CUDA_VISIBLE_DEVICES left to right and stops at the first entry it
cannot resolve (an index past the end, an unknown UUID, a repeat): every GPU
listed after it silently disappears. Integer entries are read here in
nvidia-smi order, which is CUDA's order when CUDA_DEVICE_ORDER=PCI_BUS_ID or
all GPUs are the same model (the environment check warns otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from musubi.preflight.result import CheckResult, fail, passed, warn
from musubi.preflight.units import indices
from musubi.topology.nvml import GpuReading

CVD = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class VisibleDevices:
    """How CUDA resolves CUDA_VISIBLE_DEVICES: the GPUs it exposes (nvidia-smi indices) and where it stopped."""

    value: str | None  # None: unset, every GPU visible
    indices: list[int]
    stopped_at: str | None = None  # the entry CUDA could not resolve
    stop_reason: str = ""  # 'repeat' | 'unknown'
    hidden_after: list[str] = field(default_factory=list)  # entries ignored because they follow it
    mig: list[str] = field(default_factory=list)  # MIG instance entries (not whole GPUs)


def resolve_visible(value: str | None, gpus: tuple[GpuReading, ...], count: int | None = None) -> VisibleDevices:
    """Resolve CUDA_VISIBLE_DEVICES against the machine's GPUs (count None with no GPU list: trust integers)."""
    total = len(gpus) if gpus else count
    if value is None:
        return VisibleDevices(None, list(range(total or 0)))
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    out: list[int] = []
    mig: list[str] = []
    for n, entry in enumerate(entries):
        idx: int | None = None
        if entry.startswith("MIG-"):
            mig.append(entry)
            continue
        if entry.lstrip("-").isdigit():
            i = int(entry)
            idx = i if i >= 0 and (total is None or i < total) else None
        elif entry.startswith("GPU-"):
            # CUDA accepts any unique UUID prefix.
            hits = [g.index for g in gpus if g.uuid.lower().startswith(entry.lower())]
            idx = hits[0] if len(hits) == 1 else None
        if idx is None or idx in out:
            return VisibleDevices(value, out, stopped_at=entry, stop_reason="repeat" if idx in out else "unknown",
                                  hidden_after=entries[n + 1:], mig=mig)
        out.append(idx)
    return VisibleDevices(value, out, mig=mig)


def check_binding(requested: list[int] | None, visible: VisibleDevices, gpu_count: int) -> list[CheckResult]:
    """--gpu-ids lists each GPU once and only GPUs that CUDA_VISIBLE_DEVICES exposes."""
    results: list[CheckResult] = []
    if requested is not None:
        twice = sorted({i for i in requested if requested.count(i) > 1})
        if twice:
            results.append(fail("binding.gpus",
                                f"--gpu-ids {indices(requested)} lists GPU {indices(twice)} twice: two ranks would share "
                                "one GPU", f"list each GPU once (--gpu-ids {indices(sorted(set(requested)))})"))
    shown = f"{CVD}={visible.value!r}"
    if visible.stopped_at is not None:
        if visible.stop_reason == "repeat":
            found = (f"{shown} lists {visible.stopped_at} twice: CUDA stops there"
                     + (f" and also hides {','.join(visible.hidden_after)}" if visible.hidden_after else ""))
            results.append(fail("binding.visible", found, "list each GPU once"))
        else:
            span = f"GPUs are 0-{gpu_count - 1}" if gpu_count else "no GPU is present"
            found = f"{shown}: entry {visible.stopped_at!r} matches no GPU ({span})"
            if visible.hidden_after:
                results.append(fail("binding.visible",
                                     f"{found}, so CUDA also hides every entry after it ({','.join(visible.hidden_after)})",
                                     f"remove {visible.stopped_at!r} from {CVD}"))
            else:
                results.append(warn("binding.visible", found, f"remove {visible.stopped_at!r} from {CVD}"))
    if visible.mig:
        results.append(warn("binding.visible", f"{shown} names MIG instances ({len(visible.mig)}): "
                                               "NCCL cannot run one job's ranks across MIG slices",
                            "give multi-rank jobs whole GPUs"))
    if requested is not None and visible.value is not None:
        hidden = [i for i in dict.fromkeys(requested) if i not in visible.indices]
        if hidden and not visible.indices:
            results.append(fail("binding.visible", f"{shown} hides every GPU but --gpu-ids asks for {indices(requested)}",
                                f"unset {CVD} or set {CVD}={indices(dict.fromkeys(requested))}"))
        elif hidden:
            results.append(fail("binding.visible",
                                f"--gpu-ids {indices(requested)} but {shown} hides GPU {indices(hidden)}",
                                f"set {CVD}={indices(dict.fromkeys(requested))} or unset it"))
    if not results:
        if visible.value is None:
            found = f"{CVD} unset" + (f": all {gpu_count} GPU(s) visible" if gpu_count else "")
        elif not visible.indices:
            found = f"{shown} hides all {gpu_count} GPU(s): CPU ranks" if gpu_count else f"{shown}: no GPU"
        else:
            found = f"{shown} exposes GPU {indices(visible.indices)}"
        if requested and gpu_count:
            found += f"; --gpu-ids {indices(requested)}: one rank per GPU"
        results.append(passed("binding", found))
    return results
