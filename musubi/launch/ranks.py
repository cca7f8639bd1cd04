"""How many ranks a job gets, on which device: counted without torch on a machine without a GPU driver."""

from __future__ import annotations

from musubi.contract.errors import ConfigError
from musubi.launch import admission
from musubi.topology.cores import usable_cores
from musubi.topology.visible import visible_gpus


def resolve_world(nproc: int | None, device: str | None, oversubscribe: bool = False,
                  placed: bool = False) -> tuple[int, str]:
    """(ranks, device kind): all GPUs by default, else 2 CPU ranks (or fewer cores); never more CPU ranks
    than cores unless `oversubscribe`. `placed`: a fleet's job on the GPUs the fleet gave it (its
    CUDA_VISIBLE_DEVICES, --nproc of them): not counted again, which would only confirm the fleet's own
    placement."""
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc {nproc}: must be >= 1")
    if placed and device == "cuda" and nproc is not None:
        return nproc, device
    gpus = visible_gpus() if device != "cpu" else 0
    kind = device or ("cuda" if gpus else "cpu")
    if kind == "cuda":
        if gpus == 0:
            raise ConfigError("--device cuda but no GPU is visible; check CUDA_VISIBLE_DEVICES or use --device cpu")
        n = nproc or gpus
        if n > gpus:
            raise ConfigError(
                f"--nproc {n} but only {gpus} GPU(s) are visible: two ranks would share a GPU; "
                f"use --nproc {gpus} or fewer"
            )
        return n, kind
    if kind != "cpu":
        raise ConfigError(f"--device {kind!r}: use cuda or cpu")
    cores = usable_cores()
    if nproc is not None:
        admission.check_cpu_ranks(nproc, cores, oversubscribe)
    return nproc or max(1, min(2, cores)), kind
