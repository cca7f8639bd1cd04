"""The second blind set (bench/plan_blind_runs2.csv): its derived figures follow the printed ones (what every
set must hold: test_blind_sets.py).

No test here predicts a row: the set is scored once, by hand
(`python bench/plan_blind_score.py --csv bench/plan_blind_runs2.csv`), so that nobody tunes the
planner against it through the test suite.
"""

from __future__ import annotations

import pytest

from bench import plan_blind2_gather as gather2
from bench import plan_blind_score as blind

ROWS = blind.load_rows(gather2.OUT)






def test_the_derived_throughput_follows_the_printed_figures() -> None:
    by_name = {r["name"]: r for r in ROWS}
    # Nemotron-4 340B Table 2: 2304 sequences of 4096 in 8.0 s on 6144 GPUs
    assert float(by_name["nemotron4-340b-tab2-6144g"]["measured_tokens_per_s_per_gpu"]) == pytest.approx(
        2304 * 4096 / 8.0 / 6144, rel=1e-3)
    # Megatron-Core 177B: the printed sizes are an untied GPT (177B), and 432.8 TFLOP/s is 44 % of 989
    row = by_name["mcore080-gpt177b-2304g"]
    assert float(row["params_b"]) == pytest.approx(177, abs=0.5)
    assert round(float(row["measured_tflops_per_gpu"]) / gather2.H100_BF16_PEAK, 2) == 0.44
