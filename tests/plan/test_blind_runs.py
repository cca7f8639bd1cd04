"""The blind set (bench/plan_blind_runs.csv) parses, names catalog GPUs and sources; its scorer's parts work.

No test here predicts a blind row: the set is scored once, by hand (bench/plan_blind_score.py),
so that nobody tunes the planner against it through the test suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import plan_blind_gather as gather
from bench import plan_blind_score as blind
from musubi.plan.catalog import get_gpu
from musubi.plan.layout import parse_layout
from musubi.plan.validate import DATA

ROWS = blind.load_rows(blind.BLIND_CSV)


def test_the_blind_set_has_the_validation_schema_and_enough_rows() -> None:
    gathered = (DATA / "gathered_runs.csv").read_text(encoding="utf-8")
    header = next(line for line in gathered.splitlines() if not line.startswith("#"))
    assert list(ROWS[0]) == header.split(",")
    assert 20 <= len(ROWS) <= 40
    assert len({r["name"] for r in ROWS}) == len(ROWS), "row names must be unique"


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_every_row_names_a_catalog_gpu_a_source_and_a_measurement(row: dict[str, str]) -> None:
    assert get_gpu(row["gpu"]).name == row["gpu"]
    assert row["source"] and row["table"] and row["assumed"]
    assert re.match(r"https://(arxiv\.org/abs/\d{4}\.\d{5}|github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/)", row["url"])
    assert float(row["measured_tokens_per_s_per_gpu"] or row["measured_tflops_per_gpu"]) > 0
    layout = parse_layout(row["published_layout"])
    assert layout.tp * layout.pp * layout.cp * layout.dp == int(row["n_gpus"])
    assert blind.spec_fields(row)["layers"] == int(row["layers"])


def test_the_csv_is_what_the_gather_script_writes() -> None:
    assert gather.csv_text(gather.blind_rows()) == blind.BLIND_CSV.read_text(encoding="utf-8")


def test_no_blind_source_is_in_the_validation_tables() -> None:
    seen = {r["url"] for p in DATA.glob("*.csv") for r in blind.load_rows(p) if r.get("url")}
    assert not seen & {r["url"] for r in ROWS}


def test_the_scorer_predicts_a_made_up_row_through_the_cli(tmp_path: Path) -> None:
    row = {"name": "made-up-llama-16g", "regime": "fsdp", "arch": "llama", "layers": "16", "hidden": "2048",
           "heads": "16", "kv_heads": "8", "ffn": "8192", "vocab": "32000", "seq": "2048", "gpu": "H100-SXM",
           "n_gpus": "16", "global_batch_seqs": "64", "published_layout": "dp=16,zero=3,micro=2",
           "measured_tokens_per_s_per_gpu": "10000", "flops_convention": ""}
    scored = blind.score_row(row, blind.cli_predict(row, tmp_path))
    assert scored.family == "made-up-llama" and scored.n_gpus == 16 and scored.predicted > 0
    assert scored.quantity == "tokens/s/GPU" and scored.dominant


def test_trend_signs_count_a_change_under_one_percent_as_flat() -> None:
    def s(name: str, n: int, measured: float, predicted: float) -> blind.Scored:
        return blind.Scored(name, blind.family_of(name), "r", n, "tokens/s/GPU", measured, predicted, "", "")
    rows = [s("a-8g", 8, 100, 100), s("a-64g", 64, 90, 99.5), s("b-8g", 8, 100, 100), s("b-64g", 64, 99.5, 100.4),
            s("c-8g", 8, 100, 100)]
    assert [(f, ok) for f, *_, ok in blind.trends(rows)] == [("a", False), ("b", True)]  # c has one GPU count
    assert blind.summary(rows)[-1][:2] == ("all", 5)
    text = blind.report(rows, apart=("b-",))
    blind_part, apart_part = text.split("SCORED APART")
    assert "a-64g" in blind_part and "b-64g" not in blind_part and "b-64g" in apart_part


def test_an_unknown_arch_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="use llama, nemotron, gpt or bloom"):
        blind.spec_fields({"name": "x", "arch": "rwkv", "layers": "1", "hidden": "8", "heads": "1", "vocab": "8",
                           "seq": "8"})
