"""The third blind set (bench/plan_blind_runs3.csv): its derived figures follow the printed ones (what every
set must hold: test_blind_sets.py).

No test here predicts a row: the set is scored once, by hand
(`python bench/plan_blind_score.py --csv bench/plan_blind_runs3.csv`), so that nobody tunes the
planner against it through the test suite.
"""

from __future__ import annotations

import pytest

from bench import plan_blind3_gather as gather3
from bench import plan_blind_score as blind

ROWS = blind.load_rows(gather3.OUT)






def test_the_derived_throughput_follows_the_printed_figures() -> None:
    by_name = {r["name"]: r for r in ROWS}

    def tps(name: str) -> float:
        return float(by_name[name]["measured_tokens_per_s_per_gpu"])
    # Pax 175B on 256 H100: 51.00 sequences/s of 2048 tokens
    assert tps("pax-gpt175b-h100-tebf16-256g") == pytest.approx(51.0 * 2048 / 256, rel=1e-3)
    # GLM-130B: 4224 sequences of 2048 in 88.5 s on 768 GPUs (the notes' 48 samples/s agrees)
    assert tps("glm-130b-bsz4224-768g") == pytest.approx(4224 * 2048 / 88.5 / 768, rel=1e-3)
    assert 4224 / 88.5 == pytest.approx(48, abs=0.5)
    # KempnerForge prints total tok/s; its step time and batch give the same figure
    assert tps("kempner-llama3-13b-tp4-fsdp-32g") * 32 == pytest.approx(128 * 4096 / 5.03, rel=0.01)
    # Megatron-DeepSpeed's own FLOP formula turns 68 TFLOPS at 2k back into tokens/s
    row = by_name["mds-longseq-gpt30b-tp32-2k-32g"]
    per_token = gather3.mds_hw_flops_per_token(2048, 64, 6144, 53248)
    assert float(row["measured_tflops_per_gpu"]) * 1e12 / per_token == pytest.approx(tps(row["name"]), rel=1e-3)
    # the printed model sizes match the shapes the rows carry
    assert float(by_name["kempner-llama3-13b-fsdp-8g"]["params_b"]) == pytest.approx(14.84, abs=0.01)
    assert float(by_name["kempner-llama3-70b-tp4-fsdp-32g"]["params_b"]) == pytest.approx(70.55, abs=0.02)
