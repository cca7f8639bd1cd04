"""A sharded optimizer's parameter all-gather: hidden under the next forward only where the stack overlaps it.

A ZeRO-1/2 (distributed) optimizer updates its shard, then all-gathers the updated parameters before the next
forward. Megatron-LM overlaps that gather with the forward only with --overlap-param-gather (default off), Apex
DistributedFusedAdam only with overlap_param_sync=True (default False; NeMo launcher's 2022 GPT configs name
distributed_fused_adam without it), and DeepSpeed ZeRO-1/2 and nanotron (ZeroDistributedOptimizer.step calls
_all_gather_params after the update, src/nanotron/optim/zero.py at c252843) never do. The layout says which with
the `param` item of `overlap` (in the default, so a layout that names nothing is priced as before). Run after the
step, the gather does not shrink with the data-parallel group while the compute does: the fixed-global-batch slope.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import typer
from typer.testing import CliRunner

from musubi.cli.plan import plan_command
from musubi.plan import get_gpu, make_cluster, predict
from musubi.plan.comm import all_gather_s, place_group
from musubi.plan.efficiency import DEFAULT_EFFICIENCY
from musubi.plan.layout import DEFAULT_OVERLAP, parse_layout
from musubi.plan.predict import gradient_buckets
from musubi.plan.spec import TransformerSpec

FREE = replace(DEFAULT_EFFICIENCY, contention=0.0)
# NeMo launcher's GPT 5B (conf/training/gpt3/5b.yaml at 3579cdb: 24 x 4096, 32 heads, seq 2048, GBS 2048, MBS 2)
GPT_5B = TransformerSpec(name="gpt-5b", layers=24, hidden=4096, heads=32, vocab=50304, seq=2048, mlp="gelu",
                         bias=True, norm="layernorm", learned_positions=True, tied_embeddings=True)
EXPOSED_GATHER = "overlap=dp,pp,cp"  # the stack's default minus `param`


def _dp(n: int, overlap: str = "") -> tuple[float, float, float, float]:
    """(step, exposed, after_step, busy) seconds of GPT 5B on n A100 at the launcher's batch, ZeRO-1."""
    text = f"dp={n},zero=1,micro=2,recompute=none" + (f",{overlap}" if overlap else "")
    p = predict(GPT_5B, make_cluster(get_gpu("A100-80GB"), n), parse_layout(text), 2048, FREE)
    assert p.data_parallel is not None
    dpc = p.data_parallel
    return p.step_time_s, dpc.exposed_s, dpc.after_step_s, dpc.busy_s


def test_the_default_overlaps_the_gather_and_prints_as_before() -> None:
    assert "param" in DEFAULT_OVERLAP
    assert "overlap" not in parse_layout("dp=8,zero=1").text()
    assert parse_layout("dp=8,zero=1,overlap=dp,pp,cp").overlap == DEFAULT_OVERLAP - {"param"}
    assert _dp(256)[2] == 0.0


def test_a_gather_after_the_step_is_all_exposed() -> None:
    """Without `param` the whole all-gather (every bucket of it) adds to the step; the reduce-scatter still hides."""
    step, exposed, after, busy = _dp(256, EXPOSED_GATHER)
    step0, exposed0, _, busy0 = _dp(256)
    assert busy == pytest.approx(busy0, rel=1e-12)  # the same traffic, only less of it hidden
    cluster = make_cluster(get_gpu("A100-80GB"), 256)
    link = place_group(cluster, FREE, 1, 256)
    grads = GPT_5B.params() * 2  # bf16 gradients and weights ("mixed")
    k = gradient_buckets(grads, 256, 2)
    assert after == pytest.approx(k * all_gather_s(grads / k, link), rel=0.01)
    assert exposed - after < exposed0  # what stays of the overlapped part: the reduce-scatter's last bucket
    assert step - step0 == pytest.approx(exposed - exposed0, rel=0.05)  # plus the straggler tax on it


def test_at_a_fixed_batch_the_gathers_share_grows_with_the_group() -> None:
    """GPT 5B at the launcher's 2,048 sequences: 32 -> 256 A100 cuts the compute 8x, not the gather."""
    small, large = _dp(32, EXPOSED_GATHER), _dp(256, EXPOSED_GATHER)
    assert large[2] == pytest.approx(small[2], rel=0.5)  # tens of ms either way
    assert large[2] / large[0] > 5 * small[2] / small[0]
    # per GPU, throughput falls faster from 32 to 256 GPUs than with the gather hidden
    hidden = _dp(32)[0] / _dp(256)[0]
    assert small[0] / large[0] < hidden


def test_without_a_sharded_optimizer_nothing_changes() -> None:
    for zero in (0, 3):
        text = f"dp=64,zero={zero},micro=2,recompute=none"
        cluster = make_cluster(get_gpu("A100-80GB"), 64)
        a = predict(GPT_5B, cluster, parse_layout(text), 2048, FREE)
        b = predict(GPT_5B, cluster, parse_layout(f"{text},{EXPOSED_GATHER}"), 2048, FREE)
        assert a.step_time_s == b.step_time_s
        assert b.data_parallel is not None and b.data_parallel.after_step_s == 0.0


def test_the_why_names_the_gather_after_the_step() -> None:
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("version")(lambda: None)
    args = ["plan", "--model", "llama3-70b", "--gpu", "H100-SXM", "--gpus", "256", "--global-batch", "64",
            "--layout", f"tp=8,dp=32,zero=1,micro=2,recompute=none,{EXPOSED_GATHER}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "the parameter all-gather after the step" in res.output
    dp = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)["data_parallel"]
    assert 0 < dp["after_step_s"] <= dp["exposed_s"]
