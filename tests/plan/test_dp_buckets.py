"""The gradient bucket that no overlap hides: the data-parallel term that grows with scale at a fixed batch.

Bucketed gradient collectives (Megatron-Core's DDP and distributed optimizer, PyTorch DDP) start each bucket's
reduce as soon as the backward has produced it, so all but one hide under the backward. The bucket holding the
first layers is ready only when the backward ends: its reduce (and, with a sharded optimizer, the all-gather
of its updated weights before the next forward) runs alone. Megatron-Core sizes that bucket with the group:
`DistributedDataParallelConfig.bucket_size` (megatron/core/distributed/distributed_data_parallel_config.py):
"If unspecified, MCore uses a default value of max(40000000, 1000000 * dp_size) parameters (larger DP sizes
need larger buckets to ensure collectives do not become latency-bound)". PyTorch DDP's `bucket_cap_mb`
defaults to 25 (MiB). At a fixed global batch a larger group means a larger last bucket and less compute.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from musubi.plan import get_gpu, make_cluster, predict
from musubi.plan.comm import (
    PROTOCOLS,
    all_gather_s,
    all_reduce_s,
    place_group,
    reduce_scatter_s,
    ring_latency_s,
)
from musubi.plan.efficiency import DEFAULT_EFFICIENCY
from musubi.plan.layout import parse_layout
from musubi.plan.predict import (
    DDP_BUCKET_BYTES,
    dp_bucket_params,
    gradient_buckets,
    megatron_bucket_bytes,
    torch_ddp_bucket_bytes,
)
from musubi.plan.spec import TransformerSpec, preset

FREE = replace(DEFAULT_EFFICIENCY, contention=0.0)  # no contention: the tail alone is what stays exposed
# Nemotron-4 15B's shape (arXiv 2402.16819 sec. 2): 32 layers, hidden 6144, 48 heads, 8 KV heads, squared ReLU
NEMOTRON_15B = TransformerSpec(name="nemotron-15b", layers=32, hidden=6144, heads=48, kv_heads=8, ffn_hidden=24576,
                               mlp="gelu", vocab=256000, seq=4096, norm="layernorm")


def test_bucket_size_is_megatron_cores_default() -> None:
    assert dp_bucket_params(8) == 40_000_000
    assert dp_bucket_params(40) == 40_000_000
    assert dp_bucket_params(96) == 96_000_000
    assert dp_bucket_params(288) == 288_000_000
    assert megatron_bucket_bytes(288, 2) == 576_000_000
    assert torch_ddp_bucket_bytes(4096, 2) == DDP_BUCKET_BYTES == 25 * 2**20


def test_the_last_bucket_of_a_sharded_optimizer_stays_exposed() -> None:
    """ZeRO-1 at one micro-batch: reduce-scatter and all-gather fit under the compute, except the last bucket's."""
    cluster = make_cluster(get_gpu("H100-SXM"), 8 * 96)
    p = predict(NEMOTRON_15B, cluster, parse_layout("tp=8,dp=96,zero=1,micro=4"), 384, FREE)
    assert p.data_parallel is not None
    link = place_group(cluster, FREE, 8, 96)  # the data-parallel group: one GPU per node (stride tp = 8)
    grads = p.data_parallel.bytes_per_gpu / (2 * 95 / 96)  # reduce-scatter + all-gather send 2 (n-1)/n of it
    buckets = gradient_buckets(grads, 96, 2)
    assert buckets == pytest.approx(grads / megatron_bucket_bytes(96, 2), abs=1)  # ~2e9 params / 96M a bucket
    bucket = grads / buckets
    tail = reduce_scatter_s(bucket, link) + all_gather_s(bucket, link)
    assert p.data_parallel.busy_s > 3 * tail  # most of the traffic hides
    assert p.data_parallel.exposed_s == pytest.approx(tail, rel=1e-9)


