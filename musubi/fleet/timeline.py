"""A fleet's schedule drawn per GPU as text for `musubi run --dry-run` (the SVG is musubi/diagnose/fleet_view.py)."""

from __future__ import annotations

import string
from collections.abc import Sequence

from musubi.diagnose.fleet_view import held_seconds, lanes
from musubi.fleet.moldable import Bar

#: One letter per job on the text timeline (the key under it names them).
LETTERS = string.ascii_letters + string.digits


def text_timeline(bars: Sequence[Bar], devices: Sequence[int], unit: str = "GPU", columns: int = 64) -> list[str]:
    """One line per device (two where two jobs shared it: the second marked '+'): a letter per job across time
    ('.' idle), then the key (letter: job, start-end)."""
    end = max((b.end for b in bars), default=0.0)
    if end <= 0:
        return []
    step = end / columns
    letter = {b.name: LETTERS[i % len(LETTERS)] for i, b in enumerate(sorted(bars, key=lambda b: (b.start, b.name)))}
    lines = [f"timeline: 1 column = {step:.1f} s, {end:.0f} s in all ('.' = idle)"]
    split = {d: lanes(bars, d) or [[]] for d in devices}
    label = max(len(f"{unit} {d}") + len(split[d]) - 1 for d in devices)
    for d in devices:
        for k, lane in enumerate(split[d]):
            row = ["."] * columns
            for b in lane:
                for c in range(int(b.start / step), max(int(b.start / step) + 1, round(b.end / step))):
                    row[min(c, columns - 1)] = letter[b.name]
            lines.append(f"{unit} {d}{'+' * k}".ljust(label) + " |" + "".join(row) + "|")
    for b in sorted(bars, key=lambda b: (b.start, b.name)):
        lines.append(f"  {letter[b.name]} {b.name}: {b.start:.0f}-{b.end:.0f} s on {unit} "
                     f"{','.join(map(str, b.gpus))}")
    return lines


def busy_fraction(bars: Sequence[Bar], devices: Sequence[int]) -> float:
    """GPU-seconds busy over GPU-seconds of the makespan (0 for an empty schedule)."""
    end = max((b.end for b in bars), default=0.0)
    if end <= 0 or not devices:
        return 0.0
    # A device two jobs shared counts once while either holds it.
    return sum(held_seconds(bars, d) for d in devices) / (end * len(devices))
