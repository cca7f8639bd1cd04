"""The fleet's timeline (GPU x time, one bar per job attempt) as SVG, and the report's fleet section.

Drawn by hand (no plotting library: the picture is in every report, with or without the `report`
extra). Job names come from the run directory: every one passes through html.escape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any, Protocol

from musubi.contract.run_files import RUN_FILES
from musubi.records.attempts import attempts_of
from musubi.store.rundir import read_json
from musubi.store.startup import COMPONENTS, EVAL_START, EVALUATION, FIRST_STEP, LAUNCHER

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


class BarLike(Protocol):
    """A job attempt on the timeline: its name, GPUs and start/end seconds."""

    name: str
    gpus: tuple[int, ...]
    start: float
    end: float


def lanes(bars: Sequence[BarLike], device: int) -> list[list[BarLike]]:
    """The bars on `device` in lanes of bars that do not overlap in time (a second lane: a job that shared the
    GPU), earliest start first; [] when none runs there."""
    out: list[list[BarLike]] = []
    for b in sorted((b for b in bars if device in b.gpus), key=lambda b: (b.start, b.name)):
        lane = next((ln for ln in out if ln[-1].end <= b.start + 1e-9), None)
        if lane is None:
            out.append(lane := [])
        lane.append(b)
    return out


def svg_timeline(rows: Sequence[tuple[str, Sequence[BarLike]]], devices: Sequence[int], unit: str = "GPU",
                 tails: Mapping[str, float] | None = None) -> str:
    """An SVG of one or more schedules (e.g. predicted and measured) on a common time axis: a lane per device
    (split in two where two jobs shared the device: each in half its height).

    `tails`: attempt name -> the end of its evaluation after its GPUs went back (drawn pale after the bar)."""
    tails = tails or {}
    end = max([b.end for _, bars in rows for b in bars] + list(tails.values()) + [1.0])
    lane, left, width = 22, 70, 900
    height = sum((len(devices) + 2) * lane for _ in rows) + 30
    scale = width / end
    names = sorted({b.name.split("#")[0] for _, bars in rows for b in bars})
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           'font-family="sans-serif" font-size="11">']
    y = 0
    for title, bars in rows:
        out.append(f'<text x="4" y="{y + 15}" font-weight="bold">{escape(title)}</text>')
        y += lane
        for i, d in enumerate(devices):
            top = y + i * lane
            out.append(f'<text x="4" y="{top + 15}">{escape(unit)} {d}</text>')
            out.append(f'<rect x="{left}" y="{top + 2}" width="{width}" height="{lane - 4}" fill="#eee"/>')
            split = lanes(bars, d)
            part = (lane - 4) / max(1, len(split))  # height of one sub-lane
            for k, b in ((k, b) for k, ln in enumerate(split) for b in ln):
                fill = color[b.name.split("#")[0]]
                x, w = left + b.start * scale, max(1.0, (b.end - b.start) * scale)
                y0 = top + 2 + k * part
                shared = " (shared GPU)" if len(split) > 1 else ""
                if b.name in tails and tails[b.name] > b.end:
                    tw = (tails[b.name] - b.end) * scale
                    out.append(f'<rect x="{x + w:.1f}" y="{y0 + part * 0.2:.1f}" width="{tw:.1f}" '
                               f'height="{part * 0.6:.1f}" fill="{fill}" fill-opacity="0.35"><title>{escape(b.name)} '
                               f'evaluation {b.end:.0f}-{tails[b.name]:.0f} s</title></rect>')
                out.append(f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{part:.1f}" fill="{fill}" '
                           f'stroke="white"><title>{escape(b.name)} {b.start:.0f}-{b.end:.0f} s{shared}</title></rect>')
                small = ' font-size="8"' if len(split) > 1 else ""
                out.append(f'<text x="{x + 3:.1f}" y="{y0 + min(13.0, part - 2):.1f}" fill="white"{small}>'
                           f'{escape(b.name)}</text>')
        y += (len(devices) + 1) * lane
    out.append(f'<text x="{left}" y="{height - 6}">0 s</text>')
    out.append(f'<text x="{left + width - 40}" y="{height - 6}">{end:.0f} s</text>')
    out.append("</svg>")
    return "\n".join(out)


def fleet_section(run: Path) -> str:
    """The report's fleet section: the timeline picture and each job's start-up; "" for a one-job run."""
    path = run / RUN_FILES.fleet
    if not path.is_file():
        return ""
    try:
        record: dict[str, Any] = read_json(path)
    except (OSError, ValueError):
        return '<h2>Fleet</h2><p class="muted">fleet.json is unreadable.</p>'
    attempts = attempts_of(record)
    if not attempts:
        return ""
    devices = sorted({g for a in attempts for g in a.gpus})
    unit = "GPU" if fleet_device(run, record) == "cuda" else "CPU slot"
    bars = [_Bar(a.name, a.gpus, a.start, a.released) for a in attempts]
    span = max(a.end for a in attempts)
    # A device shared by two attempts counts once while either holds it.
    busy = sum(held_seconds(bars, d) for d in devices) / max(span * len(devices), 1e-9)
    svg = svg_timeline([(f"measured (one bar per attempt; pale: its evaluation after the {unit}s went back)", bars)],
                       devices, unit=unit, tails={a.name: a.end for a in attempts})
    parts = ["<h2>Fleet</h2>", f'<figure class="plot">{svg}<figcaption class="muted">Fleet timeline: '
             f"{len(attempts)} attempt(s) on {len(devices)} {unit}(s), {span:.0f} s from the first start to the last "
             f"end; {unit}s held {busy:.0%} of that time</figcaption></figure>", _startup_table(record, unit)]
    return "\n".join(parts)


def fleet_device(run: Path, record: dict[str, Any]) -> str:
    """cuda or cpu: what the fleet's devices were (fleet.json's `device`; an older one: its first job's job.json)."""
    device = record.get("device")
    if device in ("cuda", "cpu"):
        return device
    for name in record.get("jobs") or {}:
        try:
            job = read_json(run / name / RUN_FILES.job)
        except (OSError, ValueError):
            continue
        if isinstance(job, dict) and job.get("device") in ("cuda", "cpu"):
            return job["device"]
    return "cuda"


