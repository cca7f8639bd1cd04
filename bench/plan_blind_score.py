"""Score the planner on the blind set (bench/plan_blind_runs.csv) as an outside scorer would.

    python bench/plan_blind_score.py [--csv bench/plan_blind_runs.csv] [--apart PREFIX ...] [--json OUT.json]

Each row is predicted from its `published_layout` alone through the public CLI,
`musubi plan --spec SPEC --gpu G --gpus N --seq S --global-batch B --layout PUBLISHED --json`
(the planner fills what the source left out), and compared by tokens/s per GPU (or TFLOP/s per
GPU in the row's convention where a row gives that instead). Prints one line a row, the mean and
worst absolute error (overall and per regime), and the trend with scale of each family (the same
model and source at several GPU counts): the sign of the change from the fewest to the most GPUs,
measured against predicted, a change under 1 % counting as flat. `--apart PREFIX` scores the rows
whose name starts with PREFIX in a table of their own (rows that stopped being blind, e.g. a run the
modeller has since added to a check set), so the blind figures stay blind.

The set is scored once, at the end of a modelling round; the rows were gathered by someone who
did not read the planner's model code and are kept outside musubi/plan/data/validation/ so that
`musubi plan --validate` never shows them.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLIND_CSV = REPO / "bench" / "plan_blind_runs.csv"
FLAT = 0.01  # a change with scale under 1 % is "flat": its sign is noise at these figures' precision


@dataclass(frozen=True)
class Scored:
    """One blind row against the CLI's prediction."""

    name: str
    family: str
    regime: str
    n_gpus: int
    quantity: str
    measured: float
    predicted: float
    filled: str  # what the planner chose because the published layout did not say
    dominant: str  # the largest term of the predicted step

    @property
    def error(self) -> float:
        """Signed relative error, predicted / measured - 1."""
        return self.predicted / self.measured - 1


def load_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's rows; "#" lines are the file's header note."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def spec_fields(row: dict[str, str]) -> dict[str, object]:
    """The model spec YAML fields for a row's `arch` (the shapes the CSV header describes)."""
    shape: dict[str, object] = {"layers": int(row["layers"]), "hidden": int(row["hidden"]),
                                "heads": int(row["heads"]), "vocab": int(row["vocab"]), "seq": int(row["seq"])}
    arch = row["arch"]
    if arch == "llama":  # SwiGLU, GQA, RMSNorm, untied head, RoPE
        return {**shape, "kv_heads": int(row["kv_heads"]), "ffn_hidden": int(row["ffn"]), "mlp": "swiglu"}
    if arch == "nemotron":  # squared ReLU: two matrices like GELU; GQA, LayerNorm without biases, untied, RoPE
        return {**shape, "kv_heads": int(row["kv_heads"]), "ffn_hidden": int(row["ffn"]), "mlp": "gelu",
                "norm": "layernorm"}
    if arch == "gpt":  # GPT-3: GELU, biases, LayerNorm, learned positions, tied head, dropout
        return {**shape, "mlp": "gelu", "bias": True, "norm": "layernorm", "learned_positions": True,
                "tied_embeddings": True, "dropout": True}
    if arch == "bloom":  # BLOOM: GELU, biases, LayerNorm, ALiBi (no position table), tied head
        return {**shape, "mlp": "gelu", "bias": True, "norm": "layernorm", "tied_embeddings": True}
    raise ValueError(f"row {row['name']}: arch {arch!r} is unknown; use llama, nemotron, gpt or bloom")


def write_spec(fields: dict[str, object], path: Path) -> Path:
    """A spec YAML (flat `key: value` lines, which is all a spec needs)."""
    text = "".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in fields.items())
    path.write_text(text, encoding="utf-8")
    return path


def cli_predict(row: dict[str, str], workdir: Path) -> dict[str, object]:
    """`musubi plan --layout PUBLISHED --json` for one row, run as a separate process."""
    spec = write_spec(spec_fields(row), workdir / f"{row['name']}.yaml")
    argv = [sys.executable, "-m", "musubi.cli", "plan", "--spec", str(spec), "--gpu", row["gpu"],
            "--gpus", row["n_gpus"], "--seq", row["seq"], "--global-batch", row["global_batch_seqs"],
            "--layout", row["published_layout"], "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"row {row['name']}: musubi plan failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)


def family_of(name: str) -> str:
    """The row's family: its name without the trailing GPU count (`-512g`)."""
    return re.sub(r"-\d+g$", "", name)


