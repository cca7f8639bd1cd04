"""Overlapped communication is not free: compute beside a running collective slows (SM and HBM contention).

"Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
Implications"
(arXiv:2507.03114, abstract): with collectives overlapped, GPT and LLaMA compute on 4x A100, H100, MI250 and MI210
runs 18.9 % slower on average (40 % at most) than with no communication beside it. The planner takes the average
as a prior (Efficiency.contention): a collective shorter than the slowed compute adds comm x c / (1 + c); one
longer than it is the critical path and adds comm - compute, as before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from musubi.plan import get_gpu, make_cluster, predict
from musubi.plan.comm import all_reduce_s, place_group
from musubi.plan.efficiency import DEFAULT_EFFICIENCY
from musubi.plan.layout import parse_layout
from musubi.plan.predict import gradient_buckets
from musubi.plan.spec import preset

C = DEFAULT_EFFICIENCY.contention
FREE = replace(DEFAULT_EFFICIENCY, contention=0.0)


def test_the_prior_is_the_published_average() -> None:
    assert C == 0.189


def test_a_hidden_gradient_all_reduce_costs_c_over_1_plus_c_of_itself() -> None:
    """DDP across 4 nodes of A100: the all-reduce hides under the last backward; with contention it delays it."""
    spec = preset("llama3-8b")
    cluster = make_cluster(get_gpu("A100-80GB"), 32)
    layout = parse_layout("dp=32,zero=0,micro=1,recompute=full")
    free, paid = predict(spec, cluster, layout, 64, FREE), predict(spec, cluster, layout, 64)
    assert free.data_parallel is not None and paid.data_parallel is not None
    busy = paid.data_parallel.busy_s
    # all but the last gradient bucket fits under the backward; that bucket runs after it, alone (test_dp_buckets.py)
    grads = paid.data_parallel.bytes_per_gpu / (2 * 31 / 32)  # the ring sends 2 (n-1)/n of the gradient
    tail = all_reduce_s(grads / gradient_buckets(grads, 32, 2), place_group(cluster, DEFAULT_EFFICIENCY, 1, 32))
    assert free.data_parallel.exposed_s == pytest.approx(tail, rel=1e-9)
    assert busy < paid.data_parallel.window_s
    assert paid.data_parallel.exposed_s == pytest.approx((busy - tail) * C / (1 + C) + tail, rel=1e-9)
    assert paid.step_time_s > free.step_time_s


def test_a_collective_longer_than_the_compute_is_the_critical_path_either_way() -> None:
    """ZeRO-3 175B on 1,536 A100s at micro-batch 1 (Narayanan 2021 Table 2's largest scale): the gathers are the
    step; slowing the compute hidden under them changes nothing."""
    spec = preset("gpt3-175b")
    cluster = make_cluster(get_gpu("A100-80GB"), 1536)
    layout = parse_layout("dp=1536,zero=3,recompute=full,micro=1")
    free, paid = predict(spec, cluster, layout, 1536, FREE), predict(spec, cluster, layout, 1536)
    assert paid.breakdown_s["exposed_comm_s"] > paid.breakdown_s["compute_s"]
    assert paid.step_time_s == pytest.approx(free.step_time_s, rel=1e-6)
