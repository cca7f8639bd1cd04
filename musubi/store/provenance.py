"""Provenance beyond the machine: package versions and the git state of the user's project.

A recipe re-run months later is quietly not the same experiment; these fields are what
`musubi compare` sets side by side to say what changed.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: Distributions whose version changes training results or speed (recorded when installed).
PACKAGES = ("musubi-train", "torch", "torchvision", "numpy", "pillow", "pydantic", "pyyaml", "typer", "rich",
            "nvidia-ml-py", "psutil", "torchmetrics", "faster-coco-eval", "onnx", "onnxruntime", "onnxscript",
            "tensorboard", "mlflow-skinny", "mlflow", "lightning", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "triton")


def package_versions() -> dict[str, str]:
    """{distribution: version} of the installed PACKAGES."""
    out: dict[str, str] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
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


def cudnn_version() -> str | None:
    """cuDNN as torch loads it (None without CUDA)."""
    try:
        import torch

        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except (ImportError, RuntimeError):
        return None
    return str(v) if v else None
