"""Dated figures live in BENCHMARKS.md (today's) and docs/benchmarks-history.md, never in code (issue 44).

A comment or docstring that needs a measured figure points to BENCHMARKS.md and its area instead;
a date beside a figure in code goes stale the day the figure is measured again.
"""

from __future__ import annotations

import re

from tests.conftest import REPO

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def dated_lines(text: str) -> list[int]:
    """Line numbers (1-based) that carry a calendar date."""
    return [i for i, line in enumerate(text.splitlines(), 1) if DATE.search(line)]


def test_no_date_in_code_or_the_makefile() -> None:
    files = sorted((REPO / "musubi").rglob("*.py")) + [REPO / "Makefile"]
    found = [f"{p.relative_to(REPO)}:{n}" for p in files for n in dated_lines(p.read_text(encoding="utf-8"))]
    assert not found, f"dated figures belong in BENCHMARKS.md (leave a pointer there): {found}"


def test_the_checker_sees_a_date() -> None:
    assert dated_lines("x = 1\n# on 4x H200 (2026-11-27): 0.97x\n") == [2]
    assert dated_lines("# see BENCHMARKS.md, fleet\nstep-000000002\n") == []
