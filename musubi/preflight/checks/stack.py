"""Stack checks: torch has kernels for every GPU, the driver runs torch's CUDA, NCCL is there."""

from __future__ import annotations

import re
from collections import defaultdict

from musubi.preflight.readings import StackReading
from musubi.preflight.reference import (
    ARCH_LAST_CUDA_MAJOR,
    MAJOR_FLOOR_DRIVER,
    arch_name,
    min_cuda_for,
    parse_version,
    toolkit_driver,
    version_str,
)
from musubi.preflight.result import CheckResult, Status, fail, passed, warn
from musubi.preflight.units import indices
from musubi.topology.nvml import GpuReading

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")
CUDA_WHEELS = "https://download.pytorch.org/whl/"


def parse_arch_list(arch_list: tuple[str, ...]) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """(SASS targets as (major, minor, suffix), PTX targets as (major, minor)) of torch's arch list."""
    sass, ptx = [], []
    for a in arch_list:
        m = _ARCH.match(a)
        if m is None:
            continue
        major, minor, suffix = int(m.group(2)), int(m.group(3)), m.group(4)
        if m.group(1) == "sm":
            sass.append((major, minor, suffix))
        else:
            ptx.append((major, minor))
    return sass, ptx


def arch_coverage(cap: tuple[int, int], arch_list: tuple[str, ...]) -> str | None:
    """'sass' when torch ships machine code that runs on `cap`, 'ptx' when only JIT-able PTX, else None."""
    sass, ptx = parse_arch_list(arch_list)
    for major, minor, suffix in sass:
        # Machine code runs on the same major with an equal or newer minor; 'a' targets only their exact arch.
        if major == cap[0] and (minor == cap[1] or (suffix != "a" and minor < cap[1])):
            return "sass"
    if any(p <= cap for p in ptx):
        return "ptx"
    return None


def _span(arch_list: tuple[str, ...]) -> str:
    sass, _ = parse_arch_list(arch_list)
    names = sorted({(ma, mi) for ma, mi, _ in sass})
    if not names:
        return "no GPU architectures"
    return arch_name(names[0]) if len(names) == 1 else f"{arch_name(names[0])}..{arch_name(names[-1])}"


def _gpu_group(gpus: list[GpuReading]) -> str:
    names = sorted({g.name for g in gpus})
    word = "GPU" if len(gpus) == 1 else "GPUs"
    return f"{word} {indices(g.index for g in gpus)} ({', '.join(names)})"


def _cuda_tuple(cuda: str | None) -> tuple[int, int] | None:
    v = parse_version(cuda or "")
    return (v[0], v[1] if len(v) > 1 else 0) if v else None


def check_arch(stack: StackReading, gpus: list[GpuReading]) -> list[CheckResult]:
    """Every GPU's compute capability has machine code in torch's build (sm_120 needs CUDA >= 12.8)."""
    by_cap: dict[tuple[int, int], list[GpuReading]] = defaultdict(list)
    for g in gpus:
        by_cap[g.capability].append(g)
    build = f"torch {stack.torch_version}"
    cuda = _cuda_tuple(stack.cuda_version)
    results = []
    for cap, group in sorted(by_cap.items()):
        sm = arch_name(cap)
        cover = arch_coverage(cap, stack.arch_list)
        found = f"{build} has kernels for {_span(stack.arch_list)}; {_gpu_group(group)} {'is' if len(group) == 1 else 'are'} {sm}"
        if cover == "sass":
            continue
        sass, _ = parse_arch_list(stack.arch_list)
        too_old = bool(sass) and all((ma, mi) > cap for ma, mi, _ in sass)
        if too_old and cuda is not None and ARCH_LAST_CUDA_MAJOR.get(cap[0], 99) < cuda[0]:
            last = ARCH_LAST_CUDA_MAJOR[cap[0]]
            fix = (f"install a torch build that still ships {sm} (a CUDA {last}.x wheel from {CUDA_WHEELS}); "
                   f"CUDA {cuda[0]} dropped it")
        elif too_old:
            fix = f"install a torch build with {sm} kernels (an older CUDA wheel from {CUDA_WHEELS})"
        else:
            need = min_cuda_for(cap)
            fix = f"upgrade to a torch build with {sm}" + (f" (CUDA >= {need})" if need else "")
        if cover == "ptx":
            results.append(warn("stack.arch", f"{found}: only PTX, JIT-compiled at start (minutes; slower kernels)",
                                fix))
        else:
            results.append(fail("stack.arch", f"{found}: no kernel runs on it", fix))
    return results


