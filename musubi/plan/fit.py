"""The fit of the global efficiency constants: on the fit set (fit_runs.csv) only, never the held-out set.

A coarse grid over the two constants the fit set constrains (large-GEMM and memory-bound
fractions of A100 peaks; the rows are all A100 Megatron runs) chooses the pair with the least
mean |error|. efficiency.py's defaults are that pair (tests/plan/test_heldout.py checks it),
and this module reads no other table: the held-out runs judge the result, they do not shape it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.validate import FIT_CSV, check_row, load_rows

MATMUL_GRID = (0.70, 0.725, 0.75, 0.775, 0.80, 0.825, 0.85)
HBM_GRID = (0.5, 0.55, 0.6, 0.65, 0.7)


@dataclass(frozen=True)
class Fit:
    """The chosen constants and their mean / max |error| on the fit set."""

    matmul: float
    hbm: float
    mean_error: float
    max_error: float


def fit_constants(path: Path = FIT_CSV, base: Efficiency = DEFAULT_EFFICIENCY) -> Fit:
    """Grid-search matmul and hbm on the rows of `path` (the fit set); least mean |error| wins."""
    rows = load_rows(path)
    best: Fit | None = None
    for matmul in MATMUL_GRID:
        for hbm in HBM_GRID:
            eff = replace(base, matmul=matmul, hbm=hbm)
            errs = [abs(check_row(row, eff).error) for row in rows]
            fit = Fit(matmul, hbm, sum(errs) / len(errs), max(errs))
            if best is None or fit.mean_error < best.mean_error:
                best = fit
    assert best is not None
    return best
