"""What the interleaved-block benches share (bench/telemetry_ab.py, bench/loop_ab.py): their common options,
the --modes check, each mode's cost paired with the base mode's block of the same cycle, and the report.

No torch here: bench/loop_ab.py reads its options before it pins its rank and imports torch, as a worker does.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def paired_rows(per_mode: dict[str, list[float]], base: str) -> dict[str, dict[str, Any]]:
    """Per mode: its median block step (ms) and its cost over the `base` mode's block of the same cycle (paired
    ratios: median, mean, range, in %), and the blocks themselves."""
    rows = {}
    for m, blocks in per_mode.items():
        ratios = [v / b for v, b in zip(blocks, per_mode[base], strict=True)]
        rows[m] = {"step_ms_median": round(statistics.median(blocks), 3),
                   "cost_pct_median": round((statistics.median(ratios) - 1) * 100, 2),
                   "cost_pct_mean": round((statistics.fmean(ratios) - 1) * 100, 2),
                   "cost_pct_min_max": [round((min(ratios) - 1) * 100, 2), round((max(ratios) - 1) * 100, 2)],
                   "block_ms": [round(v, 3) for v in blocks]}
    return rows


def add_block_options(ap: argparse.ArgumentParser, modes: tuple[str, ...], default_modes: tuple[str, ...],
                      block: int, cpu_help: str) -> None:
    """The options every interleaved-block bench shares (this one, bench/loop_ab.py): warm-up, block, cycles,
    modes, the CPU rehearsal, the JSON file."""
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps of each way first (cuDNN autotuning)")
    ap.add_argument("--block", type=int, default=block, help="steps a block")
    ap.add_argument("--cycles", type=int, default=8, help="cycles; each runs every mode once")
    ap.add_argument("--modes", default=",".join(default_modes), help=f"comma-separated, from {', '.join(modes)}")
    ap.add_argument("--cpu", action="store_true", help=cpu_help)
    ap.add_argument("--json", default=None)


def chosen_modes(text: str, base: str, modes: tuple[str, ...]) -> list[str]:
    """The --modes list; SystemExit unless it holds `base` (every cost is paired with it) and known modes."""
    chosen = [m for m in text.split(",") if m]
    if base not in chosen or any(m not in modes for m in chosen):
        raise SystemExit(f"--modes must include {base} and come from {', '.join(modes)}")
    return chosen


def report(label: str, rows: dict[str, dict[str, Any]], out: dict[str, Any], path: str | None) -> None:
    """One console line a mode (what `paired_rows` found, and the row's "gc" where recorded), then the whole
    result as one JSON line, and into `path` when given."""
    for m, r in rows.items():
        print(f"{label} {m:11s} step {r['step_ms_median']:8.2f} ms  cost median {r['cost_pct_median']:+6.2f} %  "
              f"mean {r['cost_pct_mean']:+6.2f} %  range {r['cost_pct_min_max'][0]:+.2f}.."
              f"{r['cost_pct_min_max'][1]:+.2f} %" + (f"  gc {r['gc']}" if "gc" in r else ""), flush=True)
    print(json.dumps(out), flush=True)
    if path:
        Path(path).write_text(json.dumps(out, indent=1) + "\n")