def check_driver(stack: StackReading) -> list[CheckResult]:
    """The NVIDIA driver runs torch's CUDA version: FAIL below the major's floor, WARN below the toolkit's own."""
    cuda = _cuda_tuple(stack.cuda_version)
    if stack.driver_version is None or cuda is None:
        return []
    drv = parse_version(stack.driver_version)
    floor, full = MAJOR_FLOOR_DRIVER.get(cuda[0]), toolkit_driver(cuda)
    native = f" (natively CUDA {stack.driver_cuda_version})" if stack.driver_cuda_version else ""
    want = full or floor
    if floor is not None and drv < floor:
        return [fail("stack.driver",
                     f"driver {stack.driver_version}{native} is too old for torch's CUDA {stack.cuda_version} "
                     f"(CUDA {cuda[0]}.x needs >= {version_str(floor)})",
                     f"upgrade the NVIDIA driver to >= {version_str(want or floor)}")]
    if full is not None and drv < full:
        return [warn("stack.driver",
                     f"driver {stack.driver_version}{native} is older than CUDA {stack.cuda_version}'s "
                     f"{version_str(full)}: it runs through minor-version compatibility (no PTX JIT)",
                     f"upgrade the NVIDIA driver to >= {version_str(full)}")]
    if floor is None and stack.driver_cuda_version:
        # No table for this CUDA major yet: the driver's own CUDA version still says yes or no.
        have = _cuda_tuple(stack.driver_cuda_version)
        if have is not None and have[0] < cuda[0]:
            return [fail("stack.driver",
                         f"driver {stack.driver_version} supports CUDA {stack.driver_cuda_version}, "
                         f"torch needs CUDA {stack.cuda_version}",
                         f"upgrade the NVIDIA driver to one for CUDA {cuda[0]}.x")]
    return []


def check_stack(stack: StackReading, gpus: list[GpuReading], requested: bool) -> list[CheckResult]:
    """torch build, CUDA, driver and collectives for the GPUs the run will use (none: CPU ranks on gloo)."""
    if not gpus:
        if not stack.gloo_available:
            return [fail("stack.gloo", f"torch {stack.torch_version} has no gloo backend: CPU ranks cannot talk",
                         "install a torch build with torch.distributed (the pip wheels have it)")]
        if requested:  # the GPU check says why the requested GPUs are missing
            return [passed("stack", f"torch {stack.torch_version}; no requested GPU present to check kernels for")]
        return [passed("stack", f"torch {stack.torch_version}; no GPU in use: CPU ranks on gloo")]
    # GPUs present but not asked for: torch's failure to use them only demotes the run to CPU ranks.
    severity = Status.FAIL if requested else Status.WARN
    if stack.cuda_version is None:
        tail = "" if requested else " (until then training runs on CPU ranks)"
        return [CheckResult("stack.cuda", severity,
                            f"torch {stack.torch_version} is a CPU-only build; {_gpu_group(gpus)} present",
                            f"install a CUDA build of torch from {CUDA_WHEELS}{tail}")]
    results: list[CheckResult] = []
    if not stack.cuda_available:
        why = stack.cuda_error or "torch.cuda.is_available() is False"
        results.append(CheckResult("stack.cuda", severity, f"torch cannot initialise CUDA: {why}",
                                   f"check `nvidia-smi` works and the driver supports CUDA {stack.cuda_version}"))
    else:
        results += check_arch(stack, gpus)
    results += check_driver(stack)
    if not stack.nccl_available:
        results.append(fail("stack.nccl", f"torch {stack.torch_version} has no NCCL: GPU ranks cannot all-reduce",
                            f"install the Linux CUDA build of torch (NCCL ships with it) from {CUDA_WHEELS}"))
    if not results:
        results.append(passed("stack", f"torch {stack.torch_version} (CUDA {stack.cuda_version}, "
                                       f"NCCL {stack.nccl_version or '?'}), driver {stack.driver_version or '?'}; "
                                       f"kernels for {', '.join(sorted({arch_name(g.capability) for g in gpus}))}"))
    return results
