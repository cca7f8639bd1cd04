"""Run directory contract: RUN/run.json, RUN/env.json, RUN/JOB/{job.json, metrics.jsonl, ...}."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from musubi.config.version import VERSION
from musubi.contract.env import VARIABLE_PREFIX


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines of a file; a torn last line (a rank killed mid-write) is skipped."""
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def default_run_dir(name: str, base: Path = Path("runs")) -> Path:
    """`runs/<timestamp>-<name>`, unique to the second (a counter if it exists)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = base / f"{stamp}-{name}"
    n = 1
    while d.exists():
        n += 1
        d = base / f"{stamp}-{name}-{n}"
    return d


def git_version() -> str | None:
    """`git describe` of the working directory's repository, if any."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def run_record(config: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """What was asked, by whom, when, with which musubi (run.json)."""
    from musubi.store.redact import redact_argv, redact_tree

    return {
        "config": redact_tree(config),  # a command job's env: may carry an API key
        "argv": redact_argv(argv),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(),
        "musubi_version": VERSION,
        "git": git_version(),
    }


def env_record() -> dict[str, Any]:
    """Provenance of the machine and stack (env.json)."""
    from musubi.topology.visible import visible_gpus

    version, cuda = torch_build()
    rec: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": version,
        "cuda": cuda,
        "cpu_count": os.cpu_count(),
        "gpus": [],
    }
    tv = torchvision_version()
    if tv is not None:
        rec["torchvision"] = tv
    if visible_gpus() > 0:  # NVML's count: no CUDA driver start for a record; torch only on a GPU machine
        import torch

        try:
            rec["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            rec["nccl"] = None
        rec["gpus"] = _nvml_gpus()
        rec["topology"] = topology()
    from musubi.store.provenance import cudnn_version, package_versions, project_git

    rec["musubi"] = VERSION
    packages = package_versions()
    rec["cudnn"] = cudnn_version(packages)
    rec["packages"] = packages
    rec["project"] = project_git()
    rec["env"] = relevant_env()
    return rec


def torch_build() -> tuple[str, str | None]:
    """torch's `__version__` and the CUDA it was built for (None: a CPU build), as torch.version holds them; read
    from torch/version.py while torch is not imported yet: a `musubi run` of external commands needs no torch, and
    importing it to tell two strings took ~5 s of its start-up on 2 cores."""
    import re

    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__, torch.version.cuda
    import importlib.util

    spec = importlib.util.find_spec("torch")  # finds the package without running it
    text = ""
    if spec is not None and spec.submodule_search_locations:
        try:
            text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
        except OSError:
            text = ""
    version = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
    cuda = re.search(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)\s*$""", text, re.M)
    if version is None or cuda is None:  # a layout we do not know: ask torch itself
        import torch

        return torch.__version__, torch.version.cuda
    return version.group(1), cuda.group(1)


def torchvision_version() -> str | None:
    """torchvision's `__version__` (with its CUDA tag, e.g. 0.29.1+cu130), read from torchvision/version.py:
    importing torchvision loads its model zoo, seconds on a small machine, to tell one string."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torchvision")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
    except OSError:
        text = ""
    m = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
    if m:
        return m.group(1)
    from importlib import metadata

    try:
        return metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return None


#: Variables that change how distributed training behaves (recorded in env.json, shown by `musubi env`).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "CUDA_", "OMP_", "MKL_", VARIABLE_PREFIX, "NVIDIA_",
                "PYTORCH_", "TORCHELASTIC_", "MASTER_", "GLOO_")


def relevant_env() -> dict[str, str]:
    """The environment variables of this process that matter to training (names sorted), secrets redacted."""
    from musubi.store.redact import redact_env

    return redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)})


def topology() -> dict[str, Any]:
    """The node's topology model (musubi.topology): GPU pair links, NICs, CPU affinity and NUMA node per GPU."""
    try:
        from musubi.topology.read import read_node_topology
    except ImportError:
        return {}
    return read_node_topology().to_dict()


def _nvml_gpus() -> list[dict[str, Any]]:
    """GPU name, UUID, memory and driver from NVML (no CUDA context is created)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "index": i,
                "name": pynvml.nvmlDeviceGetName(h),
                "uuid": pynvml.nvmlDeviceGetUUID(h),
                "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
                "driver": driver,
            })
        return gpus
    finally:
        pynvml.nvmlShutdown()
