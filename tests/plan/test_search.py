"""Search: layouts that multiply to the GPU count, rejected with one-line reasons, ranked by step time."""

from __future__ import annotations

from musubi.plan import get_gpu, make_cluster, preset
from musubi.plan.comm import place_group
from musubi.plan.efficiency import DEFAULT_EFFICIENCY
from musubi.plan.layout import parse_layout, resolve_layout
from musubi.plan.search import search


def test_llama3_405b_on_16384_h100_keeps_tp_in_the_node_and_says_why_not_16() -> None:
    cluster = make_cluster(get_gpu("H100-SXM"), 16384)
    result = search(preset("llama3-405b"), cluster, 2048, top=10)
    assert result.candidates, result.rejection_summary()
    times = [p.step_time_s for p in result.candidates]
    assert times == sorted(times)
    for p in result.candidates:
        lay = parse_layout(p.layout)
        assert lay.tp <= 8 and p.fits and lay.tp * lay.pp * (lay.dp or 1) * lay.cp == 16384
        assert 0.25 < p.mfu < 0.65  # Llama 3 reports 38-43 % MFU on this machine
    tp16 = [r for r in result.rejections if r.layout == "tp=16"]
    assert len(tp16) == 1 and "NVLink" in tp16[0].reason and "keep tp <= 8" in tp16[0].reason
    assert "\n" not in tp16[0].reason
    memory = [r for r in result.rejections if r.kind == "memory"]
    assert memory and "GiB >" in memory[0].reason


def test_groups_land_on_the_right_tier() -> None:
    cluster = make_cluster(get_gpu("H100-SXM"), 64)
    lay = resolve_layout(parse_layout("tp=8,pp=2"), 64)
    assert place_group(cluster, DEFAULT_EFFICIENCY, 1, lay.tp).tier == "nvlink"
    dp = place_group(cluster, DEFAULT_EFFICIENCY, lay.tp, lay.dp or 1)
    assert dp.tier == "network" and dp.busbw == 50e9 * DEFAULT_EFFICIENCY.network  # one GPU per node: one NIC
    nvl72 = make_cluster(get_gpu("GB200-NVL72"), 144)
    assert place_group(nvl72, DEFAULT_EFFICIENCY, 1, 16).tier == "nvlink"  # spans 4 trays, one NVLink domain
    pcie = make_cluster(get_gpu("L40S"), 8)
    assert place_group(pcie, DEFAULT_EFFICIENCY, 1, 2).tier == "pcie"


def test_generic_detector_search_is_data_parallel() -> None:
    result = search(preset("yolov8m"), make_cluster(get_gpu("RTX-A6000"), 8), 128, top=3)
    assert result.candidates
    for p in result.candidates:
        lay = parse_layout(p.layout)
        assert lay.dp == 8 and lay.tp == lay.pp == 1
