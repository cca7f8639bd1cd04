"""Layout parsing and the one-line errors that name the bad factor and show the product."""

from __future__ import annotations

import pytest

from musubi.plan import Layout, PlanError, parse_layout, preset, resolve_layout
from musubi.plan.layout import check_layout


def test_parse_full_layout() -> None:
    lay = parse_layout("tp=8,pp=16,dp=64,cp=1,ep=1,vpp=2,zero=1,recompute=selective,micro=1")
    assert (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.vpp, lay.zero) == (8, 16, 64, 1, 1, 2, 1)
    assert lay.recompute == "selective" and lay.micro == 1
    assert lay.pipeline_schedule == "interleaved" and lay.sequence_parallel
    assert lay.world == 8 * 16 * 64
    assert parse_layout(lay.text()) == lay


def test_parse_options_and_overlap_list() -> None:
    lay = parse_layout("tp=2, overlap=dp,tp, sp=no, attention=unfused, schedule=zb")
    assert lay.overlap == {"dp", "tp"} and lay.sp is False and lay.attention == "unfused"
    assert lay.pipeline_schedule == "zb" and not lay.sequence_parallel
    assert parse_layout("overlap=none").overlap == frozenset()


@pytest.mark.parametrize(("text", "needle"), [
    ("tp=8,micr=2", "'micr' is unknown (did you mean micro?)"),
    ("tp=eight", "tp=eight: expected a whole number"),
    ("tp=0", "tp=0: must be >= 1"),
    ("zero=4", "zero=4: must be 0..3"),
    ("recompute=some", "recompute=some: expected one of none, selective, full"),
    ("tp=8,tp=4", "tp is given twice"),
    ("tp8", "expected key=value"),
    ("", "empty --layout"),
    ("overlap=dp,gossip", "overlap=gossip"),
])
def test_parse_errors(text: str, needle: str) -> None:
    with pytest.raises(PlanError) as e:
        parse_layout(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_dp_is_the_rest_of_the_gpus() -> None:
    assert resolve_layout(parse_layout("tp=8,pp=16"), 16384).dp == 128


def test_product_errors_name_the_factor_and_the_gpu_count() -> None:
    with pytest.raises(PlanError) as e:
        resolve_layout(parse_layout("tp=8,pp=16,dp=64"), 16384)
    msg = str(e.value)
    assert "tp=8 x pp=16 x dp=64 x cp=1 = 8192 GPUs, but there are 16384" in msg and "dp should be 128" in msg
    with pytest.raises(PlanError, match=r"tp=8 x pp=12 x cp=1 = 96 does not divide 16384 GPUs"):
        resolve_layout(parse_layout("tp=8,pp=12"), 16384)
    with pytest.raises(PlanError, match="ep=3 must divide dp x cp"):
        resolve_layout(parse_layout("ep=3"), 8)


def test_model_and_batch_checks() -> None:
    spec = preset("llama3-405b")
    with pytest.raises(PlanError, match="tp=3 does not divide heads=128"):
        check_layout(resolve_layout(Layout(tp=3), 3), spec, 3)
    with pytest.raises(PlanError, match="global batch 100 is not a multiple of dp=64 x micro=1"):
        check_layout(resolve_layout(Layout(tp=8, pp=16), 8192), spec, 100)
    with pytest.raises(PlanError, match="interleaved schedule needs"):
        check_layout(resolve_layout(Layout(tp=8, pp=16, vpp=2), 16384), spec, 128 * 8)
    with pytest.raises(PlanError, match="needs a mixture-of-experts model"):
        check_layout(resolve_layout(Layout(ep=2), 8), spec, 8)
    with pytest.raises(PlanError, match="data parallel only"):
        check_layout(resolve_layout(Layout(tp=2), 8), preset("resnet50"), 8)
