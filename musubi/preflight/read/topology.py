"""GPU-to-GPU links from `nvidia-smi topo -m`, the fallback when NVML cannot say."""

from __future__ import annotations

import re
import shutil
import subprocess

from musubi.preflight.readings import TopologyReading

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"GPU(\d+)$")


def parse_topo_matrix(text: str) -> TopologyReading:
    """Pairwise links from the matrix `nvidia-smi topo -m` prints (NV#, PIX, PXB, PHB, NODE, SYS)."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header: list[int] | None = None
    links: dict[tuple[int, int], str] = {}
    for ln in lines:
        cells = ln.split()
        if not cells:
            continue
        if header is None:
            # The header names the GPU columns; the first matrix row ("GPU0  X  NV18 ...") has X second.
            if _GPU.match(cells[0]) and (len(cells) < 2 or cells[1] != "X"):
                header = [int(m.group(1)) for c in cells if (m := _GPU.match(c))]
            continue
        m = _GPU.match(cells[0])
        if m is None:
            if ln.startswith("Legend"):
                break
            continue
        row = int(m.group(1))
        for col, value in zip(header, cells[1:1 + len(header)], strict=False):
            if col != row and value != "X":
                links[(min(row, col), max(row, col))] = value
    return TopologyReading(links=links, source="nvidia-smi" if links else "none")


def read_topo_smi(timeout_s: float = 5.0) -> TopologyReading:
    """Run `nvidia-smi topo -m` and parse it; an empty reading when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return TopologyReading()
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, errors="replace",
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return TopologyReading()
    return parse_topo_matrix(out.stdout) if out.returncode == 0 else TopologyReading()
