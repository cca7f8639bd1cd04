"""Every blind set of published runs (bench/plan_blind_runs{,2,3,4,5}.csv) parses, names catalog GPUs and sources, is
what its gather script writes, and shares no source with the validation tables or an earlier set.

No test here predicts a row: each set is scored once, by hand (`python bench/plan_blind_score.py --csv ...`), so
that nobody tunes the planner against it through the test suite. A set's own derived figures are tested beside
its gatherer (test_blind_runs{,2,3,4}.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from bench import plan_blind2_gather as gather2
from bench import plan_blind3_gather as gather3
from bench import plan_blind4_gather as gather4
from bench import plan_blind5_gather as gather5
from bench import plan_blind_gather as gather1
from bench import plan_blind_score as blind
from musubi.plan.catalog import get_gpu
from musubi.plan.layout import parse_layout
from musubi.plan.validate import DATA


@dataclass(frozen=True)
class BlindSet:
    """One set: its CSV and gatherer, the rows it must hold, the sets before it, how strictly sources must differ."""

    name: str
    csv: Path
    gather: ModuleType
    min_rows: int
    tflops_allowed: bool  # the first set also takes runs that print TFLOP/s only
    earlier: tuple[Path, ...]
    by_repository: bool  # the same paper or repository under another table or commit counts as seen too


SETS = [BlindSet("first", blind.BLIND_CSV, gather1, 20, True, (), False),
        BlindSet("second", gather2.OUT, gather2, 25, False, (blind.BLIND_CSV,), True),
        BlindSet("third", gather3.OUT, gather3, 25, False, (blind.BLIND_CSV, gather2.OUT), True),
        BlindSet("fourth", gather4.OUT, gather4, 25, False, (blind.BLIND_CSV, gather2.OUT, gather3.OUT), True),
        # The fifth is smaller: most tables its gatherer found were FP8, on cards outside the catalog or in plots.
        BlindSet("fifth", gather5.OUT, gather5, 15, False,
                 (blind.BLIND_CSV, gather2.OUT, gather3.OUT, gather4.OUT), True)]
ROWS = [(s, row) for s in SETS for row in blind.load_rows(s.csv)]


@pytest.mark.parametrize("s", SETS, ids=[s.name for s in SETS])
def test_the_set_has_the_validation_schema_and_enough_rows(s: BlindSet) -> None:
    rows = blind.load_rows(s.csv)
    gathered = (DATA / "gathered_runs.csv").read_text(encoding="utf-8")
    header = next(line for line in gathered.splitlines() if not line.startswith("#"))
    assert list(rows[0]) == header.split(",")
    assert s.min_rows <= len(rows) <= 40
    assert len({r["name"] for r in rows}) == len(rows), "row names must be unique"


@pytest.mark.parametrize(("s", "row"), ROWS, ids=[f"{s.name}-{r['name']}" for s, r in ROWS])
def test_every_row_names_a_catalog_gpu_a_source_and_a_measurement(s: BlindSet, row: dict[str, str]) -> None:
    assert get_gpu(row["gpu"]).name == row["gpu"]
    assert row["source"] and row["table"] and row["assumed"]
    assert re.match(r"https://(arxiv\.org/abs/\d{4}\.\d{5}|github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/)", row["url"])
    measured = row["measured_tokens_per_s_per_gpu"] or (row["measured_tflops_per_gpu"] if s.tflops_allowed else "")
    assert float(measured) > 0
    layout = parse_layout(row["published_layout"])
    assert layout.tp * layout.pp * layout.cp * layout.dp == int(row["n_gpus"])
    assert blind.spec_fields(row)["layers"] == int(row["layers"])


@pytest.mark.parametrize("s", SETS, ids=[s.name for s in SETS])
def test_the_csv_is_what_the_gather_script_writes(s: BlindSet) -> None:
    assert s.gather.csv_text(s.gather.blind_rows()) == s.csv.read_text(encoding="utf-8")


@pytest.mark.parametrize("s", SETS, ids=[s.name for s in SETS])
def test_no_source_is_in_the_validation_tables_or_an_earlier_set(s: BlindSet) -> None:
    seen = {r["url"] for p in DATA.glob("*.csv") for r in blind.load_rows(p) if r.get("url")}
    seen |= {r["url"] for path in s.earlier for r in blind.load_rows(path)}
    mine = {r["url"] for r in blind.load_rows(s.csv)}
    assert not mine & seen
    if s.by_repository:
        def where(url: str) -> str:
            return re.sub(r"/blob/.*", "", url)
        assert not {where(u) for u in mine} & {where(u) for u in seen}
