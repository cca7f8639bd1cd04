"""Where a one-call device bench writes its JSON, and the writing (gemm_shapes, nccl_sweep, overlap_contention).

The lent machine returns only what lies under $OUT, so there the file goes to $OUT/NAME; elsewhere to a dated file
under bench/results/ (committed with the session's figures). --out wins over both.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def result_path(given: Path | None, name: str, stem: str) -> Path:
    """`given` (--out), else $OUT/NAME where $OUT is set, else bench/results/STEM-DATE[-...].json: `stem` holds
    "{date}" where the date goes (e.g. "gemm-shapes-{date}-H200")."""
    if given is not None:
        return given
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / name
    return REPO / "bench" / "results" / (stem.format(date=dt.date.today().isoformat()) + ".json")


def write_result(result: dict[str, Any], path: Path) -> Path:
    """Write `result` as indented JSON at `path` (its folder made) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"wrote {path}")
    return path
