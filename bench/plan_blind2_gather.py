"""Write the second blind set, bench/plan_blind_runs2.csv, from the figures as the sources print them.

    python -m bench.plan_blind2_gather [OUT.csv]

Gathered for issue 48 by a helper who read none of the planner's model code, its results or its
"still wrong" notes, from sources in no validation table and not in the first blind set
(bench/plan_blind_runs.csv). Every number below was read in the cited paper or pinned file; what a
row derives (tokens/s per GPU from a printed step time, a printed total or a printed TFLOP/s with the
source's own FLOP formula; dp from the GPU count) is computed here, so the arithmetic can be checked.
`assumed` says what the source did not print. Rows in FP8, on cards outside the GPU catalog, with
CPU offload or with hybrid sharding were left out before any prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.plan_blind_gather import csv_text as first_set_csv_text
from bench.plan_blind_gather import finish_row, params_b, write_set

OUT = Path(__file__).resolve().parent / "plan_blind_runs2.csv"
HEADER = (
    "# SECOND BLIND SET (issue 48): published runs gathered by a helper who did not read the planner's model\n"
    "# code, its results or its other validation tables, from sources in none of them nor in the first blind set;\n"
    "# NOT a validation file (kept out of musubi/plan/data/validation/ so that --validate never shows it).\n"
    "# Scored once by bench/plan_blind_score.py --csv bench/plan_blind_runs2.csv from `published_layout` alone.\n"
    "# Compared by tokens/s per GPU, printed or derived (a step time, a total, or TFLOP/s with the source's formula).\n"
    "# arch: llama (SwiGLU, GQA, RMSNorm, untied); gpt (GELU, LayerNorm, biases, learned positions, tied);\n"
    "# nemotron (2-matrix MLP, GQA, LayerNorm, no biases, untied, RoPE; here also Megatron-Core GPT with untied\n"
    "# embeddings, kv_heads = heads).\n")

NEMOTRON15 = "https://arxiv.org/abs/2402.16819"
NEMOTRON340 = "https://arxiv.org/abs/2406.11704"
LLAMA1 = "https://arxiv.org/abs/2302.13971"
NML = "https://github.com/NVIDIA/NeMo-Megatron-Launcher/blob/3579cdb3f2afdeaf23af3e0da6497555566c3f0c/"
MCORE = "https://github.com/NVIDIA/Megatron-LM/blob/f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4/"
AUTOMODEL = "https://github.com/NVIDIA-NeMo/Automodel/blob/e45812012456b0a6fb6b8d02eb9b29e2b5884d5a/"
FA2 = "https://arxiv.org/abs/2307.08691"
FA_REPO = "https://github.com/Dao-AILab/flash-attention/blob/0251105a2fb19d2957484b7f023cd8c115286ced/"
NANOTRON = "https://github.com/huggingface/nanotron/blob/c252843039cc167ff8d6894b87172af4637eb14b/"
H100_BF16_PEAK = 989.0  # TFLOP/s dense BF16, the peak Megatron-LM's MFU column divides by
MEGATRON_DGX_H100 = "DGX H100 (8x H100-SXM 80GB, NVLink, 8x 400 Gb/s InfiniBand per node)"


def megatron_flops_per_seq(seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Megatron-LM's num_floating_point_operations for one sequence (training.py at MCORE; MHA, 4h GELU MLP)."""
    return 12 * seq * layers * hidden * hidden * ((1 + 1 + seq / hidden) + 4 + vocab / (2 * layers * hidden))


def fa2_flops_per_token(params: float, layers: int, hidden: int, seq: int) -> float:
    """FlashAttention-2 paper sec. 4.2: 6 x seqlen x params + 12 x layers x hidden x seqlen^2, per token."""
    return 6 * params + 12 * layers * hidden * seq


def nanotron_flops_per_token(layers: int, hidden: int, ffn: int, vocab: int, seq: int) -> float:
    """nanotron's get_flops (models/llama.py at NANOTRON) per token, MHA: 3 x (qkv, logits, out, SwiGLU, head)."""
    fwd = 2 * layers * hidden * 3 * hidden + 4 * layers * hidden * seq + 2 * layers * hidden * hidden
    fwd += 6 * layers * hidden * ffn + 2 * hidden * vocab
    return 3 * fwd


