"""A fleet's schedule drawn per GPU: text for `musubi run --dry-run`, SVG for reports (no plotting library)."""

from __future__ import annotations

import string
from collections.abc import Sequence
from html import escape

from musubi.fleet.moldable import Bar

#: One letter per job on the text timeline (the key under it names them).
LETTERS = string.ascii_letters + string.digits


def text_timeline(bars: Sequence[Bar], devices: Sequence[int], unit: str = "GPU", columns: int = 64) -> list[str]:
    """One line per device: a letter per job across time ('.' idle), then the key (letter: job, start-end)."""
    end = max((b.end for b in bars), default=0.0)
    if end <= 0:
        return []
    step = end / columns
    letter = {b.name: LETTERS[i % len(LETTERS)] for i, b in enumerate(sorted(bars, key=lambda b: (b.start, b.name)))}
    lines = [f"timeline: 1 column = {step:.1f} s, {end:.0f} s in all ('.' = idle)"]
    label = max(len(f"{unit} {d}") for d in devices)
    for d in devices:
        row = ["."] * columns
        for b in bars:
            if d in b.gpus:
                for c in range(int(b.start / step), max(int(b.start / step) + 1, round(b.end / step))):
                    row[min(c, columns - 1)] = letter[b.name]
        lines.append(f"{unit} {d}".ljust(label) + " |" + "".join(row) + "|")
    for b in sorted(bars, key=lambda b: (b.start, b.name)):
        lines.append(f"  {letter[b.name]} {b.name}: {b.start:.0f}-{b.end:.0f} s on {unit} "
                     f"{','.join(map(str, b.gpus))}")
    return lines


def busy_fraction(bars: Sequence[Bar], devices: Sequence[int]) -> float:
    """GPU-seconds busy over GPU-seconds of the makespan (0 for an empty schedule)."""
    end = max((b.end for b in bars), default=0.0)
    if end <= 0 or not devices:
        return 0.0
    return sum((b.end - b.start) * len(b.gpus) for b in bars) / (end * len(devices))


def svg_timeline(rows: Sequence[tuple[str, Sequence[Bar]]], devices: Sequence[int], unit: str = "GPU") -> str:
    """An SVG of one or more schedules (e.g. predicted and measured) on a common time axis: a lane per device."""
    end = max((b.end for _, bars in rows for b in bars), default=1.0) or 1.0
    lane, left, width = 22, 70, 900
    height = sum((len(devices) + 2) * lane for _ in rows) + 30
    scale = width / end
    palette = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
    names = sorted({b.name for _, bars in rows for b in bars})
    color = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           'font-family="sans-serif" font-size="11">']
    y = 0
    for title, bars in rows:
        out.append(f'<text x="4" y="{y + 15}" font-weight="bold">{escape(title)}</text>')
        y += lane
        for i, d in enumerate(devices):
            top = y + i * lane
            out.append(f'<text x="4" y="{top + 15}">{unit} {d}</text>')
            out.append(f'<rect x="{left}" y="{top + 2}" width="{width}" height="{lane - 4}" fill="#eee"/>')
            for b in bars:
                if d in b.gpus:
                    x, w = left + b.start * scale, max(1.0, (b.end - b.start) * scale)
                    out.append(f'<rect x="{x:.1f}" y="{top + 2}" width="{w:.1f}" height="{lane - 4}" '
                               f'fill="{color[b.name]}"><title>{escape(b.name)} {b.start:.0f}-{b.end:.0f} s'
                               f'</title></rect>')
                    out.append(f'<text x="{x + 3:.1f}" y="{top + 15}" fill="white">{escape(b.name)}</text>')
        y += (len(devices) + 1) * lane
    out.append(f'<text x="{left}" y="{height - 6}">0 s</text>')
    out.append(f'<text x="{left + width - 40}" y="{height - 6}">{end:.0f} s</text>')
    out.append("</svg>")
    return "\n".join(out)
