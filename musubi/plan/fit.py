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
from musubi.plan.validate import FIT_CSV, Check, check_row, load_rows

MATMUL_GRID = (0.70, 0.725, 0.75, 0.775, 0.80, 0.825, 0.85)
HBM_GRID = (0.5, 0.55, 0.6, 0.65, 0.7)


@dataclass(frozen=True)
class Fit:
    """The chosen constants and their mean / max |error| on the fit set."""

    matmul: float
    hbm: float
    mean_error: float
    max_error: float


def fit_rows(rows: list[dict[str, str]], base: Efficiency = DEFAULT_EFFICIENCY) -> Fit:
    """Grid-search matmul and hbm on `rows`; least mean |error| wins."""
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


def fit_constants(path: Path = FIT_CSV, base: Efficiency = DEFAULT_EFFICIENCY) -> Fit:
    """Grid-search matmul and hbm on the rows of `path` (the fit set); least mean |error| wins."""
    return fit_rows(load_rows(path), base)


def leave_one_source_out(path: Path = FIT_CSV, base: Efficiency = DEFAULT_EFFICIENCY) -> list[tuple[str, Fit, list[Check]]]:
    """Each source of the fit set predicted by constants refitted on the other sources' rows alone.

    What the model does on a paper it did not see: (source, the refit, that source's checks). Only the
    fit set's rows move a constant, so the held-out, gathered and never-seen sets need no such pass.
    """
    rows = load_rows(path)
    out = []
    for source in sorted({row["source"] for row in rows}):
        refit = fit_rows([row for row in rows if row["source"] != source], base)
        eff = replace(base, matmul=refit.matmul, hbm=refit.hbm)
        out.append((source, refit, [check_row(row, eff) for row in rows if row["source"] == source]))
    return out