def blind_rows() -> list[dict[str, object]]:
    """Every row of the second blind set, in the CSV's column names."""
    rows: list[dict[str, object]] = []

    def add(**r: object) -> None:
        rows.append(finish_row(r))

    # Nemotron-4 15B, Table 2: 8-way TP + DP with a distributed optimizer, batch ramp at 4096 tokens a sequence
    for dp, n, sec, mfu, gbs in ((96, 768, 0.57, 34.3, 384), (192, 1536, 0.58, 33.3, 768), (288, 2304, 0.64, 30.5, 1152)):
        add(name=f"nemotron4-15b-tab2-{n}g", regime="tp-dp", source="Parmar2024-Nemotron-4-15B-Table2", url=NEMOTRON15,
            table=f"Table 2 (batch size ramp) row DP {dp}, {n} GPUs, {sec} s/iteration, MFU {mfu} %, batch {gbs}; the 'Pre-training' paragraph (8-way TP, distributed optimizer)",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576, seq=4096,
            vocab=256000, global_batch_seqs=gbs, micro_batch="", tp=8, pp=1, cp=1, dp=dp, vpp="", zero_stage=1,
            recompute="", sequence_parallel="", attention="flash", measured_tflops_per_gpu="",
            measured_fraction_of_peak=round(mfu / 100, 3), measured_tokens_per_s_per_gpu=round(gbs * 4096 / (sec * n), 1),
            flops_convention="mfu", published_layout=f"tp=8,dp={dp},zero=1",
            assumed="tokens/s per GPU = batch x 4096 / iteration time / GPUs (the table's MFU is kept in measured_fraction_of_peak, "
                    "Chowdhery/Korthikanti convention); shape from the report's Table 1 (32 x 6144, 48 heads, 8 KV heads, "
                    "squared-ReLU 4h MLP, 256k vocab, untied, RoPE, no biases); micro-batch, sequence parallelism, recompute and "
                    "attention kernel not printed (flash assumed, Megatron-LM/NeMo on H100); " + MEGATRON_DGX_H100 + " as the 'Pre-training' paragraph says")
    # Nemotron-4 340B, Table 2: TP 8 x PP 12 interleaved + DP with a distributed optimizer
    for dp, n, sec, mfu, gbs in ((16, 1536, 10.3, 42.4, 768), (32, 3072, 10.3, 42.3, 1536), (64, 6144, 8.0, 41.0, 2304)):
        add(name=f"nemotron4-340b-tab2-{n}g", regime="3d", source="NVIDIA2024-Nemotron-4-340B-Table2", url=NEMOTRON340,
            table=f"Table 2 (batch size ramp) row DP {dp}, {n} GPUs, {sec} s/iteration, MFU {mfu} %, batch {gbs}; the training-details text (768 DGX H100 nodes, TP 8, PP 12 with interleaving, distributed optimizer)",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728, seq=4096,
            vocab=256000, global_batch_seqs=gbs, micro_batch="", tp=8, pp=12, cp=1, dp=dp, vpp="", zero_stage=1,
            recompute="", sequence_parallel="", attention="flash", measured_tflops_per_gpu="",
            measured_fraction_of_peak=round(mfu / 100, 3), measured_tokens_per_s_per_gpu=round(gbs * 4096 / (sec * n), 1),
            flops_convention="mfu", published_layout=f"tp=8,pp=12,dp={dp},zero=1",
            assumed="tokens/s per GPU = batch x 4096 / iteration time / GPUs (MFU kept in measured_fraction_of_peak); shape from "
                    "Table 1 (96 x 18432, 96 heads, 8 KV heads, squared-ReLU 4h MLP, 256k vocab, untied); the report says "
                    "'with interleaving' but not the number of virtual stages (left to the planner), nor the micro-batch, "
                    "sequence parallelism, recompute or attention kernel; transcription of Table 2 checked against two "
                    "independent copies of the report's text; " + MEGATRON_DGX_H100)
    # LLaMA 65B: 380 tokens/s/GPU on 2048 A100 80GB (sec. 2.4)
    add(name="llama1-65b-2048g", regime="tp-dp", source="Touvron2023-LLaMA-sec2.4", url=LLAMA1,
        table="sec. 2.4 'Efficient implementation': 65B model, around 380 tokens/sec/GPU on 2048 A100 80GB; Table 2 (shape, 4M-token batch)",
        gpu="A100-80GB", n_gpus=2048, arch="llama", layers=80, hidden=8192, heads=64, kv_heads=64, ffn=22016, seq=2048,
        vocab=32000, global_batch_seqs=2048, micro_batch="", tp=8, pp=1, cp=1, dp=256, vpp="", zero_stage="",
        recompute="selective", sequence_parallel="yes", attention="flash", measured_tflops_per_gpu="",
        measured_fraction_of_peak="", measured_tokens_per_s_per_gpu=380,
        published_layout="tp=8,dp=256",
        assumed="'model and sequence parallelism' is printed, the model-parallel size is not: 8 assumed (the released 65B "
                "checkpoint has 8 model-parallel shards); optimizer sharding not printed; activations checkpointed selectively "
                "(expensive activations saved, manual backward) and xformers memory-efficient attention (flash assumed); "
                "4M-token batch = 2048 sequences of 2048; 'around 380' is a rounded figure; ffn 22016 from the released checkpoint")
    # NeMo-Megatron-Launcher README 7.1.2: GPT 5B and 175B on DGX A100 80GB nodes, tokens/s (all GPUs)
    for nodes, tps in ((1, 40345), (4, 161754), (32, 1159288)):  # of 1, 2, 4, 8, 16, 32 nodes: the ends and one between
        n = nodes * 8
        add(name=f"nemo-launcher-gpt5b-{n}g", regime="dp", source="NVIDIA2022-NeMo-Megatron-Launcher-README",
            url=NML + "README.md", table=f"README 7.1.2 'Training Performance Results' 5B row, {nodes} nodes: {tps} tokens per second",
            gpu="A100-80GB", n_gpus=n, arch="gpt", layers=24, hidden=4096, heads=32, kv_heads="", ffn="", seq=2048,
            vocab=50304, global_batch_seqs=2048, micro_batch=2, tp=1, pp=1, cp=1, dp=n, vpp="", zero_stage=1,
            recompute="", sequence_parallel="no", attention="unfused", measured_tflops_per_gpu="",
            measured_fraction_of_peak="", measured_tokens_per_s_per_gpu=round(tps / n, 1),
            published_layout=f"dp={n},zero=1,micro=2",
            assumed="the README prints tokens/s by node count, not the layout: the layout is the repo's default config at the same "
                    "commit (conf/training/gpt3/5b.yaml: TP 1, PP 1, MBS 2, GBS 2048, seq 2048, bf16, distributed_fused_adam = "
                    "sharded optimizer, 'full'/'block' checkpointing of 0 layers = none, dropout 0.1), assumed to be the measured "
                    "one (its comment 'MBS=2, TPS=2 ... for 80GB nodes' disagrees on TP); GPT-2 BPE vocab 50257 padded to 50304; "
                    "learned positions, tied head (NeMo defaults); fused-softmax attention (no flash in NeMo 22.x); DGX A100 "
                    "SuperPOD (8x A100-SXM 80GB, 8x 200 Gb/s HDR InfiniBand per node)")
    for nodes, tps in ((8, 7500), (32, 29537), (128, 109684)):  # of 8, 16, 32, 64, 128 nodes: the ends and one between
        n = nodes * 8
        add(name=f"nemo-launcher-gpt175b-{n}g", regime="3d", source="NVIDIA2022-NeMo-Megatron-Launcher-README",
            url=NML + "README.md", table=f"README 7.1.2 'Training Performance Results' 175B row, {nodes} nodes: {tps} tokens per second",
            gpu="A100-80GB", n_gpus=n, arch="gpt", layers=96, hidden=12288, heads=96, kv_heads="", ffn="", seq=2048,
            vocab=51200, global_batch_seqs=2048, micro_batch=2, tp=8, pp=8, cp=1, dp=n // 64, vpp="", zero_stage=1,
            recompute="selective", sequence_parallel="yes", attention="unfused", measured_tflops_per_gpu="",
            measured_fraction_of_peak="", measured_tokens_per_s_per_gpu=round(tps / n, 1),
            published_layout=f"tp=8,pp=8,dp={n // 64},zero=1,micro=2,recompute=selective,vpp=1",
            assumed="corrected after the one scoring (session 23): vpp=1 named, the config has no interleaving (no "
                    "virtual_pipeline_model_parallel_size), so the planner must not fill it; "
                    "the README prints tokens/s by node count, not the layout: the layout is the repo's default config at the same "
                    "commit (conf/training/gpt3/175b.yaml: TP 8, PP 8, no interleaving, MBS 2, GBS 2048 fixed at every scale, "
                    "selective recompute, sequence parallel, distributed_fused_adam, bf16, dropout 0.1), assumed to be the "
                    "measured one; vocab 50257 padded to 51200 (128 x TP); learned positions, tied head; fused-softmax "
                    "attention; DGX A100 SuperPOD (8x A100-SXM 80GB, 8x 200 Gb/s HDR InfiniBand per node)")
    # Megatron-Core r0.8.0 README (2024-07): weak-scaling table on H100 (images/model_table.png)
    for size, heads, hidden, layers, tp, pp, dp, n, gbs, tflops in (
            ("1.7b", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8), ("7.1b", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
            ("16b", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1), ("32b", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
            ("70b", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7), ("119b", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
            ("177b", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8), ("314b", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
            ("462b", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9)):
        regime = "dp" if tp == 1 else ("tp-dp" if pp == 1 else "3d")
        add(name=f"mcore080-gpt{size}-{n}g", regime=regime, source="NVIDIA2024-Megatron-Core-r0.8.0-README",
            url=MCORE + "images/model_table.png",
            table=f"README 'Training Speed and Scalability' model table (images/model_table.png) row {size.upper()}: TP {tp}, PP {pp}, DP {dp}, {n} GPUs, batch {gbs}, {tflops} TFLOP/s per GPU",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
            ffn=4 * hidden, seq=4096, vocab=131072, global_batch_seqs=gbs, micro_batch="", tp=tp, pp=pp, cp=1, dp=dp,
            vpp="", zero_stage=1, recompute="", sequence_parallel="", attention="flash", measured_tflops_per_gpu=tflops,
            measured_fraction_of_peak=round(tflops / H100_BF16_PEAK, 3),
            measured_tokens_per_s_per_gpu=round(tflops * 1e12 * 4096 / megatron_flops_per_seq(4096, layers, hidden, 131072), 1),
            flops_convention="mfu", published_layout=f"tp={tp},pp={pp},dp={dp},zero=1",
            assumed="tokens/s per GPU = printed TFLOP/s x 4096 / Megatron-LM's num_floating_point_operations for one sequence "
                    "(megatron/training/training.py at this commit: MHA, 4h MLP, logit term, no recompute term); GPT with 4h "
                    "MLP and untied embeddings (the printed sizes match untied: 177B = 96 x 12h^2 + 2 x 131072 x 12288) "
                    "written as arch nemotron with kv_heads = heads; vocab 131,072 and seq 4096 printed; "
                    "--overlap-param-gather printed, which needs the distributed optimizer (zero=1); micro-batch, interleaving, "
                    "sequence parallelism and recompute not printed; TE attention (flash assumed); the cluster is not named (" + MEGATRON_DGX_H100 + " assumed)")
    # Megatron-Core r0.8.0 README: the 177B strong-scaled from 96 to 4608 GPUs at batch 1152, MFU 47 % -> 42 %
    for n, mfu in ((96, 0.47), (4608, 0.42)):
        tflops = round(mfu * H100_BF16_PEAK, 1)
        add(name=f"mcore080-gpt177b-{n}g", regime="3d", source="NVIDIA2024-Megatron-Core-r0.8.0-README",
            url=MCORE + "README.md",
            table=f"README 'Training Speed and Scalability' text: GPT-3 177B strong-scaled from 96 to 4608 H100 at batch 1152, MFU 47 % to 42 % ({n} GPUs: {round(mfu * 100)} %)",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=96, hidden=12288, heads=96, kv_heads=96, ffn=49152,
            seq=4096, vocab=131072, global_batch_seqs=1152, micro_batch="", tp=8, pp=6, cp=1, dp=n // 48, vpp="",
            zero_stage=1, recompute="", sequence_parallel="", attention="flash", measured_tflops_per_gpu=tflops,
            measured_fraction_of_peak=mfu,
            measured_tokens_per_s_per_gpu=round(tflops * 1e12 * 4096 / megatron_flops_per_seq(4096, 96, 12288, 131072), 1),
            flops_convention="mfu", published_layout=f"tp=8,pp=6,dp={n // 48},zero=1",
            assumed="only the MFU at the two ends is printed (whole per cent, so +-1 % of the figure); TFLOP/s = MFU x 989, then "
                    "tokens/s as the model-table rows; TP 8 x PP 6 taken from the model table's 177B row (2304 GPUs, the same "
                    "batch 1152), the strong-scaling figure labels every point '177B' but does not print the layout; "
                    "as the model table otherwise (untied GPT, zero=1, micro-batch and interleaving not printed); the cluster is not named (" + MEGATRON_DGX_H100 + " assumed)")
    # NeMo Automodel (PyTorch FSDP2 backend), pre-training table, DGX-H100 BF16: Llama 3.1 70B on 64 GPUs
    add(name="automodel-llama31-70b-fsdp2-64g", regime="fsdp", source="NVIDIA2026-NeMo-Automodel-performance-summary",
        url=AUTOMODEL + "docs/performance-summary.md",
        table="'Pre-Training Performance', System: DGX-H100, Precision: BF16, row Llama3 70B: 64 GPUs, GBS 128, MBS 1, GA 4, seq 8192, CP 2, FSDP 32, 18.90 s per step, 866.77 tokens/s/GPU",
        gpu="H100-SXM", n_gpus=64, arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, seq=8192,
        vocab=128256, global_batch_seqs=128, micro_batch=1, tp=1, pp=1, cp=2, dp=32, vpp="", zero_stage=3,
        recompute="full", sequence_parallel="no", attention="flash", measured_tflops_per_gpu=389,
        measured_fraction_of_peak=round(389 / H100_BF16_PEAK, 3), measured_tokens_per_s_per_gpu=866.77,
        flops_convention="mfu", published_layout="cp=2,dp=32,zero=3,micro=1,recompute=full,gather=node", gather="node",
        assumed="corrected after the one scoring (session 23): gather=node named in the layout, the config's fsdp2 (PyTorch "
                "FSDP2: one flat all-gather per block on NCCL's node-aggregated rings), which the gather column already said; the config at this commit (examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml) "
                "says fsdp2, cp 2, activation_checkpointing True (whole blocks: recompute=full), torch.compile, FSDP2 "
                "prefetch, TE kernels, SDPA attention (flash assumed), mock data; Llama 3.1 70B shape; whether FSDP2 "
                "shards over dp x cp (64) or dp (32) is not printed; " + MEGATRON_DGX_H100)
    # FlashAttention-2 paper, Table 1: GPT-3 1.3B / 2.7B on 8x A100 80GB, FlashAttention-2 column
    for size, layers, hidden, heads, seq, tflops, micro, gbs in (
            ("1.3b", 24, 2048, 16, 8192, 220, 4, 128), ("2.7b", 32, 2560, 20, 2048, 205, 4, 512)):  # two of the four
        params = params_b("gpt", layers, hidden, heads, 0, 0, 50264, seq) * 1e9
        ctx = f"{seq // 1024}k"
        add(name=f"fa2-gpt3-{size}-{ctx}-8g", regime="dp", source="Dao2023-FlashAttention-2-Table1", url=FA2,
            table=f"Table 1: GPT3-{size.upper()} {ctx} context, FlashAttention-2 column, {tflops} TFLOPs/s per GPU on 8x A100 80GB",
            gpu="A100-80GB", n_gpus=8, arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads="", ffn="", seq=seq,
            vocab=50264, global_batch_seqs=gbs, micro_batch=micro, tp=1, pp=1, cp=1, dp=8, vpp="", zero_stage=1,
            recompute="none", sequence_parallel="no", attention="flash", measured_tflops_per_gpu=tflops,
            measured_fraction_of_peak=round(tflops / 312, 3),
            measured_tokens_per_s_per_gpu=round(tflops * 1e12 / fa2_flops_per_token(params, layers, hidden, seq), 1),
            flops_convention="mfu", published_layout=f"dp=8,zero=1,micro={micro},recompute=none",
            assumed="tokens/s per GPU = printed TFLOP/s / the paper's FLOPs per token (6 x params + 12 x layers x hidden x "
                    "seqlen, sec. 4.2) with params from the shape (tied GPT, learned positions, vocab 50257 padded to 50264); "
                    "the layout is the repo's training configs (" + FA_REPO + "training/configs/experiment/pile/: gpt3xl-flash, "
                    "gpt3xl-flash-8k, gpt3-2.7B-flash-hdim128 (head dim 128, as the training README says for 2.7B), "
                    "gpt3-2.7B-flash-8k: DDP with ZeRO-1 optimizer sharding, micro-batch for 80 GB, global batch 512 at 2k and "
                    "128 at 8k, no checkpointing, bf16, fused MLP/LayerNorm/dropout kernels), assumed to be the measured ones; "
                    "one DGX A100 node (8x A100-SXM 80GB, NVLink)")
    # nanotron v0.5 benchmarks (README 'Benchmarks', docs/benchmark_summary.svg): best layout per model size and node
    # count on H100, global batch 256 x 4096 tokens at every scale; some of the cells (the ends of each model's range)
    shapes = {"1.34b": (16, 2048, 32, 8192), "3.57b": (28, 3072, 32, 8192), "8.86b": (32, 4096, 32, 14336),
              "80b": (80, 8192, 64, 28672)}
    for size, nodes, dp, tp, pp, gas, mbs, zero, mfu in (
            ("1.34b", 1, 4, 1, 2, 16, 4, 1, 44.32), ("1.34b", 64, 128, 2, 2, 1, 2, 1, 5.25),
            ("3.57b", 1, 4, 1, 2, 32, 2, 1, 46.68), ("3.57b", 64, 128, 4, 1, 1, 2, 1, 10.49),
            ("8.86b", 1, 2, 1, 4, 128, 1, 1, 45.22), ("8.86b", 4, 16, 1, 2, 16, 1, 1, 43.31),
            ("8.86b", 16, 16, 8, 1, 2, 8, 0, 36.33), ("8.86b", 64, 128, 4, 1, 1, 2, 0, 18.69),
            ("80b", 4, 1, 8, 4, 256, 1, 0, 14.76), ("80b", 16, 1, 4, 32, 256, 1, 0, 34.29),
            ("80b", 64, 32, 16, 1, 4, 2, 1, 17.79)):
        layers, hidden, heads, ffn = shapes[size]
        n = nodes * 8
        assert dp * tp * pp == n and dp * gas * mbs == 256, (size, nodes)
        regime = "dp" if tp == 1 and pp == 1 else ("tp-dp" if pp == 1 else ("pp-dp" if tp == 1 else "3d"))
        add(name=f"nanotron05-llama{size}-{n}g", regime=regime, source="HF2025-nanotron-v0.5-benchmarks",
            url=NANOTRON + "docs/benchmark_summary.svg",
            table=f"README 'Benchmarks' figure (docs/benchmark_summary.svg): {size.upper()} at {nodes} nodes, DP {dp} TP {tp} PP {pp} GAS {gas} MBS {mbs} ZeRO-{zero}, MFU {mfu}",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=ffn,
            seq=4096, vocab=131072, global_batch_seqs=256, micro_batch=mbs, tp=tp, pp=pp, cp=1, dp=dp, vpp="",
            zero_stage=zero, recompute="", sequence_parallel="yes" if tp > 1 else "no", attention="flash",
            measured_tflops_per_gpu=round(mfu / 100 * H100_BF16_PEAK, 1), measured_fraction_of_peak=round(mfu / 100, 4),
            measured_tokens_per_s_per_gpu=round(mfu / 100 * H100_BF16_PEAK * 1e12 / nanotron_flops_per_token(layers, hidden, ffn, 131072, 4096), 1),
            flops_convention="mfu",
            published_layout=f"tp={tp},pp={pp},dp={dp},zero={zero},micro={mbs}" + (",vpp=1" if pp > 1 else ""),
            assumed=("corrected after the one scoring (session 23): vpp=1 named where pp > 1, nanotron's only pipeline "
                     "engines are AllForwardAllBackward and OneForwardOneBackward (src/nanotron/parallel/pipeline_parallel/"
                     "engine.py at this commit: no interleaved schedule), so the planner must not fill it; " if pp > 1 else "")
                    + "the figure prints MFU and the layout; tokens/s per GPU = MFU x 989 TFLOP/s (nanotron's H100 peak) / "
                    "nanotron's model FLOPs per token (get_flops in src/nanotron/models/llama.py: 3 x forward, full "
                    "attention, SwiGLU, head); shapes from scripts/scaling_benchmarks.py at this commit (SwiGLU, MHA since "
                    "NUM_KEY_VALUE_HEADS is None, vocab 131,072, seq 4096, tied embeddings below 4B: the printed sizes "
                    "1.34/3.57/8.86/80.0B match), global batch 256 sequences = DP x GAS x MBS in every cell; TP mode "
                    "reduce-scatter (sequence parallel), 1F1B pipeline, flash attention, no recompute named; HF's H100 "
                    "cluster (8x H100-SXM 80GB per node; its network not printed here); the arch 'llama' is untied, the "
                    "1.34B/3.57B are tied (a head's worth of memory)")
    return rows


def csv_text(rows: list[dict[str, object]]) -> str:
    """The CSV file in the first set's layout (plan_blind_gather.csv_text) under this set's header note."""
    return first_set_csv_text(rows, HEADER)


def main(argv: list[str]) -> int:
    """Write the CSV (to OUT.csv, or over bench/plan_blind_runs2.csv) and say how many rows."""
    return write_set(argv, OUT, blind_rows(), HEADER)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
