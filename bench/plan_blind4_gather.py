"""Write the fourth blind set, bench/plan_blind_runs4.csv, from the figures as the sources print them.

    python -m bench.plan_blind4_gather [OUT.csv]

Gathered for issue 48 on 2026-11-28 by a helper who read none of the planner's model code, its
docs or any earlier scoring, from sources in no validation table and in none of the three earlier
blind sets (bench/plan_blind_runs{,2,3}.csv): no repository and no arXiv id of theirs is used again.
Every number below was read in the pinned file cited in the row; what a row derives (tokens/s per
GPU from a printed total or a printed samples/s, dp from the GPU count, the global batch from the
printed micro-batch x accumulation x data-parallel degree) is computed here, so the arithmetic can
be checked. `assumed` says what the source did not print. Rows in FP8, with CPU offload, on cards
outside the GPU catalog (A800/H800, V100), with a sharding the layout cannot name (hybrid ZeRO
inside a node) or for a mixture of experts were left out before any prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.plan_blind_gather import csv_text as first_set_csv_text
from bench.plan_blind_gather import finish_row, write_set

OUT = Path(__file__).resolve().parent / "plan_blind_runs4.csv"
HEADER = (
    "# FOURTH BLIND SET (issue 48): published runs gathered on 2026-11-28 by a helper who did not read the planner's\n"
    "# model code, its docs or any earlier scoring, from sources in no validation table and in none of the three earlier\n"
    "# blind sets; NOT a validation file (kept out of musubi/plan/data/validation/ so that --validate never shows it).\n"
    "# Scored once by bench/plan_blind_score.py --csv bench/plan_blind_runs4.csv from `published_layout` alone.\n"
    "# Compared by tokens/s per GPU, printed or derived (a printed total over the GPUs, or printed samples/s x the\n"
    "# sequence length); written by bench/plan_blind4_gather.py.\n"
    "# arch: llama (gated 3-matrix MLP, RoPE, untied); gpt (GELU, LayerNorm, biases, learned positions, tied).\n")

INTERNLM = "https://github.com/InternLM/InternLM/blob/20fe5ac297e61c6ee62a8589e0b7fd12e36b590b/doc/en/train_performance.md"
INTERNLM_CFG = "InternLM/InternLM configs/7B_sft.py at 00478761f7595b9d8ae0a4cbe9637d4a42c0a96e"
FLAGPERF = "https://github.com/FlagOpen/FlagPerf/blob/1b5a030398ab719e406f77877eb34c9599b17fd2/"
PADDLENLP = ("https://github.com/PaddlePaddle/PaddleNLP/blob/03f3eb2ab2109e9ec79448d132d5ff3329717a6e/"
             "llm/docs/pretrain.rst")
LLMC = "https://github.com/karpathy/llm.c/blob/f1e2ace651495b74ae22d45d1723443fd00ecd3a/"


def blind_rows() -> list[dict[str, object]]:
    """Every row of the fourth blind set, in the CSV's column names."""
    rows: list[dict[str, object]] = []

    def add(**r: object) -> None:
        rows.append(finish_row(r, cp=1))

    # --- InternLM training performance: the 7B model from 8 to 1024 A100-80GB, ZeRO-1 over all data-parallel ranks --
    internlm_7b = dict(gpu="A100-80GB", arch="llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008,
                       seq=2048, vocab=103168, pp=1, zero_stage=1, recompute="none", attention="flash")
    internlm_assumed = (
        "printed TGS (tokens per GPU per second; 'pack_sample_into_one=False and checkpoint=False'); 7B shape from "
        f"{INTERNLM_CFG} (32 x 4096, 32 heads, MLP_RATIO 8/3 -> 11,008 after InternLM's rounding up to 256, vocab "
        "103,168, rmsnorm, use_flash_attn=True, sequence_parallel=False; InternLM's 7B has QKV biases, not modelled); "
        "micro_bsz samples are packed into one row of micro_bsz x 2048 tokens with attention kept within each sample "
        "(pack_sample_into_one=False), named micro=micro_bsz sequences of 2048; global batch = micro_num 4 x micro_bsz "
        "x dp, the same tokens per GPU at every scale (the doc: 'the number of tokens processed per GPU in a single "
        "iteration remained consistent'); zero1=-1 shards the optimizer over all data-parallel ranks (the doc: "
        "'equivalent to Deepspeed Zero-1'), with the config's overlap_sync_grad/overlap_sync_param; only the zero1=-1 "
        "rows: zero1=8 / zero1=4 shard inside a node and replicate across nodes, which --layout cannot name; NETWORK "
        "4 x 100 Gb RoCE per 8-GPU node (6.25 GB/s per GPU a direction, below a DGX A100's 8 x 200 Gb): the scorer "
        "predicts with the catalog's node; bf16")
    for tp, cells in ((1, ((8, 4062), (64, 3690), (256, 3209), (1024, 2271))),
                      (2, ((8, 3822), (64, 3438), (256, 3094), (1024, 2785)))):
        micro = 2 if tp == 1 else 4
        for n, tgs in cells:
            dp = n // tp
            layout = (f"dp={dp}," if tp == 1 else f"tp={tp},dp={dp},") + f"zero=1,micro={micro},recompute=none"
            layout += ",sp=no" if tp > 1 else ""
            add(name=f"internlm-7b-tp{tp}-zero1-{n}g", regime="dp" if tp == 1 else "tp-dp", source="InternLM2023-train-performance",
                url=INTERNLM,
                table=f"'Throughput Measurement' table, row (tp={tp}, zero1=-1), column {n} GPUs: {tgs} TGS; hardware "
                      "table: nvidia_a100-sxm4-80gb, inter-machine bandwidth 4 * 100Gb RoCE; hyperparameters "
                      f"tp={tp}: micro_num 4, micro_bsz {micro}, seq_len 2048",
                n_gpus=n, global_batch_seqs=4 * micro * dp, micro_batch=micro, tp=tp, dp=dp,
                sequence_parallel="no" if tp > 1 else "", measured_tokens_per_s_per_gpu=tgs,
                published_layout=layout, assumed=internlm_assumed, **internlm_7b)

    # --- FlagPerf (BAAI): Megatron-Core Llama 3 8B / 70B and DeepSpeed ChatGLM3-6B on H100 -------------------------
    llama3 = dict(gpu="H100-SXM", arch="llama", seq=8192, vocab=128256, pp=1, zero_stage=1, recompute="",
                  sequence_parallel="yes", attention="flash")
    llama3_assumed = (
        "printed token/p/s (the case's run_pretraining.py: 512 x 8192 tokens / Megatron's elapsed time per "
        "iteration / GPUs; its printed MFU = token/p/s x 6 x 8e9 / 989e12 agrees); shape, batch and flags from "
        "training/benchmarks/llama3_{8B,70B}/megatron/pretrain_llama3.sh at this commit (GQA 8 groups, SwiGLU, RMSNorm, "
        "seq 8192, --global-batch-size 512, --sequence-parallel, --use-distributed-optimizer (ZeRO-1), "
        "--transformer-impl transformer_engine, --use-flash-attn, bf16; no interleaving flag: Megatron's plain 1F1B), "
        "micro-batch 1 and TP/PP from config_H100x*.py; vocab 128,256 (the Llama 3 tokenizer); the README lists "
        "'recompute-activations' among the optimisations but the script passes no recompute flag: recompute left to the "
        "planner; H100 'NVIDIA_H100-SXM4-80GB', InfiniBand 400 Gb/s per the 70B README (the 8B README prints no H100 "
        "network); megatron-core core_v0.6.0")
    for n, dp, tps, gbs in ((8, 4, 8103, 512), (16, 8, 7914, 512), (440, 220, 7047, 1760)):
        add(name=f"flagperf-llama3-8b-tp2-{n}g", regime="tp-dp", source="BAAI2024-FlagPerf-llama3-8B-megatron",
            url=FLAGPERF + "training/nvidia/llama3_8B-megatron/README.md",
            table=f"'性能指标' table, row H100 {n // 8}x8 bf16 PP1DP{dp}TP2"
                  + (", fix_hp gbs=1760* ('仅供性能参考', for performance reference only)" if gbs != 512 else "")
                  + f": {tps} token/p/s",
            n_gpus=n, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, global_batch_seqs=gbs, micro_batch=1,
            tp=2, dp=dp, measured_tokens_per_s_per_gpu=tps,
            published_layout=f"tp=2,dp={dp},zero=1,micro=1,sp=yes,attention=flash",
            assumed=llama3_assumed + ("; the 440-GPU row ran at a global batch of 1760 (printed as fix_hp), its "
                                      "throughput taken as printed" if gbs != 512 else ""),
            **llama3)
    llama3_70b = {**llama3, "pp": 4}
    add(name="flagperf-llama3-70b-tp8-pp4-64g", regime="3d", source="BAAI2024-FlagPerf-llama3-70B-megatron",
        url=FLAGPERF + "training/nvidia/llama3_70B-megatron/README.md",
        table="'性能指标' table, row H100八机64卡（8x8） bf16 PP4DP2TP8: 851 token/p/s (MFU 36.1%); "
              "NVIDIA_H100-SXM4-80GB, InfiniBand 400Gb/s",
        n_gpus=64, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, global_batch_seqs=512, micro_batch=1,
        tp=8, dp=2, vpp=1, measured_tokens_per_s_per_gpu=851,
        published_layout="tp=8,pp=4,dp=2,vpp=1,zero=1,micro=1,sp=yes,attention=flash",
        assumed=llama3_assumed.replace("6 x 8e9", "6 x 70e9 (the 70B script)"), **llama3_70b)
    add(name="flagperf-chatglm3-6b-zero3-8g", regime="fsdp", source="BAAI2024-FlagPerf-chatglm3-6b-deepspeed",
        url=FLAGPERF + "training/nvidia/chatglm3_6b-deepspeed/README.md",
        table="'性能指标' table, row H100单机8卡（1x8） bf16 mpe=4096: 8429.22 token/p/s (MFU 30.7%); "
              "NVIDIA_H100-SXM-80GB; 并行策略 ZeRO-DP O3, DP_SIZE=8",
        gpu="H100-SXM", n_gpus=8, arch="llama", layers=28, hidden=4096, heads=32, kv_heads=2, ffn=13696, seq=4096,
        vocab=65024, global_batch_seqs=8, micro_batch=1, tp=1, pp=1, dp=8, zero_stage=3, recompute="none",
        sequence_parallel="", attention="flash", measured_tokens_per_s_per_gpu=8429.22,
        published_layout="dp=8,zero=3,micro=1,recompute=none,attention=flash",
        assumed="printed token/p/s; shape from training/benchmarks/chatglm3_6b/deepspeed/chatglm3_6b_hf/config.json at "
                "this commit (28 layers, 4096, 32 heads, multi_query_group_num 2, SwiGLU ffn 13,696, padded vocab "
                "65,024, RMSNorm, untied; QKV biases not modelled); local batch 1 and flashattn from "
                "config_H100x1x8.py, gradient_accumulation_steps 1 from the case's ds_config.json, ZeRO stage 3 from "
                "the benchmark's ds_config.json (no offload), gradient checkpointing off (not set in the H100 config); "
                "deepspeed 0.11.1; DeepSpeed ZeRO-3 gathers per parameter (gather left to the planner)")
    paddle = dict(arch="llama", n_gpus=8, seq=2048, vocab=32000, attention="flash", memory_precision="mixed")
    paddle_assumed = (
        "tokens/s per GPU = the printed samples/s x 2048 / 8 (the README prints the product); LLaMA-{size} shape "
        "(facebook/llama-{size}: 7B 32 x 4096, 32 heads, ffn 11,008; 13B 40 x 5120, 40 heads, ffn 13,824; vocab "
        "32,000); flags from the named config_*.py at this commit (fp16 O2, use_flash_attention, the printed "
        "per_device_bs and accumulation, sharding stage and degree, recompute full when on); paddle 2.5.1, DGX A100 "
        "with InfiniBand 200Gb/s (one node here); Paddle's sharding stage2 = ZeRO-2 (optimizer + gradients sharded)")
    for name, gpu, size, cfg, sps, layout, tp, pp, dp, zero, micro, accum, recompute in (
            ("flagperf-paddle-llama1-7b-sharding2-a100-80g-8g", "A100-80GB", "7b", "TP1PP1SH2SP8A10080Gx1x8", 16.67,
             "dp=8,zero=2,micro=4,recompute=none", 1, 1, 8, 2, 4, 64, "none"),
            ("flagperf-paddle-llama1-7b-tp2-pp4-a100-80g-8g", "A100-80GB", "7b", "TP2PP4SH1SP1A10080Gx1x8", 14.54,
             "tp=2,pp=4,dp=1,vpp=1,zero=0,micro=4,recompute=none", 2, 4, 1, 0, 4, 512, "none"),
            ("flagperf-paddle-llama1-7b-sharding2-a100-40g-8g", "A100-40GB", "7b", "TP1PP1SH2SP8A10040Gx1x8", 10.72,
             "dp=8,zero=2,micro=2,recompute=full", 1, 1, 8, 2, 2, 128, "full"),
            ("flagperf-paddle-llama1-13b-sharding2-a100-80g-8g", "A100-80GB", "13b", "TP1PP1SH2SP8A10080Gx1x8", 6.67,
             "dp=8,zero=2,micro=2,recompute=full", 1, 1, 8, 2, 2, 128, "full"),
            ("flagperf-paddle-llama1-13b-tp2-pp4-a100-80g-8g", "A100-80GB", "13b", "TP2PP4SH1SP1A10080Gx1x8", 6.24,
             "tp=2,pp=4,dp=1,vpp=1,zero=0,micro=4,recompute=full", 2, 4, 1, 0, 4, 512, "full")):
        shape = (dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008) if size == "7b"
                 else dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824))
        mem = gpu.split("-")[1]
        add(name=name, regime="tp-pp" if pp > 1 else "dp", source="BAAI2023-FlagPerf-llama1-paddle",
            url=FLAGPERF + "training/nvidia/llama1_7B-paddle/README.md",
            table=f"'性能指标' table, LLaMA-{size[:-1]}B block, row A100单机8卡（1x8*{mem}） config_{cfg}: "
                  f"{sps} * 2048 / 8 = {int(sps * 2048 / 8)} tokens/s (per_device_bs={micro}, accumulate={accum}, "
                  "global bs = 4M tokens)",
            gpu=gpu, global_batch_seqs=micro * accum * dp, micro_batch=micro, tp=tp, pp=pp, dp=dp,
            vpp=1 if pp > 1 else "", zero_stage=zero, recompute=recompute,
            sequence_parallel="", measured_tokens_per_s_per_gpu=round(sps * 2048 / 8, 1), published_layout=layout,
            assumed=paddle_assumed.replace("{size}", size)
                    + ("; sharding stage1 over a degree of 1 shards nothing (zero=0); virtual_pp_degree 1 (plain 1F1B)"
                       if pp > 1 else ""),
            **shape, **paddle)

    # --- PaddleNLP pretraining performance table: 8 A100 80G, tensor parallel 2 x sharding 4 (stage 2) --------------
    paddlenlp_assumed = (
        "printed speed in tokens/card/sec (the table's footnote); A100 80G x 8, CUDA 11.8, NCCL 2.15, one node; flags "
        "from the named pretrain JSON ({cfg}): bf16 O2, use_flash_attention, sequence_parallel 0, "
        "per_device_train_batch_size x gradient_accumulation_steps x the sharding degree = the global batch, "
        "sharding stage2 = ZeRO-2 over the sharding group, recompute as the JSON says; the table pins paddle "
        "9b36e53f and paddlenlp 0b246a60, the JSONs are read at the commits named here (the same file names)")
    for name, model, tps, shape, layout, tp, dp, micro, accum, recompute, cfg in (
            ("paddlenlp-llama2-7b-tp2-sd4-8g", "meta-llama/Llama-2-7b", 3755.21,
             dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000),
             "tp=2,dp=4,zero=2,micro=2,recompute=none,sp=no,attention=flash", 2, 4, 2, 8, "none",
             "llm/llama/pretrain-llama2_7b-tp2sd4_stage2.json at 1392867c40663d5883445db44ab172b32c83e00e"),
            ("paddlenlp-llama2-13b-tp2-sd4-8g", "meta-llama/Llama-2-13b", 1975.63,
             dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000),
             "tp=2,dp=4,zero=2,micro=1,recompute=none,sp=no,attention=flash", 2, 4, 1, 16, "none",
             "llm/llama/pretrain-llama2_13b-tp2sd4_stage2.json at 5a7e0977ec61b3c97af8039acef6c0b5d097a8e7"),
            ("paddlenlp-baichuan2-13b-sd8-8g", "baichuan-inc/Baichuan2-13B-Base", 1354.99,
             dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13696, vocab=125696),
             "dp=8,zero=2,micro=1,recompute=full,attention=flash", 1, 8, 1, 8, "full",
             "llm/baichuan/pretrain-baichuan2_13b-sd8_stage2.json at 21214b2b8cb7a55e3f73806dbe204508013ecc51")):
        strategy = "tp2sd4_stage2" if tp == 2 else "sd8_stage2"
        add(name=name, regime="tp-dp" if tp > 1 else "dp", source="PaddlePaddle2023-PaddleNLP-pretrain-performance",
            url=PADDLENLP,
            table=f"'模型性能测试汇总' csv-table, row ``{model}``: sequence 4096, ``{strategy}``, {tps} tokens/card/sec "
                  "(2023-11-27), A100 80G * 8",
            gpu="A100-80GB", n_gpus=8, arch="llama", seq=4096, global_batch_seqs=micro * accum * dp, micro_batch=micro,
            tp=tp, pp=1, dp=dp, zero_stage=2, recompute=recompute, sequence_parallel="no" if tp > 1 else "",
            attention="flash", measured_tokens_per_s_per_gpu=tps, published_layout=layout,
            assumed=paddlenlp_assumed.replace("{cfg}", cfg)
                    + ("; Baichuan2-13B: 40 x 5120, 40 heads, SwiGLU 13,696, vocab 125,696, ALiBi positions (no "
                       "rotary; modelled as llama)" if "baichuan" in name else "; Llama 2 shape"),
            **shape)

    # --- karpathy/llm.c: GPT-2 124M-1558M repro scripts, one node of 8 GPUs, step time printed in each script ------
    llmc_assumed = (
        "tokens/s per GPU = the script's tokens per step (-d) / the printed step time / 8 (the scripts print '~' for the "
        "A100 step times: a rounded figure); -b micro-batch and -t sequence per GPU, gradient accumulation = -d / (8 x -b x "
        "-t); -z 1 ZeRO-1 (optimizer state sharded), -r 0 no recompute, USE_CUDNN=1 (cuDNN fused flash attention: "
        "flash on A100, the Hopper cuDNN kernel on H100), bf16 (llm.c's default precision); shapes from train_gpt2.cu at "
        "this commit (-e dN: GPT-2 of N layers, 124M 768/12 heads, 350M 1024/16, 774M 1280/20, 1558M 1600/25; vocab "
        "50,257 padded to 50,304; learned positions up to 1024; tied head; GELU, LayerNorm, biases); llm.c has no "
        "dropout (the gpt arch's dropout is modelled anyway); one node, NVLink; the same folder's run_gpt3_125M.sh was "
        "left out: its printed ~150 ms/iter for 524,288 tokens on 8 A100 would be 6 x 125e6 x 437k = 328 TFLOP/s per "
        "GPU, above the A100's 312 peak, so that figure cannot be the stated hardware's")
    llmc = (  # script, depth, hidden, heads, gpu, micro, tokens per step, step seconds, attention
        ("run_gpt2_124M.sh", "124m", 12, 768, 12, "A100-80GB", 64, 524288, 0.300, "flash", "~300ms/iter"),
        ("run_gpt2_350M.sh", "350m", 24, 1024, 16, "A100-80GB", 64, 524288, 0.820, "flash", "~820ms/iter"),
        ("run_gpt2_774M.sh", "774m", 36, 1280, 20, "A100-80GB", 32, 524288, 1.7, "flash", "~1.7s/iter"),
        ("run_gpt2_1558M.sh", "1558m", 48, 1600, 25, "H100-SXM", 16, 1048576, 2.80, "flash3", "2.80s/iter"))
    for script, size, layers, hidden, heads, gpu, micro, step_tokens, step_s, attention, printed in llmc:
        card = "8X A100 80GB SXM" if gpu.startswith("A100") else "8X H100 80GB SXM"
        add(name=f"llmc-gpt2-{size}-8g", regime="dp", source="Karpathy2024-llm.c-GPT-2-repro-scripts",
            url=LLMC + "scripts/" + script,
            table=f"scripts/{script} header: 'on {card} ... steps in {printed}'; command line -b {micro} -t 1024 "
                  f"-d {step_tokens} -z 1 -r 0 -e \"d{layers}\"",
            gpu=gpu, n_gpus=8, arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden,
            seq=1024, vocab=50304, global_batch_seqs=step_tokens // 1024, micro_batch=micro, tp=1, pp=1, dp=8,
            zero_stage=1, recompute="none", sequence_parallel="", attention=attention,
            measured_tokens_per_s_per_gpu=round(step_tokens / step_s / 8, 1),
            published_layout=f"dp=8,zero=1,micro={micro},recompute=none,attention={attention}",
            assumed=llmc_assumed)
    return rows


def csv_text(rows: list[dict[str, object]]) -> str:
    """The CSV file in the first set's layout (plan_blind_gather.csv_text) under this set's header note."""
    return first_set_csv_text(rows, HEADER)


def main(argv: list[str]) -> int:
    """Write the CSV (to OUT.csv, or over bench/plan_blind_runs4.csv) and say how many rows."""
    return write_set(argv, OUT, blind_rows(), HEADER)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