def score_row(row: dict[str, str], prediction: dict[str, object]) -> Scored:
    """One row's published quantity against the CLI's prediction, in the row's convention."""
    n = int(row["n_gpus"])
    if row.get("measured_tokens_per_s_per_gpu"):
        quantity, measured = "tokens/s/GPU", float(row["measured_tokens_per_s_per_gpu"])
        predicted = float(prediction["tokens_per_s"]) / n  # type: ignore[arg-type]
    else:
        conv = row["flops_convention"]
        key = "hardware_tflops_per_gpu" if conv == "hfu" else "model_tflops_per_gpu"
        quantity, measured, predicted = f"TFLOP/s ({conv})", float(row["measured_tflops_per_gpu"]), \
            float(prediction[key])  # type: ignore[arg-type]
    breakdown = prediction.get("breakdown_s") or {}
    dominant = max(breakdown, key=lambda k: breakdown[k]).removesuffix("_s") if breakdown else ""  # type: ignore[union-attr]
    filled = prediction.get("filled") or {}
    filled_text = ",".join(f"{k}={v}" for k, v in filled.items()) if isinstance(filled, dict) else str(filled)
    return Scored(row["name"], family_of(row["name"]), row["regime"], n, quantity, measured, predicted,
                  filled_text, dominant)


def sign(change: float) -> int:
    """-1, 0 or +1: a change under FLAT is flat."""
    return 0 if abs(change) < FLAT else (1 if change > 0 else -1)


def trends(scored: list[Scored]) -> list[tuple[str, int, int, float, float, bool]]:
    """Per family with several GPU counts: (family, fewest, most GPUs, measured change, predicted change, sign right)."""
    out = []
    for family in sorted({s.family for s in scored}):
        rows = sorted((s for s in scored if s.family == family), key=lambda s: s.n_gpus)
        if len({s.n_gpus for s in rows}) < 2:
            continue
        first, last = rows[0], rows[-1]
        measured, predicted = last.measured / first.measured - 1, last.predicted / first.predicted - 1
        out.append((family, first.n_gpus, last.n_gpus, measured, predicted, sign(measured) == sign(predicted)))
    return out


def summary(scored: list[Scored]) -> list[tuple[str, int, float, float, str]]:
    """(group, rows, mean |error|, worst |error|, worst row) per regime and for all rows."""
    groups = {regime: [s for s in scored if s.regime == regime] for regime in sorted({s.regime for s in scored})}
    groups["all"] = scored
    out = []
    for name, group in groups.items():
        worst = max(group, key=lambda s: abs(s.error))
        out.append((name, len(group), sum(abs(s.error) for s in group) / len(group), abs(worst.error), worst.name))
    return out


def report(scored: list[Scored], apart: tuple[str, ...] = ()) -> str:
    """The score as plain text: the blind rows, then any rows scored apart (`apart`: name prefixes)."""
    blind = [s for s in scored if not s.name.startswith(apart)] if apart else scored
    text = "BLIND ROWS\n" + report_table(blind)
    away = [s for s in scored if s.name.startswith(apart)] if apart else []
    if away:
        text += f"\n\nSCORED APART (no longer blind: {', '.join(apart)})\n" + report_table(away)
    return text


def report_table(scored: list[Scored]) -> str:
    """One group as plain text: one line a row, the error summary, the trend signs."""
    lines = [f"{'row':36} {'GPUs':>5} {'quantity':13} {'measured':>9} {'predicted':>9} {'error':>7}  dominant  filled"]
    lines += [f"{s.name:36} {s.n_gpus:5d} {s.quantity:13} {s.measured:9.1f} {s.predicted:9.1f} {s.error:+7.1%}  "
              f"{s.dominant:9} {s.filled}" for s in scored]
    lines += ["", f"{'regime':10} {'rows':>4} {'mean |err|':>10} {'worst':>7}  worst row"]
    lines += [f"{g:10} {n:4d} {mean:10.1%} {worst:7.1%}  {row}" for g, n, mean, worst, row in summary(scored)]
    lines += ["", f"{'family (trend with scale)':34} {'GPUs':>11} {'measured':>9} {'predicted':>9}  sign"]
    lines += [f"{f:34} {a:5d}-{b:<5d} {m:+9.1%} {p:+9.1%}  {'right' if ok else 'WRONG'}"
              for f, a, b, m, p, ok in trends(scored)]
    right = sum(ok for *_, ok in trends(scored))
    lines.append(f"trend sign right in {right} of {len(trends(scored))} families")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Predict every blind row through the CLI, print the score, optionally write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=BLIND_CSV, help="the blind set")
    parser.add_argument("--apart", action="append", default=[], metavar="PREFIX",
                        help="score rows whose name starts with PREFIX apart (no longer blind); repeatable")
    parser.add_argument("--json", type=Path, help="also write every scored row and the summary here")
    args = parser.parse_args(argv)
    rows = load_rows(args.csv)
    with tempfile.TemporaryDirectory() as tmp:
        scored = [score_row(row, cli_predict(row, Path(tmp))) for row in rows]
    apart = tuple(args.apart)
    print(report(scored, apart))
    if args.json:
        blind = [s for s in scored if not (apart and s.name.startswith(apart))]
        args.json.write_text(json.dumps({"rows": [asdict(s) | {"error": s.error} for s in scored], "apart": apart,
                                         "summary": summary(blind), "trends": trends(blind)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
