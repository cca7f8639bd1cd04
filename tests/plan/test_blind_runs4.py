"""The fourth blind set (bench/plan_blind_runs4.csv): its derived figures follow the printed ones (what every
set must hold: test_blind_sets.py).

No test here predicts a row: the set is scored once, by hand
(`python bench/plan_blind_score.py --csv bench/plan_blind_runs4.csv`), so that nobody tunes the
planner against it through the test suite.
"""

from __future__ import annotations

import pytest

from bench import plan_blind4_gather as gather4
from bench import plan_blind_score as blind
from musubi.plan.layout import parse_layout

ROWS = blind.load_rows(gather4.OUT)
BY_NAME = {r["name"]: r for r in ROWS}


def tps(name: str) -> float:
    """A row's tokens/s per GPU as the CSV holds it."""
    return float(BY_NAME[name]["measured_tokens_per_s_per_gpu"])


def test_the_derived_throughput_follows_the_printed_figures() -> None:
    # FlagPerf's Paddle rows print samples/s x 2048 / 8
    assert tps("flagperf-paddle-llama1-7b-sharding2-a100-80g-8g") == pytest.approx(16.67 * 2048 / 8, rel=1e-4)
    # llm.c: the script's tokens per step over its printed step time, per GPU
    assert tps("llmc-gpt2-124m-8g") == pytest.approx(524288 / 0.300 / 8, rel=1e-4)
    assert tps("llmc-gpt2-1558m-8g") == pytest.approx(1048576 / 2.80 / 8, rel=1e-4)
    # FlagPerf's printed MFU for Llama 3 8B on 8 H100 is token/p/s x 6 x 8e9 / 989e12 (its run_pretraining.py)
    assert tps("flagperf-llama3-8b-tp2-8g") * 6 * 8e9 / 989e12 == pytest.approx(0.393, abs=0.001)
    # InternLM's printed TGS is taken as printed
    assert tps("internlm-7b-tp1-zero1-1024g") == 2271


def test_every_row_holds_the_same_tokens_per_step_its_layout_implies() -> None:
    # the global batch is micro x accumulation x dp: a whole number of micro-batches on every data-parallel rank
    for row in ROWS:
        layout = parse_layout(row["published_layout"])
        per_rank = int(row["global_batch_seqs"]) / layout.dp
        assert per_rank == int(per_rank) and per_rank % layout.micro == 0, row["name"]


def test_the_printed_model_sizes_match_the_shapes_the_rows_carry() -> None:
    assert float(BY_NAME["flagperf-llama3-70b-tp8-pp4-64g"]["params_b"]) == pytest.approx(70.55, abs=0.02)
    assert float(BY_NAME["flagperf-paddle-llama1-13b-sharding2-a100-80g-8g"]["params_b"]) == pytest.approx(13.0, abs=0.05)
    assert float(BY_NAME["llmc-gpt2-1558m-8g"]["params_b"]) == pytest.approx(1.56, abs=0.01)
    assert float(BY_NAME["llmc-gpt2-124m-8g"]["params_b"]) == pytest.approx(0.124, abs=0.005)
