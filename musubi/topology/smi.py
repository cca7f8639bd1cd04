"""`nvidia-smi topo -m`: run it, and parse its matrix (live output or a recorded copy) into a NodeTopology.

The matrix names the devices in its header (GPU0.., NIC0.. or mlx5_0..), then
one row per device: a link word per column, and for GPUs the CPU affinity,
NUMA affinity and GPU NUMA id. Tabs may have become spaces in a pasted copy,
so cells are read by position, not by tab.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from musubi.topology.model import GpuPlace, NicPlace, NodeTopology, parse_cpulist

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"GPU(\d+)$")
_CPULIST = re.compile(r"^[0-9][0-9,\-]*$")
_LEGEND_NIC = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)")
#: Header words that end the device columns ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID").
_TRAILING = {"CPU", "NUMA"}


def _device_columns(cells: list[str]) -> list[str]:
    cols: list[str] = []
    for c in cells:
        if c in _TRAILING or (c == "GPU" and cols):  # "GPU NUMA ID" starts with a bare GPU
            break
        cols.append(c)
    return cols


def parse_topo_matrix(text: str, source: str = "nvidia-smi") -> NodeTopology:
    """The NodeTopology of a `nvidia-smi topo -m` text: GPU pair links, NIC links, CPU affinity, NUMA node."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    cols: list[str] | None = None
    links: dict[tuple[int, int], str] = {}
    places: dict[int, GpuPlace] = {}
    nic_links: dict[str, dict[int, str]] = {}
    legend: dict[str, str] = {}
    in_legend = False
    for ln in lines:
        if ln.strip().startswith("Legend") or ln.strip().startswith("NIC Legend"):
            in_legend = True
        if in_legend:
            m = _LEGEND_NIC.match(ln)
            if m:
                legend[m.group(1)] = m.group(2)
            continue
        cells = ln.split()
        if not cells:
            continue
        if cols is None:
            # The header names the device columns; the first matrix row ("GPU0  X  NV18 ...") has X second.
            if _GPU.match(cells[0]) and (len(cells) < 2 or cells[1] != "X"):
                cols = _device_columns(cells)
            continue
        if cells[0] not in cols:
            continue
        row = cells[0]
        values = cells[1:1 + len(cols)]
        rest = cells[1 + len(cols):]
        m = _GPU.match(row)
        if m:
            i = int(m.group(1))
            for col, value in zip(cols, values, strict=False):
                cm = _GPU.match(col)
                if cm and int(cm.group(1)) != i and value != "X":
                    j = int(cm.group(1))
                    links[(min(i, j), max(i, j))] = value
            cpus = parse_cpulist(rest[0]) if rest and _CPULIST.match(rest[0]) else ()
            numa = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
            places[i] = GpuPlace(i, cpus, numa)
        else:  # a NIC row: its link to each GPU column
            nic_links[row] = {int(cm.group(1)): v for col, v in zip(cols, values, strict=False)
                              if (cm := _GPU.match(col)) and v != "X"}
    nics = tuple(NicPlace(legend.get(name, name), lk) for name, lk in nic_links.items())
    gpus = tuple(places[i] for i in sorted(places))
    known = bool(links or gpus)
    return NodeTopology(links=links, source=source if known else "none", gpus=gpus, nics=nics,
                        text=text if known else "")


def read_topo_text(timeout_s: float = 5.0) -> str | None:
    """The output of `nvidia-smi topo -m`, or None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, errors="replace",
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def read_topo_smi(timeout_s: float = 5.0) -> NodeTopology:
    """Run `nvidia-smi topo -m` and parse it; an empty reading when it is absent or fails."""
    text = read_topo_text(timeout_s)
    return parse_topo_matrix(text) if text else NodeTopology()