def test_at_a_fixed_batch_per_replica_the_exposed_share_grows_with_the_group() -> None:
    """Nemotron-4 15B as its report ran it (Table 2: TP 8, 384 -> 1,152 sequences on 768 -> 2,304 H100): the
    busy traffic per GPU barely moves, the exposed tail grows with the bucket (cap 96M -> 288M parameters)."""
    steps = {}
    for dp, batch in ((96, 384), (288, 1152)):
        cluster = make_cluster(get_gpu("H100-SXM"), 8 * dp)
        steps[dp] = predict(NEMOTRON_15B, cluster, parse_layout(f"tp=8,dp={dp},zero=1,micro=4"), batch)
    small, large = steps[96].data_parallel, steps[288].data_parallel
    assert small is not None and large is not None
    assert large.busy_s == pytest.approx(small.busy_s, rel=0.05)
    assert large.tail_s > 2.5 * small.tail_s  # 21 buckets of ~93M parameters -> 7 of ~280M
    assert large.exposed_s > 1.3 * small.exposed_s
    assert steps[288].tokens_per_s / 2304 < 0.97 * steps[96].tokens_per_s / 768


def test_a_model_inside_one_bucket_hides_none_of_its_reduce() -> None:
    """A ~29M-parameter model on 16 A100 (2 nodes): its whole gradient is one bucket, ready when the backward ends."""
    small = TransformerSpec(name="tiny", layers=4, hidden=512, heads=8, vocab=16000, seq=1024, mlp="gelu")
    assert small.params() < dp_bucket_params(16)
    cluster = make_cluster(get_gpu("A100-80GB"), 16)
    p = predict(small, cluster, parse_layout("dp=16,zero=0,micro=4"), 64, FREE)
    assert p.data_parallel is not None and p.data_parallel.busy_s > 0
    assert p.data_parallel.exposed_s == pytest.approx(p.data_parallel.busy_s, rel=1e-9)


def test_without_overlap_nothing_changes() -> None:
    cluster = make_cluster(get_gpu("H100-SXM"), 8 * 96)
    p = predict(NEMOTRON_15B, cluster, parse_layout("tp=8,dp=96,zero=1,micro=4,overlap=none"), 384, FREE)
    assert p.data_parallel is not None
    assert p.data_parallel.exposed_s == pytest.approx(p.data_parallel.busy_s, rel=1e-9)


def test_musubis_own_ddp_runs_use_torch_ddps_bucket() -> None:
    """A generic (non-transformer) spec is trained by Musubi's DDP workers: the tail is one 25-MiB all-reduce."""
    spec = preset("resnet50")
    cluster = make_cluster(get_gpu("A100-80GB"), 16)
    p = predict(spec, cluster, parse_layout("dp=16,zero=0,micro=64"), 1024, FREE)
    assert p.data_parallel is not None
    link = place_group(cluster, FREE, 1, 16)
    grads = p.data_parallel.bytes_per_gpu / (2 * 15 / 16)
    buckets = gradient_buckets(grads, 16, 2, torch_ddp_bucket_bytes)
    assert buckets == -(-grads // DDP_BUCKET_BYTES)  # ResNet-50's 51 MB of bf16 gradients: 2 buckets
    assert p.data_parallel.exposed_s == pytest.approx(all_reduce_s(grads / buckets, link), rel=1e-9)


def test_every_bucket_pays_the_collectives_latency() -> None:
    """NCCL prices each collective as latency + bytes / bandwidth (src/graph/tuning.cc; comm.py): k buckets of
    S / k bytes cost k - 1 latencies more than one collective of S. Llama 3 70B, TP 8, 8 replicas on 8 nodes:
    8.8B parameters a GPU in 40M-parameter buckets, 220 reduce-scatters and 220 all-gathers a step."""
    cluster = make_cluster(get_gpu("H100-SXM"), 64)
    p = predict(preset("llama3-70b"), cluster, parse_layout("tp=8,dp=8,zero=1,micro=1,overlap=none"), 64, FREE)
    assert p.data_parallel is not None
    link = place_group(cluster, FREE, 8, 8)
    grads = p.data_parallel.bytes_per_gpu / (2 * 7 / 8)
    k = gradient_buckets(grads, 8, 2)
    assert 200 < k < 240
    one = reduce_scatter_s(grads, link) + all_gather_s(grads, link)
    assert p.data_parallel.busy_s == pytest.approx(k * (reduce_scatter_s(grads / k, link)
                                                        + all_gather_s(grads / k, link)), rel=1e-9)
    # 80 MB buckets and the whole gradient both take NCCL's Simple protocol: k - 1 of its ring latencies more
    simple = ring_latency_s(PROTOCOLS[-1], False, link)
    assert p.data_parallel.busy_s == pytest.approx(one + 2 * (k - 1) * simple, rel=1e-3)