def _startup_table(record: dict[str, Any], unit: str = "GPU") -> str:
    names = [c for c, _ in COMPONENTS] + [c for c, _ in LAUNCHER] + [c for c, _ in FIRST_STEP] + [
        "to first step", "start-up on the GPUs", "teardown", EVAL_START, "evaluation"] + [c for c, _ in EVALUATION]
    jobs = [(n, st.get("startup") or {}) for n, st in (record.get("jobs") or {}).items()]
    jobs = [(n, c) for n, c in jobs if c.get("to first step") is not None]
    if not jobs:
        return ""
    used = [c for c in names if any(c in comp for _, comp in jobs)]
    # fleet.json's key says GPUs whatever the device: the column says what the devices were
    head = "".join(f"<th>{escape(h.replace('GPUs', unit + 's'))}</th>" for h in ["job", *used])
    rows = "".join("<tr><td>" + escape(n) + "</td>" + "".join(
        f'<td class="num">{comp[c]:.1f}</td>' if c in comp else "<td>-</td>" for c in used) + "</tr>"
        for n, comp in jobs)
    return ("<h3>Start-up per job (seconds, latest attempt)</h3><table><thead><tr>" + head
            + f"</tr></thead><tbody>{rows}</tbody></table>")


def held_seconds(bars: Sequence[BarLike], device: int) -> float:
    """Seconds `device` was held by at least one bar (the union of their intervals)."""
    total, reach = 0.0, float("-inf")
    for b in sorted((b for b in bars if device in b.gpus), key=lambda b: b.start):
        if b.end > reach:
            total += b.end - max(b.start, reach)
            reach = b.end
    return total


class _Bar:
    """A measured attempt as a bar (start to the release of its GPUs)."""

    def __init__(self, name: str, gpus: tuple[int, ...], start: float, end: float) -> None:
        self.name, self.gpus, self.start, self.end = name, gpus, start, end
