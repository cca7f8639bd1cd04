"""The second blind set (bench/plan_blind_runs2.csv) parses, names catalog GPUs and sources, and is its own.

No test here predicts a row: the set is scored once, by hand
(`python bench/plan_blind_score.py --csv bench/plan_blind_runs2.csv`), so that nobody tunes the
planner against it through the test suite.
"""

from __future__ import annotations

import re

import pytest

from bench import plan_blind2_gather as gather2
from bench import plan_blind_score as blind
from musubi.plan.catalog import get_gpu
from musubi.plan.layout import parse_layout
from musubi.plan.validate import DATA

ROWS = blind.load_rows(gather2.OUT)


def test_the_second_blind_set_has_the_validation_schema_and_enough_rows() -> None:
    gathered = (DATA / "gathered_runs.csv").read_text(encoding="utf-8")
    header = next(line for line in gathered.splitlines() if not line.startswith("#"))
    assert list(ROWS[0]) == header.split(",")
    assert 25 <= len(ROWS) <= 40
    assert len({r["name"] for r in ROWS}) == len(ROWS), "row names must be unique"


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_every_row_names_a_catalog_gpu_a_source_and_a_measurement(row: dict[str, str]) -> None:
    assert get_gpu(row["gpu"]).name == row["gpu"]
    assert row["source"] and row["table"] and row["assumed"]
    assert re.match(r"https://(arxiv\.org/abs/\d{4}\.\d{5}|github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/)", row["url"])
    assert float(row["measured_tokens_per_s_per_gpu"]) > 0
    layout = parse_layout(row["published_layout"])
    assert layout.tp * layout.pp * layout.cp * layout.dp == int(row["n_gpus"])
    assert blind.spec_fields(row)["layers"] == int(row["layers"])


def test_the_csv_is_what_the_gather_script_writes() -> None:
    assert gather2.csv_text(gather2.blind_rows()) == gather2.OUT.read_text(encoding="utf-8")


def test_no_source_is_in_the_validation_tables_or_the_first_blind_set() -> None:
    seen = {r["url"] for p in DATA.glob("*.csv") for r in blind.load_rows(p) if r.get("url")}
    first = {r["url"] for r in blind.load_rows(blind.BLIND_CSV)}
    mine = {r["url"] for r in ROWS}
    assert not mine & (seen | first)
    # the same paper or repository under another table or commit counts as seen too
    def where(url: str) -> str:
        return re.sub(r"/blob/.*", "", url)
    assert not {where(u) for u in mine} & {where(u) for u in seen | first}


def test_the_derived_throughput_follows_the_printed_figures() -> None:
    by_name = {r["name"]: r for r in ROWS}
    # Nemotron-4 340B Table 2: 2304 sequences of 4096 in 8.0 s on 6144 GPUs
    assert float(by_name["nemotron4-340b-tab2-6144g"]["measured_tokens_per_s_per_gpu"]) == pytest.approx(
        2304 * 4096 / 8.0 / 6144, rel=1e-3)
    # Megatron-Core 177B: the printed sizes are an untied GPT (177B), and 432.8 TFLOP/s is 44 % of 989
    row = by_name["mcore080-gpt177b-2304g"]
    assert float(row["params_b"]) == pytest.approx(177, abs=0.5)
    assert round(float(row["measured_tflops_per_gpu"]) / gather2.H100_BF16_PEAK, 2) == 0.44
