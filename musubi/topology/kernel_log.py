"""Xid events from the kernel log (`dmesg`), the driver's record of GPU faults since boot."""

from __future__ import annotations

import re
import subprocess

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.\d)?\): (\d+)")


def bus_key(bus_id: str) -> str:
    """Normalise a PCI bus id ('00000000:3B:00.0' or '0000:3b:00') to 'domain:bus:device' in hex."""
    parts = re.split(r"[:.]", bus_id.strip())
    if len(parts) < 3:
        return bus_id.strip().lower()
    domain, bus, dev = (int(p, 16) for p in parts[:3])
    return f"{domain:x}:{bus:02x}:{dev:02x}"


def parse_xids(text: str) -> dict[str, tuple[int, ...]]:
    """Xid codes per GPU (keyed by `bus_key`) found in kernel-log text, in order of appearance."""
    found: dict[str, list[int]] = {}
    for m in _XID.finditer(text):
        key = bus_key(f"{m.group(1)}:{m.group(2)}:{m.group(3)}")
        found.setdefault(key, []).append(int(m.group(4)))
    return {k: tuple(v) for k, v in found.items()}


def read_xids(timeout_s: float = 2.0) -> dict[str, tuple[int, ...]] | None:
    """Xids since boot from `dmesg`; None when the log cannot be read (containers, no permission)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace", timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_xids(out.stdout)
