"""The blind sets' scorer (bench/plan_blind_score.py): its parts work (what every set must hold: test_blind_sets.py).

No test here predicts a blind row: the set is scored once, by hand (bench/plan_blind_score.py),
so that nobody tunes the planner against it through the test suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import plan_blind_score as blind


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
