"""Write the third blind set, bench/plan_blind_runs3.csv, from the figures as the sources print them.

    python -m bench.plan_blind3_gather [OUT.csv]

Gathered for issue 48 on 2026-11-28 by a helper who read none of the planner's model code, its
results or its "still wrong" notes, from sources in no validation table and in neither earlier
blind set (bench/plan_blind_runs.csv, bench/plan_blind_runs2.csv): no repository and no arXiv id
of theirs is used again. Every number below was read in the pinned file cited in the row; what a
row derives (tokens/s per GPU from a printed sequences/s, step time, total tok/s, a token count over
a printed duration, or a printed TFLOP/s through the source's own FLOP formula; dp from the GPU
count) is computed here, so the arithmetic can be checked. `assumed` says what the source did not
print. Rows in FP8, with CPU offload, on cards outside the GPU catalog (A800/H800, V100) or for a
mixture of experts were left out before any prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.plan_blind_gather import csv_text as first_set_csv_text
from bench.plan_blind_gather import finish_row, write_set

OUT = Path(__file__).resolve().parent / "plan_blind_runs3.csv"
HEADER = (
    "# THIRD BLIND SET (issue 48): published runs gathered on 2026-11-28 by a helper who did not read the planner's\n"
    "# model code, its results or its 'still wrong' notes, from sources in no validation table and in neither earlier\n"
    "# blind set; NOT a validation file (kept out of musubi/plan/data/validation/ so that --validate never shows it).\n"
    "# Scored once by bench/plan_blind_score.py --csv bench/plan_blind_runs3.csv from `published_layout` alone.\n"
    "# Compared by tokens/s per GPU, printed or derived (sequences/s, a step time, total tok/s, tokens over a printed\n"
    "# duration, or TFLOP/s through the source's own formula); written by bench/plan_blind3_gather.py.\n"
    "# arch: llama (gated 3-matrix MLP, RoPE, untied); gpt (GELU, LayerNorm, biases, learned positions, tied).\n")

JAXTB = "https://github.com/NVIDIA/JAX-Toolbox/blob/28603900b78b77c1cf1d5fb38cf39c4a5e4d4686/"
PAXML_CONFIGS = ("google/paxml paxml/contrib/gpu/scripts_gpu/configs.py at 724121663ce52dd12040d3f6dcd8272e19261208")
MDS = "https://github.com/microsoft/Megatron-DeepSpeed/blob/4822c87ee6adfa4e480614cbe3f1d8ae00bd3db7/"
MDS_LONGSEQ = "examples_deepspeed/deepspeed4science/megatron_long_seq_support/"
KEMPNER = "https://github.com/KempnerInstitute/KempnerForge/blob/abbbac33f7e484f1ef4b3aa786135322cf744397/"
MLLAMA = "https://github.com/alibaba/Megatron-LLaMA/blob/e3d671a53d75c67c832a251f8a914c89be581d22/"
GLM = "https://github.com/THUDM/GLM-130B/blob/964695129f4f1a388463c9a592ae9f56d8fce929/"
MAXTEXT = "https://github.com/AI-Hypercomputer/maxtext/blob/efb6d9e4a2856198f8272dcbfb7d9c91eda0728e/"
METASEQ = "https://github.com/facebookresearch/metaseq/blob/f7ffa5fd61cf90f498a36d365c13dd7f1a912ff7/"


def mds_hw_flops_per_token(seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Megatron-DeepSpeed's throughput_calculator (megatron/utils.py at MDS) per token, with activation checkpointing.

    96 = 24 x the checkpoint factor 4 (forward, recomputed forward, backward x 2): a hardware-FLOPs count.
    """
    return 96 * layers * hidden * hidden * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def blind_rows() -> list[dict[str, object]]:
    """Every row of the third blind set, in the CSV's column names."""
    rows: list[dict[str, object]] = []

    def add(**r: object) -> None:
        rows.append(finish_row(r, cp=1))

    # --- NVIDIA JAX-Toolbox, Pax GPT on DGX A100 80G / H100 80G (tables "A100 Results", "H100 Results") -----------
    pax_shapes = {  # layers, hidden, heads, vocab (paxml GPT126MBase / GPT5BBase / GPT175BBase)
        "126m": (12, 768, 12, 50304), "5b": (24, 4096, 32, 50304), "175b": (96, 12288, 96, 50257)}
    pax_cells = (  # size, gpu, table, precision, GPUs, DP, FSDP, BS/GPU, sequences/s
        ("126m", "A100-80GB", "A100 Results", "BF16", 64, 64, 1, 4, 2098.16),
        ("5b", "A100-80GB", "A100 Results", "BF16", 256, 1, 256, 8, 594.13),
        ("175b", "A100-80GB", "A100 Results", "TE BF16", 256, 1, 256, 6, 20.44),
        ("126m", "H100-SXM", "H100 Results", "TE BF16", 64, 64, 1, 4, 4709.12),
        ("5b", "H100-SXM", "H100 Results", "TE BF16", 256, 1, 256, 8, 1657.24),
        ("175b", "H100-SXM", "H100 Results", "TE BF16", 256, 1, 256, 6, 51.00))
    for size, gpu, table, prec, n, dp, fsdp, bs, sps in pax_cells:
        layers, hidden, heads, vocab = pax_shapes[size]
        sharded = fsdp > 1
        card = "a100" if gpu.startswith("A100") else "h100"
        tag = "tebf16" if prec.startswith("TE") else "bf16"
        layout = (f"dp={n},zero=3,micro={bs},recompute=full,attention=flash" if sharded
                  else f"dp={n},zero=0,micro={bs},attention=unfused")
        add(name=f"pax-gpt{size}-{card}-{tag}-{n}g", regime="fsdp" if sharded else "dp",
            source="NVIDIA2024-JAX-Toolbox-Pax-README", url=JAXTB + "rosetta/rosetta/projects/pax/README.md",
            table=f"'{table}' row {size.upper()} {prec}: {n} GPUs, DP {dp}, FSDP {fsdp}, TP 1, BS/GPU {bs}, "
                  f"{sps} sequences/s",
            gpu=gpu, n_gpus=n, arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden,
            seq=2048, vocab=vocab, global_batch_seqs=bs * n, micro_batch=bs, tp=1, pp=1, dp=n,
            zero_stage=3 if sharded else 0, recompute="full" if sharded else "",
            sequence_parallel="", attention="flash" if sharded else "unfused",
            measured_tokens_per_s_per_gpu=round(sps * 2048 / n, 1), published_layout=layout,
            gather="node" if sharded else "",
            assumed="tokens/s per GPU = sequences/s x 2048 / GPUs; the README says GLOBAL_BATCH_SIZE = PERCORE_BATCH_SIZE x "
                    "GPUs (no accumulation: micro = BS/GPU) and that 126M ran without flash attention, the other sizes "
                    "with it; shapes, vocab (50,304; 50,257 for 175B), GELU 4h MLP, biases, learned positions, tied "
                    f"softmax and the remat policy from {PAXML_CONFIGS} (5B SAVE_DOT_WITH_NO_BATCH_DIM, 175B the "
                    "TransformerLmSpmdAdam default SAVE_NOTHING: both recompute the layer, named recompute=full; "
                    "126M's non-repeated layers: recompute not named); "
                    + ("'TE BF16' is Transformer Engine's BF16 layers (no FP8); " if tag == "tebf16" else "")
                    + "JAX/XLA FSDP gathers each scanned layer's weights (gather=node); DGX nodes of 8 GPUs, the network "
                    "not printed (DGX reference: 8x 200 Gb/s A100, 8x 400 Gb/s H100)")

    # --- NVIDIA JAX-Toolbox, MaxText Llama 2 7B on 8 H100 (README table) ---------------------------------------------
    add(name="maxtext-llama2-7b-fsdp-8g", regime="fsdp", source="NVIDIA2024-JAX-Toolbox-MaxText-README",
        url=JAXTB + "rosetta/rosetta/projects/maxtext/README.md",
        table="table row 7B, H100 80G SXM, BF16, seq 4096, 8 GPUs, BS/GPU 2, DP 1, FSDP 8, TP 1, GBS 16, Flash, "
              "remat minimal_flash, step 0.721 s, 22.19 sequences/s",
        gpu="H100-SXM", n_gpus=8, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, seq=4096,
        vocab=32000, global_batch_seqs=16, micro_batch=2, tp=1, pp=1, dp=8, zero_stage=3, recompute="",
        sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=round(16 * 4096 / 0.721 / 8, 1),
        published_layout="dp=8,zero=3,micro=2,attention=flash", gather="node",
        assumed="tokens/s per GPU = 16 x 4096 / 0.721 s / 8 (22.19 sequences/s agrees); Llama 2 7B shape (32 x 4096, "
                "MHA, SwiGLU 11,008, vocab 32,000); remat policy 'minimal_flash' saves the matmul outputs and recomputes "
                "the rest (not a named recompute level: left to the planner); one DGX H100 node")

    # --- AI-Hypercomputer MaxText, Llama 2 7B on one A3 VM (8 H100): the only row of its table without hybrid sharding
    llama2_7b_params = 6_738_415_616  # MaxText counts every parameter: 32 x (4 h^2 + 3 h 11008 + 2 h) + 2 x 32000 h + h
    maxtext_flops_per_token = 6 * llama2_7b_params + 6 * 32 * 32 * 128 * 4096  # 6 N + causal attention, as below
    add(name="maxtext-a3-llama2-7b-fsdp-8g", regime="fsdp", source="Google2024-MaxText-A3-Llama2-7B-README",
        url=MAXTEXT + "MaxText/configs/a3/llama_2_7b/README.md",
        table="'Llama2-7B' table, row '1x A3 (h100-80gb-8)': 492 TFLOP/sec/chip",
        gpu="H100-SXM", n_gpus=8, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, seq=4096,
        vocab=32000, global_batch_seqs=32, micro_batch=4, tp=1, pp=1, dp=8, zero_stage=3, recompute="",
        sequence_parallel="", attention="flash", measured_tflops_per_gpu=492,
        measured_tokens_per_s_per_gpu=round(492e12 / maxtext_flops_per_token, 1), flops_convention="mfu",
        published_layout="dp=8,zero=3,micro=4,attention=flash", gather="node",
        assumed="tokens/s per GPU = 492e12 / MaxText's training FLOPs per token (calculate_tflops_training_per_device in "
                "MaxText/maxtext_utils.py at this commit: 6 x all parameters + 12 x heads x layers x head_dim x seq / 2 for "
                "causal attention); run from MaxText/configs/a3/llama_2_7b/1vm.sh at this commit: ici_fsdp_parallelism=8, "
                "dcn_data_parallelism=1, per_device_batch_size=4, max_target_length=4096, attention=cudnn_flash_te, "
                "remat_policy=minimal_flash (saves the matmul outputs: not a named recompute level), synthetic data; the "
                "2-16 VM rows of the same table were left out: they shard within a VM and replicate across VMs "
                "(dcn_data_parallelism=N, ici_fsdp_parallelism=8: hybrid sharding, which --layout cannot name)")

    # --- Megatron-DeepSpeed long-sequence support: GPT-30B, TP 32 on 4 DGX A100-40GB nodes ---------------------------
    for k in (2, 8, 32, 128):
        seq = 1024 * k
        tflops = {2: 68, 8: 86, 32: 100, 128: 119}[k]
        vocab = 53248  # GPT-2's 50,257 padded to a multiple of 128 x TP 32 (Megatron's make-vocab-size-divisible-by)
        add(name=f"mds-longseq-gpt30b-tp32-{k}k-32g", regime="tp", source="Microsoft2023-Megatron-DeepSpeed-long-seq-README",
            url=MDS + MDS_LONGSEQ + "README.md",
            table=f"'Performance Comparison between Old Megatron-DeepSpeed and New Megatron-DeepSpeed' row {k}k: "
                  f"New Megatron-DeepSpeed {tflops} TFLOPS (TP size=32), 4 DGX A100-40GB nodes, 8 HDR InfiniBand each",
            gpu="A100-40GB", n_gpus=32, arch="gpt", layers=64, hidden=6144, heads=64, kv_heads=64, ffn=4 * 6144,
            seq=seq, vocab=vocab, global_batch_seqs=2, micro_batch=1, tp=32, pp=1, dp=1, zero_stage=0,
            recompute="full", sequence_parallel="yes", attention="flash", measured_tflops_per_gpu=tflops,
            measured_tokens_per_s_per_gpu=round(tflops * 1e12 / mds_hw_flops_per_token(seq, 64, 6144, vocab), 1),
            flops_convention="hfu", published_layout="tp=32,dp=1,zero=0,micro=1,sp=yes,recompute=full",
            memory_precision="mixed",
            assumed="tokens/s per GPU = printed TFLOPS / the repo's throughput_calculator FLOPs per token "
                    "(megatron/utils.py at this commit: 96 x L x h^2 x (1 + s/6h + V/16Lh), the factor 4 for "
                    "--checkpoint-activations: hardware FLOPs); model, batch and knobs from "
                    f"{MDS_LONGSEQ}pretrain_gpt_30B_seq_parallel.sh at this commit (GPT-3 30B: 64 x 6144, 64 heads; global "
                    "batch 2, micro 1, mp_size 32, pp 1, ZeRO 0, sequence parallel, activation checkpointing, "
                    "--use-flash-attn-triton, fp16); the seq-length per row is the table's (the script's default is 2k); "
                    "vocab = GPT-2's padded to 128 x TP; 8 GPUs a node, so TP 32 spans 4 nodes over 8x 200 Gb/s HDR")

    # --- KempnerForge MFU benchmark: Llama-3 7B/13B/70B on 1-32 H200 (nodes of 4 H200) -------------------------------
    kempner = (  # row, model, GPUs, tp, fsdp, tok/s total, step s
        (1, "7b", 1, 1, 1, 10471, 3.13), (2, "7b", 2, 1, 2, 18728, 3.50), (4, "7b", 4, 1, 4, 38983, 3.36),
        (5, "7b", 4, 4, 1, 25135, 1.30), (7, "7b", 8, 4, 2, 44299, 1.48), (10, "7b", 16, 4, 4, 82988, 1.58),
        (12, "7b", 32, 4, 8, 155917, 1.68), (8, "13b", 8, 1, 8, 35405, 14.81), (9, "13b", 8, 4, 2, 27345, 4.79),
        (11, "13b", 16, 4, 4, 53814, 4.87), (13, "13b", 32, 4, 8, 104309, 5.03), (14, "70b", 32, 4, 8, 17657, 14.85))
    kshape = {  # layers, hidden, heads, kv, ffn, micro, accumulation (the report's 'Batch Configuration')
        "7b": (32, 4096, 32, 8, 14336, 4, 2), "13b": (40, 5120, 40, 8, 17920, 4, 4), "70b": (80, 8192, 64, 8, 28672, 2, 4)}
    for row, model, n, tp, fsdp, toks, step in kempner:
        layers, hidden, heads, kv, ffn, micro, accum = kshape[model]
        family = "fsdp" if tp == 1 else (f"tp{tp}" if fsdp == 1 else f"tp{tp}-fsdp")
        layout = f"tp={tp},dp={fsdp}," if tp > 1 else f"dp={fsdp},"
        layout += ("zero=3," if fsdp > 1 else "zero=0,") + f"micro={micro},recompute=full"
        add(name=f"kempner-llama3-{model}-{family}-{n}g", regime="tp-fsdp" if tp > 1 and fsdp > 1 else ("tp" if tp > 1 else "fsdp"),
            source="Kempner2026-KempnerForge-MFU-benchmark", url=KEMPNER + "benchmarks/mfu_scaling/mfu_scaling.md",
            table=f"'Full Results Table' row {row}: {n} GPUs, {model.upper()}, "
                  + (f"TP={tp}+FSDP={fsdp}" if tp > 1 and fsdp > 1 else f"TP={tp}" if tp > 1 else f"FSDP={fsdp}" if n > 1 else "single GPU")
                  + f", {toks:,} tok/s, step {step} s",
            gpu="H200", n_gpus=n, arch="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq=4096,
            vocab=128256, global_batch_seqs=micro * accum * fsdp, micro_batch=micro, tp=tp, pp=1, dp=fsdp,
            zero_stage=3 if fsdp > 1 else 0, recompute="full", sequence_parallel="", attention="",
            measured_tokens_per_s_per_gpu=round(toks / n, 1), published_layout=layout,
            gather="node" if fsdp > 1 else "",
            assumed="tokens/s per GPU = the table's tok/s (all GPUs: tokens per step / step time) / GPUs; global batch = "
                    "micro x accumulation x FSDP degree from 'Batch Configuration' (tokens/step/GPU counts one data-parallel "
                    "rank); shapes from 'Models' with ffn_dim_multiplier 1.3 rounded up to 256 as kempnerforge/config/model.py "
                    "does (7B 14,336, 13B 17,920; 70B 28,672 printed), vocab 128,256 and seq 4096 from the report's commands; "
                    "bf16, full activation checkpointing, torch.compile (not for row 8), FSDP2 per block (gather=node); "
                    "attention kernel not printed; NODES OF 4 H200 (8 nodes x 4 on NVLink, InfiniBand between; NIC rate "
                    "not printed), so every run above 4 GPUs crosses nodes: the scorer predicts with the catalog's node")

    # --- alibaba Megatron-LLaMA: LLaMA-13B on 32-512 A100 80GB at a fixed global batch -------------------------------
    mll_common = dict(gpu="A100-80GB", arch="llama", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, seq=2048,
                      vocab=32000, global_batch_seqs=2048, pp=1, zero_stage=1, recompute="selective",
                      sequence_parallel="yes", attention="flash")
    mll_assumed = ("LLaMA-13B: README_zh.md at this commit names it for the scaling table ('复现LLaMA-13B的训练', 8x A100-80G "
                   "nodes, 4x 200 Gb/s RDMA between nodes, a 4M-token batch = 2048 x 2048) and the English README's 32-GPU "
                   "comparison is 13B at global batch 2048; the tables print no TP/PP: TP 2, PP 1, micro 2, sequence "
                   "parallel, selective recompute and flash attention from examples/LLaMA/LLaMA_13_standalone.sh at this "
                   "commit (TP 2 put in published_layout so that dp is defined; the rest left to the planner); shape 40 x 5120, "
                   "40 heads, SwiGLU 13,824, vocab 32,000; network 4x 200 Gb/s per 8-GPU node (half a DGX A100's)")
    for n, tps, days in ((256, 1890, 23.9), (512, 1845, 12.2)):
        add(name=f"megatron-llama-13b-odo-{n}g", regime="tp-dp", source="Alibaba2023-Megatron-LLaMA-README", url=MLLAMA + "README.md",
            table=f"'Excellent Scalability' table, row 'Megatron-LLaMA with OverlappedDistributedOptimizer', {n}xA100 80GB: "
                  f"{tps} tokens/s per GPU ({days} days)",
            n_gpus=n, micro_batch="", tp=2, dp=n // 2, measured_tokens_per_s_per_gpu=tps,
            published_layout=f"tp=2,dp={n // 2},zero=1", **mll_common,
            assumed="printed tokens/s per GPU; the OverlappedDistributedOptimizer overlaps the gradient reduce-scatter and "
                    "parameter all-gather with compute (ZeRO-1-like sharding, not ZeRO-2's per-bucket reduce); " + mll_assumed)
    for n, tps, days in ((256, 1630, 27.8), (512, 1430, 15.8)):
        add(name=f"megatron-llama-13b-do-{n}g", regime="tp-dp", source="Alibaba2023-Megatron-LLaMA-README", url=MLLAMA + "README.md",
            table=f"'Excellent Scalability' table, row 'Megatron-LLaMA with DistributedOptimizer', {n}xA100 80GB: "
                  f"{tps} tokens/s per GPU ({days} days)",
            n_gpus=n, micro_batch="", tp=2, dp=n // 2, measured_tokens_per_s_per_gpu=tps,
            published_layout=f"tp=2,dp={n // 2},zero=1", **mll_common,
            assumed="printed tokens/s per GPU; Megatron-LM's DistributedOptimizer of 2023, which the README says does not "
                    "fully overlap its reduce-scatter/all-gather with compute (over 50 % of the step without accumulation): "
                    "overlap not named, left to the planner; " + mll_assumed)
    add(name="megatron-llama-13b-odo-32g", regime="tp-dp", source="Alibaba2023-Megatron-LLaMA-README", url=MLLAMA + "README.md",
        table="'Efficiency and Affordability' table, column Megatron-LLaMA: 10 billion tokens in 40.3 hours on four "
              "8xA100-80GB, 180 model TFLOPS, global batch 2048",
        n_gpus=32, micro_batch="", tp=2, dp=16, measured_tokens_per_s_per_gpu=round(10e9 / (40.3 * 3600) / 32, 1),
        published_layout="tp=2,dp=16,zero=1", **mll_common,
        assumed="tokens/s per GPU = 10e9 tokens / 40.3 h / 32 GPUs (the README's cost basis; 6 x 13e9 x that is 168 "
                "TFLOP/s before attention, in line with the printed 180 model TFLOPS, and the printed 0.85 scaling ratio "
                "32 -> 512 GPUs gives 1845/0.85 = 2171); the example script names --overlapped-distributed-optimizer; "
                + mll_assumed)
    add(name="deepspeed-hf-llama-13b-zero2-32g", regime="dp", source="Alibaba2023-Megatron-LLaMA-README", url=MLLAMA + "README.md",
        table="'Efficiency and Affordability' table, column DeepSpeed (HF): 10 billion tokens in 49.7 hours on four "
              "8xA100-80GB, 146 model TFLOPS, global batch 2048, FlashAttention enabled",
        gpu="A100-80GB", n_gpus=32, arch="llama", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, seq=2048,
        vocab=32000, global_batch_seqs=2048, micro_batch="", tp=1, pp=1, dp=32, zero_stage=2, recompute="",
        sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=round(10e9 / (49.7 * 3600) / 32, 1),
        published_layout="dp=32,zero=2,attention=flash",
        assumed="tokens/s per GPU = 10e9 tokens / 49.7 h / 32 GPUs; README_zh.md names the baseline 'DeepSpeed ZeRO2' with "
                "HuggingFace LLaMA and FlashAttention; micro-batch and recompute not printed; LLaMA-13B shape; 8x A100-80GB "
                "nodes with 4x 200 Gb/s RDMA (the zh README's cluster)")

    # --- THUDM GLM-130B training notes: 96 DGX-A100 (40G) nodes, MP 4 x PP 8 --------------------------------------
    for bsz, sec in ((4224, 88.5), (6144, 122.5)):
        add(name=f"glm-130b-bsz{bsz}-768g", regime="3d", source="THUDM2022-GLM-130B-training-notes", url=GLM + "logs/main-log-en.md",
            table=f"'Speed Testing (with Different Batch Sizes)': 96 nodes, BSZ={bsz // 24} * 24={bsz}, "
                  f"{sec}s/iter ({'134TFLOPS, 48samples/s' if bsz == 4224 else '141TFLOPS, 50samples/s'}); "
                  "'Basic Information': 70 layers, 12288 hidden, 32768 ffn hidden, MP = 4, PP = 8",
            gpu="A100-40GB", n_gpus=768, arch="llama", layers=70, hidden=12288, heads=96, kv_heads=96, ffn=32768, seq=2048,
            vocab=150528, global_batch_seqs=bsz, micro_batch="", tp=4, pp=8, dp=24, zero_stage="", recompute="",
            sequence_parallel="", attention="", measured_tokens_per_s_per_gpu=round(bsz * 2048 / sec / 768, 1),
            published_layout="tp=4,pp=8,dp=24",
            assumed="tokens/s per GPU = BSZ x 2048 / s per iteration / 768 GPUs (the printed samples/s agree within "
                    "rounding); DGX-A100 40G nodes (README_zh: 96 DGX-A100 (40G) nodes; 8 GPUs each), sequence 2048 and "
                    "96 heads from configs/model_glm_130b.sh at this commit (vocab 150,528 there; the notes say 150000); "
                    "GLM: GeGLU (three matrices, as the 'llama' arch), DeepNorm post-LayerNorm, RoPE, biases, FP16; the "
                    "printed TFLOPS are the framework's own count (convention not printed, not used); micro-batch, "
                    "optimizer sharding, recompute, interleaving and attention kernel not printed (left to the planner)")

    # --- OPT-175B (metaseq chronicles): FSDP + Megatron TP 8 on 1024 A100 80GB --------------------------------------
    add(name="opt-175b-tp8-fsdp-1024g", regime="tp-fsdp", source="Meta2022-metaseq-OPT-175B-chronicles",
        url=METASEQ + "projects/OPT/chronicles/final_update.md",
        table="final_update.md: 'completed its training run on 300B tokens. This required ~4.30E+23 FLOPs of compute, or "
              "roughly ~33 days of continuous training on 1024 80GB A100s (assuming no hardware issues ...)'; "
              "10_percent_update.md: 'Batch-size of 2M', '8x Tensor Parallelism', 'we need 33 days to fully train at this "
              "scale with 1024 80GB A100s'",
        gpu="A100-80GB", n_gpus=1024, arch="gpt", layers=96, hidden=12288, heads=96, kv_heads=96, ffn=4 * 12288, seq=2048,
        vocab=50272, global_batch_seqs=1024, micro_batch="", tp=8, pp=1, dp=128, zero_stage=3, recompute="full",
        sequence_parallel="", attention="", measured_tokens_per_s_per_gpu=round(300e9 / (33 * 86400) / 1024, 1),
        published_layout="tp=8,dp=128,zero=3", gather="nic",
        assumed="tokens/s per GPU = 300e9 tokens / 33 days / 1024 GPUs: the team's continuous-training time, excluding "
                "restarts (4.30e23 FLOPs / 33 days / 1024 = 147 TFLOP/s, the utilisation the OPT paper prints; 4.30e23 / "
                "300e9 tokens = 8.2 x 175e9 FLOPs a token, i.e. a recomputed forward: full activation checkpointing, "
                "named in the row, left out of published_layout); docs/history.md at this commit: metaseq merged "
                "fairscale FSDP with Megatron's tensor parallelism (zero=3 over the data-parallel 128; fairscale FSDP "
                "flattens each wrapped layer, per-parameter gathers assumed as DeepSpeed-like: gather=nic, a guess); "
                "shape, batch and TP from metaseq/launcher/opt_job_constants.py at this commit ('175b': 96 layers, 12288, "
                "96 heads, 4h MLP, batch int(2.0 * M) = 2^21 tokens = 1024 x 2048, model_parallel 8); vocab 50,272 (GPT-2 "
                "BPE padded; metaseq/cli/interactive_ft.py default); ReLU MLP, learned positions, tied; FP16 weights, "
                "FP32 Adam; "
                "micro-batch and network not printed (an Azure A100 cluster)")
    return rows


def csv_text(rows: list[dict[str, object]]) -> str:
    """The CSV file in the first set's layout (plan_blind_gather.csv_text) under this set's header note."""
    return first_set_csv_text(rows, HEADER)


def main(argv: list[str]) -> int:
    """Write the CSV (to OUT.csv, or over bench/plan_blind_runs3.csv) and say how many rows."""
    return write_set(argv, OUT, blind_rows(), HEADER)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
