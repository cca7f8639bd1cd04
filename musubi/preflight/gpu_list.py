"""Which GPUs `musubi check` checks: `--gpus N` (the first N visible, a count as in `run` and `plan`) or
`--gpu-ids 0,1,3` (nvidia-smi numbers)."""

from __future__ import annotations

from musubi.contract.errors import ConfigError


def parse_gpu_ids(text: str) -> list[int]:
    """'0,1,3' -> [0, 1, 3]; ConfigError naming the bad entry otherwise."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ConfigError(f"--gpu-ids {text!r}: {part!r} is not a GPU number; give nvidia-smi numbers like 0,1,2,3")
        out.append(int(part))
    return out


def gpu_selection(count: str | None, ids: str | None) -> list[int] | None:
    """The GPUs to check from `--gpus N` or `--gpu-ids LIST` (None: every visible GPU). `--gpus` is a count in
    every command; the list form it once took here is refused with the flag that takes a list."""
    if count is not None and ids is not None:
        raise ConfigError("--gpus N and --gpu-ids LIST both name the GPUs; give one")
    if ids is not None:
        return parse_gpu_ids(ids)
    if count is None:
        return None
    if not count.strip().isdigit():
        raise ConfigError(f"--gpus {count}: --gpus is a count of GPUs (as in `musubi run` and `musubi plan`); "
                          f"for a list of GPU numbers use --gpu-ids {count}")
    n = int(count)
    if n < 1:
        raise ConfigError(f"--gpus {n}: give a count >= 1, or --gpu-ids 0,1,... for a list")
    return list(range(n))
