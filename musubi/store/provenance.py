"""Provenance beyond the machine: package versions and the git state of the user's project.

A recipe re-run months later is quietly not the same experiment; these fields are what
`musubi compare` sets side by side to say what changed.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from musubi.config.version import VERSION

#: Distributions whose version changes training results or speed (recorded when installed).
PACKAGES = ("musubi-train", "torch", "torchvision", "numpy", "pillow", "pydantic", "pyyaml", "typer", "rich",
            "nvidia-ml-py", "psutil", "torchmetrics", "faster-coco-eval", "pycocotools", "onnx", "onnxruntime", "onnxscript",
            "tensorboard", "mlflow-skinny", "mlflow", "lightning", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "triton")


def package_versions() -> dict[str, str]:
    """{distribution: version} of the installed PACKAGES; Musubi's own always (run from a checkout on PYTHONPATH,
    as on a machine without internet, it has no distribution: its version is the code's)."""
    out: dict[str, str] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name == "musubi-train":
                out[name] = VERSION
            continue
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def project_git(cwd: Path | None = None) -> dict[str, Any] | None:
    """Commit, branch and dirty state of the repository the command runs in (the user's project), if any."""
    cwd = cwd or Path.cwd()
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return None
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"root": _git(["rev-parse", "--show-toplevel"], cwd), "commit": commit,
            "branch": _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd), "dirty": bool(status),
            "changed_files": len(status.splitlines()) if status else 0}


def cudnn_version(packages: dict[str, str] | None = None) -> str | None:
    """cuDNN as torch reports it (e.g. 91300 for 9.13.0; None without it). Where CUDA is not started yet (a
    launcher, a fleet: they never run a kernel) from the cuDNN wheel torch loads, in torch's numbering:
    torch.backends.cudnn.version() would start CUDA to check the GPUs' compute capability (torch 2.14).
    `packages`: package_versions() when the caller has it already."""
    torch = sys.modules.get("torch")  # not imported yet: CUDA is not started either (no import for a record)
    try:
        if torch is not None and torch.cuda.is_initialized():
            v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            return str(v) if v else None
    except RuntimeError:
        return None
    versions = packages if packages is not None else package_versions()
    wheel = versions.get("nvidia-cudnn-cu13") or versions.get("nvidia-cudnn-cu12")
    return cudnn_number(wheel) if wheel else None


def cudnn_number(version: str) -> str | None:
    """A cuDNN wheel's version (9.13.0.50) in torch's numbering: major x 10000 + minor x 100 + patch from cuDNN 9,
    major x 1000 before; None when it is not a version."""
    parts = version.split(".")
    try:
        major, minor, patch = (int(p) for p in (parts + ["0", "0"])[:3])
    except ValueError:
        return None
    return str(major * (10000 if major >= 9 else 1000) + minor * 100 + patch)
