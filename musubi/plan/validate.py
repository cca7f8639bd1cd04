"""The planner against published runs: the fit set and the held-out set, each row in its paper's convention.

Two tables ship with the planner (musubi/plan/data/validation/):

- `fit_runs.csv`: the rows the efficiency constants were chosen on (a copy of
  shared/validation/published_runs.csv: Narayanan 2021 Table 1, Korthikanti 2022 Table 5);
- `heldout_runs.csv`: other published runs (ZeRO-3 and PTD-P at fixed global batch,
  MegaScale's Megatron-LM baseline to 12,288 GPUs, Llama 3 405B on 16,384 H100s), each
  with its source, table and the assumptions made where the paper is silent. No fit reads
  it (musubi/plan/fit.py opens only the fit set; a test enforces that): its errors are the
  planner's honest error on runs it has not seen.

A row is predicted with its own layout and compared in its own FLOP convention: `hfu` rows by
TFLOP/s per GPU counting the recomputed forward, `mfu` rows by model TFLOP/s per GPU (or the
published fraction of peak), rows with only an iteration time by step time.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path

from musubi.plan.catalog import get_gpu
from musubi.plan.cluster import Cluster, make_cluster
from musubi.plan.complete import complete_layout, stack_range
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.layout import DEFAULT_OVERLAP, Layout, given_keys, parse_layout
from musubi.plan.predict import Prediction, predict
from musubi.plan.spec import TransformerSpec

DATA = Path(__file__).resolve().parent / "data" / "validation"
FIT_CSV = DATA / "fit_runs.csv"
HELDOUT_CSV = DATA / "heldout_runs.csv"
GATHERED_CSV = DATA / "gathered_runs.csv"
NEVERSEEN_CSV = DATA / "neverseen_runs.csv"


@dataclass(frozen=True)
class Check:
    """One published run against its prediction."""

    name: str
    regime: str
    source: str
    quantity: str
    predicted: float
    measured: float
    dominant: str  # the breakdown term that takes most of the predicted step
    known_off: str = ""  # why the planner cannot match this run (stated in the data file), or ""

    @property
    def error(self) -> float:
        """Signed relative error, predicted / measured - 1."""
        return self.predicted / self.measured - 1


def load_rows(path: Path) -> list[dict[str, str]]:
    """The rows of one validation table."""
    with path.open(newline="", encoding="utf-8") as f:  # "#" lines: the file's header note (where rows come from)
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def row_spec(row: dict[str, str]) -> TransformerSpec:
    """The row's model: Megatron's GPT shape, or Llama's (SwiGLU, GQA, RMSNorm, untied head)."""
    common = dict(name=row["name"], layers=int(row["layers"]), hidden=int(row["hidden"]), heads=int(row["heads"]),
                  vocab=int(row["vocab"]), seq=int(row["seq"]))
    if row.get("arch", "gpt") == "llama":
        return TransformerSpec(**common, kv_heads=int(row["kv_heads"]), ffn_hidden=int(row["ffn"]))
    if row.get("arch") == "mpt":  # MosaicML MPT: GELU MLP, LayerNorm, no biases, tied head, learned positions
        return TransformerSpec(**common, mlp="gelu", norm="layernorm", learned_positions=True, tied_embeddings=True)
    return TransformerSpec(**common, mlp="gelu", bias=True, norm="layernorm", learned_positions=True,
                           tied_embeddings=True, dropout=True)


def row_layout(row: dict[str, str]) -> Layout:
    """The row's published layout; unpublished micro-batch and vpp default to 1.

    Attention: an `attention` column wins; otherwise runs published before 2023 used
    Megatron's unfused softmax attention (FlashAttention appeared in mid-2022).
    """
    year = int(re.search(r"(19|20)\d\d", row["source"]).group(0))  # type: ignore[union-attr]
    attention = row.get("attention") or ("unfused" if year < 2023 else "flash")
    overlap = row.get("overlap") or ""
    overlaps = DEFAULT_OVERLAP if not overlap else frozenset() if overlap == "none" else frozenset(overlap.split(";"))
    return Layout(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), cp=int(row.get("cp") or 1),
                  vpp=int(row["vpp"] or 1), zero=int(row["zero_stage"] or 0), recompute=row["recompute"] or "none",
                  micro=int(row["micro_batch"] or 1), sp=row["sequence_parallel"] == "yes", attention=attention,
                  gather=row.get("gather") or "nic", overlap=overlaps)


def row_cluster(row: dict[str, str]) -> Cluster:
    """The row's machines: its catalog GPU, with the network the source printed (`nic_gbps`) when it differs."""
    gpu = get_gpu(row["gpu"])
    if row.get("nic_gbps"):  # e.g. Jean Zay (BLOOM): 4x 100 Gb/s Omni-Path per 8 GPUs, not a DGX's 8x 200 Gb/s
        gpu = replace(gpu, nic_gbps=float(row["nic_gbps"]))
    return make_cluster(gpu, int(row["n_gpus"]))


def predict_row(row: dict[str, str], eff: Efficiency = DEFAULT_EFFICIENCY) -> Prediction:
    """The planner's prediction for one row's model, machine and layout."""
    cluster = row_cluster(row)
    precision = row.get("memory_precision") or "mixed"
    return predict(row_spec(row), cluster, row_layout(row), int(row["global_batch_seqs"]), eff,
                   memory_precision=precision)


def dominant_term(p: Prediction) -> str:
    """The breakdown term that takes the largest share of the predicted step."""
    return max(p.breakdown_s, key=lambda k: p.breakdown_s[k]).removesuffix("_s")


