"""Write the blind set, bench/plan_blind_runs.csv, from the figures as the sources print them.

    python bench/plan_blind_gather.py [OUT.csv]

Every number below was read in the cited file or paper (the URL and table of each row); what a
row derives (tokens/s per GPU from a printed total or a printed step time, dp from the GPU count)
is computed here, so the arithmetic can be checked. `assumed` says what the source did not print.
Rows that need a FLOP convention the source does not state, a precision other than BF16, or a
layout `--layout` cannot express (hybrid sharding) were left out before any prediction.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "plan_blind_runs.csv"
COLS = ("name,regime,source,url,table,gpu,n_gpus,params_b,arch,layers,hidden,heads,kv_heads,ffn,seq,vocab,"
        "global_batch_seqs,micro_batch,tp,pp,cp,dp,vpp,zero_stage,recompute,sequence_parallel,attention,overlap,"
        "memory_precision,measured_tflops_per_gpu,measured_fraction_of_peak,measured_tokens_per_s_per_gpu,"
        "flops_convention,published_layout,known_off,assumed,gather").split(",")
HEADER = (
    "# BLIND SET (issue 48): published runs gathered by a helper who did not read the planner's model code,\n"
    "# its results or its other validation tables; NOT a validation file (kept out of musubi/plan/data/validation/\n"
    "# so that --validate never shows it). Scored once by bench/plan_blind_score.py from `published_layout` alone.\n"
    "# Compared by tokens/s per GPU, printed or derived from a printed step time (no FLOP convention).\n"
    "# arch: llama (SwiGLU, GQA, RMSNorm, untied); gpt (GELU, LayerNorm, biases, learned positions, tied);\n"
    "# nemotron (squared-ReLU 2-matrix MLP, GQA, LayerNorm, no biases, untied, RoPE); bloom (GELU, LayerNorm,\n"
    "# biases, ALiBi, tied).\n")
DGXC = "https://github.com/NVIDIA/dgxc-benchmarking/blob/143b90dd91f9be958fed4773ae95d941a3356a82/"
TT = "https://github.com/pytorch/torchtitan/blob/820504e20d1149fbf0b98c567af24c4b0433b22d/benchmarks/llama3_h100_202412_torchtitan.md"
BS = "https://github.com/bigscience-workshop/bigscience/blob/9e64edec2ad1fb9263bf39ba616a84ff64b4d947/train/tr11-176B-ml/"
NEMO_A = ("NeMo 24.09 container (Megatron-Core) as the README says; recompute not printed (assumed none); "
          "sequence parallel not printed (assumed on with tp>1, NeMo's recipe default); TE fused attention = flash; "
          "DGX H100 (8x H100-SXM 80GB, NVLink, 8x 400 Gb/s IB per node); compared by tokens/s per GPU = the printed "
          "'Throughput in tokens per second' / GPUs (the printed MFU uses NVIDIA's own FLOP count)")


def params_b(arch: str, layers: int, h: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> float:
    """Parameters in billions from the shape (weights, biases, norms, embeddings as the arch has them)."""
    kv = kv or heads
    attn = 2 * h * h + 2 * h * kv * (h // heads)
    ffn = ffn or 4 * h
    mlp = (3 if arch == "llama" else 2) * h * ffn
    bias = (4 * h + ffn + 2 * h) if arch in ("gpt", "bloom") else 0
    emb = vocab * h * (1 if arch in ("gpt", "bloom") else 2)  # tied head counts once
    pos = seq * h if arch == "gpt" else 0
    return round((layers * (attn + mlp + bias + 4 * h) + emb + pos) / 1e9, 2)


def finish_row(r: dict[str, object], **defaults: object) -> dict[str, object]:
    """A gathered row as every set writes it: mixed-precision memory unless it says otherwise, `defaults` (a set's own,
    e.g. cp=1) where it says nothing, and its parameter count from its shape (params_b). Columns left out are written
    empty (csv_text)."""
    r.setdefault("memory_precision", "mixed")
    for key, value in defaults.items():
        r.setdefault(key, value)

    def num(key: str) -> int:
        return int(str(r.get(key) or 0))
    r["params_b"] = params_b(str(r["arch"]), num("layers"), num("hidden"), num("heads"), num("kv_heads"),
                             num("ffn"), num("vocab"), num("seq"))
    return r


def blind_rows() -> list[dict[str, object]]:
    """Every blind row, in the CSV's column names."""
    rows: list[dict[str, object]] = []

    def add(**r: object) -> None:
        rows.append(finish_row(r))

    # Llama 3.1 70B BF16, TP4 PP4 CP2 VP5 MBS1 GA64
    for n, tps, gbs in ((64, 71235, 128), (512, 563372, 1024), (2048, 2248957, 4096)):
        dp = n // 32
        add(name=f"dgxc-llama31-70b-bf16-{n}g", regime="3d-cp", source="NVIDIA2025-dgxc-benchmarking-llama3.1",
            url=DGXC + "llama3.1/README_70b.md", table=f"'Llama 3.1 70b 24.09 BF16 (TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64)' column {n}x H100",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, seq=8192,
            vocab=128256, global_batch_seqs=gbs, micro_batch=1, tp=4, pp=4, cp=2, dp=dp, vpp=5, zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=4,pp=4,cp=2,dp={dp},vpp=5,micro=1", known_off="",
            assumed="seq 8192 (GBS x 8192 / step time = the printed tokens/s); dp = GPUs/32; zero 0 "
                    "(distributed optimizer not printed); " + NEMO_A, gather="")
    # Llama 3.1 8B BF16, TP1 PP1 CP2 MBS1 GA32
    for n, tps, gbs in ((8, 81222, 128), (128, 1280704, 2048)):
        dp = n // 2
        add(name=f"dgxc-llama31-8b-bf16-{n}g", regime="cp-dp", source="NVIDIA2025-dgxc-benchmarking-llama3.1",
            url=DGXC + "llama3.1/README_8b.md", table=f"'Llama 3.1 8b 24.09 BF16 (TP=1, PP=1, CP=2, MBS=1, GA=32)' column {n}x H100",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192,
            vocab=128256, global_batch_seqs=gbs, micro_batch=1, tp=1, pp=1, cp=2, dp=dp, vpp="", zero_stage=0,
            recompute="none", sequence_parallel="no", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=1,pp=1,cp=2,dp={dp},micro=1", known_off="",
            assumed="seq 8192 (GBS x 8192 / step time = the printed tokens/s); dp = GPUs/2; zero 0 (distributed optimizer not printed); " + NEMO_A, gather="")
    # Llama 3.1 405B BF16, TP8 PP9 CP2 VP7 MBS1 GA63, full model scales only
    for n, tps, gbs in ((576, 120022, 252), (1152, 235660, 504), (2304, 468646, 1008)):
        dp = n // 144
        add(name=f"dgxc-llama31-405b-bf16-{n}g", regime="3d-cp", source="NVIDIA2025-dgxc-benchmarking-llama3.1",
            url=DGXC + "llama3.1/README_405b.md", table=f"'Llama 3.1 405b 24.09 BF16 (TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63)' column {n}x H100 (126 layers)",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, seq=8192,
            vocab=128256, global_batch_seqs=gbs, micro_batch=1, tp=8, pp=9, cp=2, dp=dp, vpp=7, zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=8,pp=9,cp=2,dp={dp},vpp=7,micro=1", known_off="",
            assumed="seq 8192; dp = GPUs/144; the proxy scales (<576 GPUs, cut layers) left out; zero 0 (distributed optimizer not printed); " + NEMO_A, gather="")
    # GPT-3 175B BF16 NeMo Megatron 24.11, TP4 PP8 VP12 MBS1 seq 2048
    for n, tps, gbs in ((128, 58843, 256), (512, 230710, 1024), (2048, 930001, 4096)):
        dp = n // 32
        add(name=f"dgxc-gpt3-175b-bf16-{n}g", regime="3d", source="NVIDIA2025-dgxc-benchmarking-nemo-megatron",
            url=DGXC + "nemo_megatron/README_175b.md", table=f"'NeMo Megatron 24.11 BF16 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)' column {n}x H100",
            gpu="H100-SXM", n_gpus=n, arch="gpt", layers=96, hidden=12288, heads=96, kv_heads="", ffn="", seq=2048,
            vocab=50688, global_batch_seqs=gbs, micro_batch=1, tp=4, pp=8, cp=1, dp=dp, vpp=12, zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=4,pp=8,dp={dp},vpp=12,micro=1", known_off="",
            assumed="GPT-3 175B shape (96 x 12288, 96 heads); vocab 50257 padded to 50688 (NeMo pads to 128 x tp; not printed); "
                    "learned positions, biases, tied head assumed (GPT-3); zero 0 (distributed optimizer not printed); "
                    + NEMO_A.replace("NeMo 24.09", "NeMo 24.11"), gather="")
    # Nemotron-4 15B BF16, TP4 PP1 MBS4 GA4 seq 4096
    for n, tps, gbs in ((16, 92630, 64), (256, 1456356, 1024), (2048, 11335957, 8192)):
        dp = n // 4
        add(name=f"dgxc-nemotron4-15b-bf16-{n}g", regime="tp-dp", source="NVIDIA2025-dgxc-benchmarking-nemotron4",
            url=DGXC + "nemotron/README_15b.md", table=f"'Nemotron4 15b 24.11 BF16 (TP=4, PP=1, MBS=4, GA=4)' column {n}x H100",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576, seq=4096,
            vocab=256000, global_batch_seqs=gbs, micro_batch=4, tp=4, pp=1, cp=1, dp=dp, vpp="", zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=4,pp=1,dp={dp},micro=4", known_off="",
            assumed="Nemotron-4 15B shape from its report (arXiv 2402.16819: 32 x 6144, 48 heads, 8 KV heads, squared-ReLU MLP 4h, "
                    "256k vocab, untied, RoPE, LayerNorm without bias); seq 4096 (GBS x 4096 / step time = the printed tokens/s); "
                    "zero 0 (distributed optimizer not printed); " + NEMO_A.replace("NeMo 24.09", "NeMo 24.11"), gather="")
    # Nemotron-4 340B BF16, TP8 PP8 VP12 MBS1 GA16 seq 4096
    for n, tps, gbs in ((128, 28432, 32), (512, 111551, 128), (2048, 433296, 512)):
        dp = n // 64
        add(name=f"dgxc-nemotron4-340b-bf16-{n}g", regime="3d", source="NVIDIA2025-dgxc-benchmarking-nemotron4",
            url=DGXC + "nemotron/README_340b.md", table=f"'Nemotron4 340b 24.11 BF16 (TP=8, PP=8, MBS=1, GA=16, VP=12)' column {n}x H100",
            gpu="H100-SXM", n_gpus=n, arch="nemotron", layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728, seq=4096,
            vocab=256000, global_batch_seqs=gbs, micro_batch=1, tp=8, pp=8, cp=1, dp=dp, vpp=12, zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=8,pp=8,dp={dp},vpp=12,micro=1", known_off="",
            assumed="Nemotron-4 340B shape from its report (arXiv 2406.11704: 96 x 18432, 96 heads, 8 KV heads, squared-ReLU MLP 4h, "
                    "256k vocab, untied); seq 4096; zero 0 (distributed optimizer not printed); " + NEMO_A.replace("NeMo 24.09", "NeMo 24.11"), gather="")
    # MaxText Llama 2 70B BF16, pure FSDP scales only (FSDP = GPUs), MBS 2, seq 4096
    for n, tps, gbs in ((64, 74908.99, 128), (128, 148271.49, 256), (256, 293184.96, 512)):
        add(name=f"dgxc-maxtext-llama2-70b-bf16-{n}g", regime="fsdp", source="NVIDIA2025-dgxc-benchmarking-maxtext",
            url=DGXC + "maxtext/README_70b.md", table=f"'Maxtext LLama2 70b BF16 (FSDP+DP MBS=2)' column {n}x H100 (FSDP={n})",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, seq=4096,
            vocab=32000, global_batch_seqs=gbs, micro_batch=2, tp=1, pp=1, cp=1, dp=n, vpp="", zero_stage=3,
            recompute="", sequence_parallel="no", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"dp={n},zero=3,micro=2", known_off="",
            assumed="JAX/XLA MaxText on GPU, not PyTorch; Llama 2 70B shape; seq 4096 (GBS x 4096 / step time = the printed tokens/s); "
                    "rematerialisation policy not printed (left to the planner); the HSDP scales (512+ GPUs, FSDP=128) left out "
                    "(--layout has no hybrid sharding); compared by tokens/s per GPU", gather="node")
    # torchtitan Llama 3.1 8B, FSDP, eager (the torch.compile and Float8 rows left out)
    for n, tps, tab in ((8, 5762, "Table 1 (8 GPUs) row FSDP"), (128, 5605, "Table 3 (128 GPUs) row FSDP")):
        add(name=f"torchtitan-llama31-8b-fsdp-{n}g", regime="fsdp", source="torchtitan2024-benchmarks-h100",
            url=TT, table=tab, gpu="H100-SXM", n_gpus=n, arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8,
            ffn=14336, seq=8192, vocab=128256, global_batch_seqs=2 * n, micro_batch=2, tp=1, pp=1, cp=1, dp=n, vpp="",
            zero_stage=3, recompute="selective", sequence_parallel="no", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=tps, flops_convention="",
            published_layout=f"dp={n},zero=3,micro=2,recompute=selective", known_off="",
            assumed="Grand Teton H100 with 96 GB HBM2e at a 500 W power limit (slower than the catalog's H100-SXM; the file says "
                    "its peak lies between SXM and NVL), 400 Gb/s RDMA per GPU; seq 8192 not printed in the file (train_configs/llama3_8b.toml at the "
                    "benchmark's torchtitan commit 9dec370 sets seq_len 8192, selective AC); eager FSDP2 (the torch.compile and Float8 rows left out); selective op AC; SDPA flash attention",
            gather="node")
    # BLOOM 176B main run
    add(name="bloom-176b-384g", regime="3d", source="BigScience2022-tr11-176B-ml", url=BS + "README.md",
        table="README 'Replica setup' (TP=4 PP=12 DP=8 MBS=2) + log line at iteration 85376 (104.70 s/iteration, GBS 2048)",
        gpu="A100-80GB", n_gpus=384, arch="bloom", layers=70, hidden=14336, heads=112, kv_heads="", ffn="", seq=2048,
        vocab=250880, global_batch_seqs=2048, micro_batch=2, tp=4, pp=12, cp=1, dp=8, vpp="", zero_stage=1,
        recompute="full", sequence_parallel="no", attention="unfused", overlap="",
        measured_tokens_per_s_per_gpu=round(2048 * 2048 / (104.70 * 384), 1), flops_convention="",
        published_layout="tp=4,pp=12,dp=8,zero=1,micro=2", known_off="",
        assumed="tokens/s per GPU = 2048 x 2048 / 104.70 s / 384 (the log prints 149.77 TFLOPs, hardware FLOPs with recompute); "
                "vocab 250,680 padded to 250,880; ALiBi, embedding LayerNorm, biases, tied head; full activation checkpointing "
                "(the README's TFLOPs note); Megatron-DeepSpeed, fused-softmax attention; Jean Zay inter-node is Omni-Path "
                "(4 links per node), slower than the catalog's InfiniBand", gather="")
    # BLOOM topology benchmark before the run (2022-02-21): 181B = 72 x 14336, TP 8, 48 nodes, GBS 2048
    for dp, pp, mbs, sec in ((4, 12, 1, 143.31), (4, 12, 4, 123.69), (8, 6, 1, 139.82), (8, 6, 4, 121.48)):
        add(name=f"bloom-topo-181b-pp{pp}-mbs{mbs}", regime="3d", source="BigScience2022-tr11-176B-ml",
            url=BS + "chronicles-prequel.md", table=f"'48 node contenders' NHIDDEN=14336 / NLAYERS=72 row DP={dp} TP=8 PP={pp} MBS={mbs} ({sec} s/it)",
            gpu="A100-80GB", n_gpus=384, arch="bloom", layers=72, hidden=14336, heads=112, kv_heads="", ffn="", seq=2048,
            vocab=250880, global_batch_seqs=2048, micro_batch=mbs, tp=8, pp=pp, cp=1, dp=dp, vpp="", zero_stage=1,
            recompute="full", sequence_parallel="no", attention="unfused", overlap="",
            measured_tokens_per_s_per_gpu=round(2048 * 2048 / (sec * 384), 1), flops_convention="",
            published_layout=f"tp=8,pp={pp},dp={dp},zero=1,micro={mbs}", known_off="",
            assumed="tokens/s per GPU = 2048 x 2048 / (s/it) / 384; a single iteration (the 2nd) as the file says; heads 112 and "
                    "vocab 250,880 assumed from the final model; ZeRO-1, full activation checkpointing as the tr11 run; "
                    "Megatron-DeepSpeed fused-softmax attention; Omni-Path inter-node", gather="")
    # MT-NLG 530B
    for nodes, sec in ((280, 60.1), (350, 50.2), (420, 44.4)):
        n = nodes * 8
        add(name=f"mtnlg-530b-{n}g", regime="3d", source="Smith2022-MT-NLG", url="https://arxiv.org/abs/2201.11990",
            table=f"Section 2.4 (system performance, text): {nodes} DGX A100 nodes, {sec} s per iteration",
            gpu="A100-80GB", n_gpus=n, arch="gpt", layers=105, hidden=20480, heads=128, kv_heads="", ffn="", seq=2048,
            vocab=51200, global_batch_seqs=1920, micro_batch=1, tp=8, pp=35, cp=1, dp=n // 280, vpp="", zero_stage=1,
            recompute="full", sequence_parallel="no", attention="unfused", overlap="",
            measured_tokens_per_s_per_gpu=round(1920 * 2048 / (sec * n), 2), flops_convention="",
            published_layout=f"tp=8,pp=35,dp={n // 280}", known_off="",
            assumed="tokens/s per GPU = 1920 x 2048 / iteration time / GPUs (the paper also prints 126/121/113 TFLOP/s per GPU); "
                    "micro-batch 1, ZeRO-1 (DeepSpeed) and full activation checkpointing not in the printed layout; vocab 50,257 "
                    "padded to 51,200; Selene (A100 80GB per the Microsoft/NVIDIA blog; cli99/llm-analysis writes 40GB), HDR InfiniBand; read via the paper's numbers as quoted in "
                    "cli99/llm-analysis examples/megatron-turing-nlg/README.md", gather="")

    # Llama 3.1 405B BF16 proxy configs (cut layers so the 405B width fits fewer GPUs): each its own family
    for n, layers, pp, vp, gbs, tps in ((32, 7, 1, "", 126, 116632), (96, 21, 3, 7, 126, 117965), (192, 42, 3, 7, 252, 121936)):
        dp = n // (8 * pp * 2)
        vpp_text = f",vpp={vp}" if vp else ""
        add(name=f"dgxc-llama31-405b-proxy{layers}l-bf16-{n}g", regime="3d-cp", source="NVIDIA2025-dgxc-benchmarking-llama3.1",
            url=DGXC + "llama3.1/README_405b.md", table=f"'Llama 3.1 405b 24.09 BF16' proxy column {n}x H100 (Layers {layers}, GBS {gbs}, PP {pp}, VP {vp or 'n/a'})",
            gpu="H100-SXM", n_gpus=n, arch="llama", layers=layers, hidden=16384, heads=128, kv_heads=8, ffn=53248, seq=8192,
            vocab=128256, global_batch_seqs=gbs, micro_batch=1, tp=8, pp=pp, cp=2, dp=dp, vpp=vp, zero_stage=0,
            recompute="none", sequence_parallel="yes", attention="flash", overlap="",
            measured_tokens_per_s_per_gpu=round(tps / n, 1), flops_convention="",
            published_layout=f"tp=8,pp={pp},cp=2,dp={dp}{vpp_text},micro=1", known_off="",
            assumed="a proxy the README prints (405B width, cut to the printed layer count so it fits fewer GPUs; 'not realistic' "
                    "in the README's words, but measured); TP 8, CP 2, MBS 1, GA 63 from the table title; dp = GPUs/(8 x PP x 2); "
                    "zero 0 (distributed optimizer not printed); " + NEMO_A, gather="")

    # BloombergGPT 50B: 64 p4d (512 A100 40GB), ZeRO-3 sharded over 128 GPUs x 4 copies (MiCS), 32.5 s per step
    add(name="bloomberggpt-50b-512g", regime="fsdp", source="Wu2023-BloombergGPT", url="https://arxiv.org/abs/2303.17564",
        table="Section 3 'Large-scale optimization' (text): 102 TFLOPs average, 32.5 s per training step, 64 p4d.24xlarge",
        gpu="A100-40GB", n_gpus=512, arch="bloom", layers=70, hidden=7680, heads=40, kv_heads="", ffn="", seq=2048,
        vocab=131072, global_batch_seqs=2048, micro_batch="", tp=1, pp=1, cp=1, dp=512, vpp="", zero_stage=3,
        recompute="full", sequence_parallel="no", attention="unfused", overlap="",
        measured_tokens_per_s_per_gpu=round(2048 * 2048 / (32.5 * 512), 1), flops_convention="",
        published_layout="dp=512,zero=3,recompute=full", known_off="",
        assumed="tokens/s per GPU = 2048 x 2048 / 32.5 s / 512: the batch after warm-up (2,048 sequences) is assumed to be the "
                "one the 32.5 s step refers to (it matches the printed 102 TFLOPs as hardware FLOPs with recompute); ZeRO-3 "
                "shards over 128 GPUs with 4 model copies (MiCS, hierarchical), which --layout cannot say (full 512-way sharding "
                "given); micro-batch not printed; BLOOM-style ALiBi model; AWS p4d nodes (4x 100 Gb/s EFA per 8 GPUs, slower than the catalog's InfiniBand); read via the paper's text as quoted in a review "
                "(andlukyane.com paper review of 2303.17564)", gather="nic")
    # TinyLlama 1.1B: 24k tokens/s per A100-40G, FSDP, no activation checkpointing, 8 GPUs (the 32 hours with 8 A100 line)
    add(name="tinyllama-1.1b-8g", regime="fsdp", source="Zhang2024-TinyLlama-README",
        url="https://github.com/jzhang38/TinyLlama/blob/bf122247c486b6b897050e98cbb7bedae8eeba73/README.md",
        table="README 'Blazingly Fast': 24k tokens per second per A100-40G GPU (22B tokens in 32 hours with 8 A100)",
        gpu="A100-40GB", n_gpus=8, arch="llama", layers=22, hidden=2048, heads=32, kv_heads=4, ffn=5632, seq=2048,
        vocab=32000, global_batch_seqs=512, micro_batch=8, tp=1, pp=1, cp=1, dp=8, vpp="", zero_stage=3,
        recompute="none", sequence_parallel="no", attention="flash", overlap="",
        measured_tokens_per_s_per_gpu=24000, flops_convention="",
        published_layout="dp=8,zero=3,recompute=none", known_off="",
        assumed="global batch 512 and micro-batch 8 from pretrain/tinyllama.py at the same commit (num_of_devices 8); FSDP full "
                "shard (Lightning FSDPStrategy default, activation_checkpointing_policy None); FlashAttention-2 and fused "
                "LayerNorm/SwiGLU/cross-entropy/rotary kernels; the README's 8-GPU single node", gather="node")
    # IBM fms-fsdp: PyTorch FSDP + torch.compile, Llama 2 shapes, batch 2 per GPU, seq 4096 (7B and 34B left out)
    fms = ("https://github.com/foundation-model-stack/fms-fsdp/blob/ed74fd5ddec00e309eac20f478de883464c86526/"
           "README.md")
    for size, layers, hidden, heads, kv, ffn, a100, h100 in ((13, 40, 5120, 40, 40, 13824, 2150, 4850),
                                                            (70, 80, 8192, 64, 8, 28672, 410, 890)):
        for gpu, n, tps, net in (("A100-80GB", 128, a100, "A100 80G 128 GPUs with 400Gbps"),
                                 ("H100-SXM", 96, h100, "H100 96 GPUs with 800 Gbps")):
            add(name=f"fms-fsdp-llama2-{size}b-{gpu.split('-')[0].lower()}-{n}g", regime="fsdp",
                source="IBM2024-fms-fsdp-README", url=fms,
                table=f"'Training throughput benchmarks' row {size}b (FSDP, compile Y, Selective AC, batch 2), column '{net}'",
                gpu=gpu, n_gpus=n, arch="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn,
                seq=4096, vocab=32000, global_batch_seqs=2 * n, micro_batch=2, tp=1, pp=1, cp=1, dp=n, vpp="",
                zero_stage=3, recompute="selective", sequence_parallel="no", attention="flash", overlap="",
                measured_tokens_per_s_per_gpu=tps, flops_convention="",
                published_layout=f"dp={n},zero=3,micro=2", known_off="",
                assumed="Llama 2 shapes from fms_fsdp/utils/config_utils.py at this commit (vocab 32,000 the LLaMAConfig "
                        "default); seq 4096 and batch 2 per GPU (config/training.py defaults; no accumulation assumed); "
                        "fms-fsdp's 'Selective AC' checkpoints a fraction of the blocks (fraction not printed), so "
                        "recompute is left out of the published layout; torch.compile on; SDPA flash attention; the "
                        "network is 400 Gb/s (A100) or 800 Gb/s (H100), read as per node, far below the catalog's "
                        "per-GPU InfiniBand", gather="node")

    return rows


def csv_text(rows: list[dict[str, object]], header: str = HEADER) -> str:
    """The CSV file: the header note (a set's own), the column names, one line a row."""
    out = io.StringIO()
    out.write(header)
    writer = csv.DictWriter(out, fieldnames=COLS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c, "") for c in COLS})
    return out.getvalue()


def write_set(argv: list[str], default: Path, rows: list[dict[str, object]], header: str = HEADER) -> int:
    """A set's gatherer's command line: write the CSV of `rows` under `header` to argv[0], or over `default`, and
    say how many rows."""
    path = Path(argv[0]) if argv else default
    path.write_text(csv_text(rows, header), encoding="utf-8")
    print(f"{len(rows)} rows -> {path}")
    return 0


def main(argv: list[str]) -> int:
    """Write the CSV (to OUT.csv, or over bench/plan_blind_runs.csv) and say how many rows."""
    return write_set(argv, OUT, blind_rows())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
