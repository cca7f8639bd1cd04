"""Block recompute: full recomputation of only the first N layers of each model chunk.

Megatron-LM's `--recompute-granularity full --recompute-method block --recompute-num-layers N` ("the first N
layers of each pipeline stage (chunk) are recomputed", its arguments' help), fms-fsdp's and torchtitan's
checkpointing of every k-th block: the recomputed layers keep only their input and run their forward again
inside backward, the others keep everything. The planner's `recompute=full,recompute_layers=N`.
"""

from __future__ import annotations

import pytest

from musubi.plan import get_gpu, make_cluster, predict
from musubi.plan.errors import PlanError
from musubi.plan.flops import hardware_flops_per_step, model_flops_per_step
from musubi.plan.layout import check_layout, parse_layout, resolve_layout
from musubi.plan.memory import activation_bytes_per_layer, estimate_memory, recomputed_share
from musubi.plan.spec import preset

GPT3 = preset("gpt3-175b")  # 96 layers
BASE = "tp=8,pp=8,dp=1,vpp=3,micro=1"  # 24 chunks of 4 layers


def _mem(text: str):  # type: ignore[no-untyped-def]
    return estimate_memory(GPT3, resolve_layout(parse_layout(text), 64), 64)


def test_half_the_layers_recomputed_keep_half_way_between_none_and_full() -> None:
    none, full, half = _mem(BASE + ",recompute=none"), _mem(BASE + ",recompute=full"), \
        _mem(BASE + ",recompute=full,recompute_layers=2")
    layout = resolve_layout(parse_layout(BASE + ",recompute=none"), 64)
    working = activation_bytes_per_layer(GPT3, layout) / 2**30  # one layer's working set during its backward
    # stored = held x (share x layer input + (1 - share) x whole layer) + one layer's working set
    assert half.activations == pytest.approx((none.activations + full.activations + working) / 2, rel=1e-9)
    assert full.activations < half.activations < none.activations
    assert half.weights == none.weights


def test_recomputed_share_counts_the_first_n_layers_of_each_chunk() -> None:
    layout = resolve_layout(parse_layout(BASE + ",recompute=full,recompute_layers=1"), 64)
    assert recomputed_share(GPT3, layout) == 0.25 and recomputed_share(GPT3, layout, 0) == 0.25
    assert recomputed_share(GPT3, resolve_layout(parse_layout(BASE + ",recompute=full"), 64)) == 1.0
    assert recomputed_share(GPT3, resolve_layout(parse_layout(BASE + ",recompute=selective"), 64)) == 0.0


def test_the_recomputed_forward_is_paid_in_step_time_and_hardware_flops_by_share() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 64)
    steps = [predict(GPT3, cluster, parse_layout(BASE + f",recompute={r}"), 64).step_time_s
             for r in ("none", "full,recompute_layers=2", "full")]
    assert steps[0] < steps[1] < steps[2]
    assert steps[1] == pytest.approx((steps[0] + steps[2]) / 2, rel=0.03)
    model = model_flops_per_step(GPT3, 64)
    extra_full = hardware_flops_per_step(GPT3, "full", 64) - model
    assert hardware_flops_per_step(GPT3, "full", 64, 0.5) - model == pytest.approx(extra_full / 2, rel=1e-12)


def test_bad_recompute_layers_is_one_line() -> None:
    with pytest.raises(PlanError, match="needs recompute=full"):
        check_layout(resolve_layout(parse_layout(BASE + ",recompute_layers=2"), 64), GPT3, 64)
    with pytest.raises(PlanError, match="at most 4 layers"):
        check_layout(resolve_layout(parse_layout(BASE + ",recompute=full,recompute_layers=5"), 64), GPT3, 64)
    with pytest.raises(PlanError, match=">= 0"):
        parse_layout("recompute=full,recompute_layers=-1")
    assert "recompute_layers=2" in parse_layout(BASE + ",recompute=full,recompute_layers=2").text()


def test_a_named_recompute_layers_is_kept_by_the_fill() -> None:
    from musubi.plan.complete import complete_layout
    from musubi.plan.layout import given_keys

    cluster = make_cluster(get_gpu("A100-80GB"), 64)
    text = BASE + ",recompute_layers=3"  # recompute left out: N layers recomputed means recompute=full
    layout, chosen = complete_layout(GPT3, cluster, parse_layout(text), given_keys(text), 64)
    assert (layout.recompute, layout.recompute_layers) == ("full", 3) and "recompute" not in chosen