def compare(row: dict[str, str], p: Prediction) -> Check:
    """One row's published quantity against a prediction, in the row's convention."""
    regime, dom, off = row.get("regime") or "fit", dominant_term(p), row.get("known_off") or ""
    conv = row.get("flops_convention", "")
    if row.get("measured_tflops_per_gpu"):
        predicted = p.hardware_tflops_per_gpu if conv == "hfu" else p.model_tflops_per_gpu
        return Check(row["name"], regime, row["source"], f"TFLOP/s ({conv})", predicted,
                     float(row["measured_tflops_per_gpu"]), dom, off)
    if row.get("measured_tokens_per_s_per_gpu"):
        return Check(row["name"], regime, row["source"], "tokens/s/GPU", p.tokens_per_s / p.n_gpus,
                     float(row["measured_tokens_per_s_per_gpu"]), dom, off)
    if row.get("measured_iter_s"):
        return Check(row["name"], regime, row["source"], "iteration s", p.step_time_s, float(row["measured_iter_s"]),
                     dom, off)
    return Check(row["name"], regime, row["source"], "MFU", p.mfu, float(row["measured_fraction_of_peak"]), dom, off)


def check_row(row: dict[str, str], eff: Efficiency = DEFAULT_EFFICIENCY) -> Check:
    """Predict one row with every knob the data file states (published or assumed) and compare."""
    return compare(row, predict_row(row, eff))


def predict_published(row: dict[str, str], eff: Efficiency = DEFAULT_EFFICIENCY) -> Prediction:
    """What `musubi plan --layout PUBLISHED --json` predicts: only the printed knobs, the planner fills the rest."""
    cluster = row_cluster(row)
    text = row["published_layout"]
    spec, batch = row_spec(row), int(row["global_batch_seqs"])
    layout, _ = complete_layout(spec, cluster, parse_layout(text), given_keys(text), batch, eff)
    return predict(spec, cluster, layout, batch, eff)


def check_published(row: dict[str, str], eff: Efficiency = DEFAULT_EFFICIENCY) -> Check:
    """Predict one row from its published layout alone (the CLI's defaults for the rest) and compare."""
    return compare(row, predict_published(row, eff))


def published_range(row: dict[str, str], eff: Efficiency = DEFAULT_EFFICIENCY) -> tuple[float, float]:
    """The signed errors of the two ends of `musubi plan --layout PUBLISHED`'s range over the stack facts the printed
    layout leaves unsaid (complete.stack_range), low first; both the point estimate's error when it names them all."""
    cluster = row_cluster(row)
    text = row["published_layout"]
    spec, batch = row_spec(row), int(row["global_batch_seqs"])
    layout, _ = complete_layout(spec, cluster, parse_layout(text), given_keys(text), batch, eff)
    spread = stack_range(spec, cluster, layout, given_keys(text), batch, eff)
    if spread is None:
        error = compare(row, predict(spec, cluster, layout, batch, eff)).error
        return error, error
    a, b = compare(row, spread[0]).error, compare(row, spread[1]).error
    return min(a, b), max(a, b)


def range_coverage(path: Path, eff: Efficiency = DEFAULT_EFFICIENCY) -> tuple[int, int, list[str]]:
    """How many rows of a table with printed layouts have their published figure inside the range `musubi plan
    --layout` prints: (inside, rows, the names of the rows outside)."""
    rows = [row for row in load_rows(path) if row.get("published_layout")]
    outside = []
    for row in rows:
        low, high = published_range(row, eff)
        if not low <= 0 <= high:
            outside.append(row["name"])
    return len(rows) - len(outside), len(rows), outside


def check_table(path: Path, eff: Efficiency = DEFAULT_EFFICIENCY, published: bool = False) -> list[Check]:
    """Every row of one validation table, checked with its stated knobs or (published) from its printed layout."""
    check = check_published if published else check_row
    return [check(row, eff) for row in load_rows(path) if not published or row.get("published_layout")]


def summary(checks: list[Check], by: str = "regime") -> dict[str, tuple[int, float, float]]:
    """Per regime (or source), overall, and overall without the rows marked known-off: (rows, mean, max |error|)."""
    keys = sorted({getattr(c, by) for c in checks})
    groups = {key: [c for c in checks if getattr(c, by) == key] for key in keys}
    groups["all"] = checks
    if any(c.known_off for c in checks):
        groups["all but known-off"] = [c for c in checks if not c.known_off]
    out: dict[str, tuple[int, float, float]] = {}
    for name, group in groups.items():
        if group:
            errs = [abs(c.error) for c in group]
            out[name] = (len(errs), sum(errs) / len(errs), max(errs))
    return out


def table_text(title: str, checks: list[Check], by: str = "regime") -> str:
    """A plain-text table of the checks and their summary per regime (or per `by`: "source")."""
    lines = [title, f"  {'run':22} {'regime':9} {'quantity':15} {'predicted':>10} {'measured':>10} {'error':>8}  "
                    "dominant term"]
    lines += [f"  {c.name:22} {c.regime:9} {c.quantity:15} {c.predicted:10.3g} {c.measured:10.3g} "
              f"{100 * c.error:+7.1f}%  {c.dominant}{'  (known off)' if c.known_off else ''}" for c in checks]
    for regime, (n, mean, worst) in summary(checks, by).items():
        lines.append(f"  {regime:17} {n:3} rows: mean |error| {100 * mean:5.1f} %, max {100 * worst:5.1f} %")
    reasons = {c.known_off for c in checks if c.known_off and c.known_off != "as above"}
    lines += [f"  known off: {reason}" for reason in sorted(reasons)]
    return "\n".join(lines)
