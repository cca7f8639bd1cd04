"""How weight-sharded gathers cross nodes: at one GPU's NIC (DeepSpeed ZeRO-3) or over the node's NICs (FSDP)."""

from __future__ import annotations

import pytest

from musubi.plan import PlanError, get_gpu, make_cluster, parse_layout, predict
from musubi.plan.complete import stack_range
from musubi.plan.layout import given_keys
from musubi.plan.spec import preset

LLAMA = preset("llama3-8b")


def test_gather_parses_and_prints_only_where_it_matters() -> None:
    assert parse_layout("dp=16,zero=3,gather=node").gather == "node"
    assert parse_layout("dp=16,zero=3").gather == "nic"
    assert "gather=node" in parse_layout("dp=16,zero=3,gather=node").text()
    assert "gather" not in parse_layout("dp=16,zero=1,gather=node").text()
    with pytest.raises(PlanError, match="gather=ring: expected one of nic, node"):
        parse_layout("dp=16,zero=3,gather=ring")


def test_node_gathers_use_every_nic_of_the_node() -> None:
    """Across 4 nodes, flat FSDP gathers get the node-aggregated ring rate (8 NICs x 25 GB/s x 0.8 on
    A100, capped by NVLink), DeepSpeed-style ones one NIC's 25 GB/s x 0.8; the step follows."""
    cluster = make_cluster(get_gpu("A100-80GB"), 32)
    nic = predict(LLAMA, cluster, parse_layout("dp=32,zero=3,micro=1"), 32)
    node = predict(LLAMA, cluster, parse_layout("dp=32,zero=3,micro=1,gather=node"), 32)
    assert nic.data_parallel is not None and node.data_parallel is not None
    assert nic.data_parallel.gbps == pytest.approx(20.0)
    assert node.data_parallel.gbps == pytest.approx(160.0)
    assert node.step_time_s < nic.step_time_s
    # Inside one node there is no NIC: both are the same NVLink ring.
    one = make_cluster(get_gpu("A100-80GB"), 8)
    a = predict(LLAMA, one, parse_layout("dp=8,zero=3"), 8).step_time_s
    b = predict(LLAMA, one, parse_layout("dp=8,zero=3,gather=node"), 8).step_time_s
    assert a == pytest.approx(b)


def test_the_range_names_gather_only_for_sharded_weights() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 32)
    text = "dp=32,zero=3,micro=1"
    result = stack_range(LLAMA, cluster, parse_layout(text), given_keys(text), 32)
    assert result is not None and "gather" in result[2]
    fast, slow, _ = result
    assert fast.step_time_s < slow.step_time_s
    text = "dp=32,zero=1,micro=1"
    result = stack_range(LLAMA, cluster, parse_layout(text), given_keys(text), 32)
    assert result is not None and "gather" not in result[2]
