"""bench/quality.py's judgement and report: the verdict per model and GPU count, the markdown table, the plot.

Pure (no torch, no musubi; matplotlib only for the plot): it reads the run records bench/quality.py collects,
one per training run: {"model", "side" ("plain" | "musubi"), "nproc", "seed", "status", "final": {metric: v},
"log": [{"step", "loss", "lr"}], ...}.

The verdict (issue 43), per model and Musubi GPU count, over the seeds both sides finished:
- within 1 point: |Musubi's mean - the plain loop's mean| <= 0.01 of top1 / mAP50;
- within the spread: Musubi's mean over seeds lies inside the plain loop's seed-to-seed range [min, max]
  (where the plain loop's own seeds differ by more than a point, a point is finer than the bench can see);
- PASS when either holds, FAIL when neither does, and "too few seeds" below MIN_SEEDS (no verdict).
A model's verdict is PASS when every Musubi GPU count passes. The plain loop's own mean must reach the
model's floor (top1 0.9, mAP50 0.3), else the comparison is of models that did not learn, and the table
says so; its seed spread (max - min) says whether the recipe has converged far enough to compare.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Seeds a side needs before a verdict is given (issue 43: ">= 3 seeds each").
MIN_SEEDS = 3
#: "Within 1 point" of top1 / mAP50 (fractions in [0, 1]).
TOLERANCE = 0.01


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def verdict(plain: Sequence[float], musubi: Sequence[float], tol: float = TOLERANCE,
            min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """Musubi's final metrics against the plain loop's (one value a seed each): the figures and the verdict."""
    if not plain or not musubi:
        return {"verdict": "no runs", "within_spread": None, "within_1pt": None}
    pm, psd = mean_sd(plain)
    mm, msd = mean_sd(musubi)
    spread = min(plain) <= mm <= max(plain)
    close = abs(mm - pm) <= tol
    if min(len(plain), len(musubi)) < min_seeds:
        word = "too few seeds"
    else:
        word = "PASS" if spread or close else "FAIL"
    return {"plain_mean": pm, "plain_sd": psd, "plain_min": min(plain), "plain_max": max(plain),
            "mean": mm, "sd": msd, "delta": mm - pm, "within_spread": spread, "within_1pt": close,
            "seeds": [len(plain), len(musubi)], "verdict": word}


def finished(records: list[dict[str, Any]], model: str, side: str, nproc: int, metric: str) -> dict[int, float]:
    """seed -> final metric of the runs of (model, side, nproc) that ended with a validation."""
    return {r["seed"]: r["final"][metric] for r in records
            if r["model"] == model and r["side"] == side and r["nproc"] == nproc and r["status"] == "ok"
            and metric in r.get("final", {})}


def summarise(records: list[dict[str, Any]], models: dict[str, dict[str, Any]], nprocs: Sequence[int]
              ) -> list[dict[str, Any]]:
    """One row per model and configuration (the plain loop, then Musubi at each GPU count), verdicts on Musubi's."""
    rows = []
    for key, m in models.items():
        metric = m["metric"]
        plain = finished(records, key, "plain", 1, metric)
        configs = [("plain", 1)] + [("musubi", n) for n in nprocs]
        for side, n in configs:
            got = finished(records, key, side, n, metric)
            runs = [r for r in records if r["model"] == key and r["side"] == side and r["nproc"] == n]
            row = {"model": key, "label": m["label"], "metric": metric, "side": side, "nproc": n,
                   "per_seed": dict(sorted(got.items())), "runs": len(runs),
                   "not_ok": sorted(f"seed {r['seed']}: {r['status']}" for r in runs if r["status"] != "ok"),
                   "final_loss": _mean_last_loss(runs),
                   "wall_s": round(statistics.fmean(r["wall_s"] for r in runs), 1) if runs else None}
            if got:
                row["mean"], row["sd"] = mean_sd(list(got.values()))
                row["min"], row["max"] = min(got.values()), max(got.values())
            if side == "plain":
                row["reaches_floor"] = bool(got) and row["mean"] >= m["floor"]
                row["floor"] = m["floor"]
            else:
                common = sorted(set(plain) & set(got))
                row.update(verdict([plain[s] for s in common], [got[s] for s in common]))
                row["paired_delta"] = mean_sd([got[s] - plain[s] for s in common]) if common else None
            rows.append(row)
    return rows


def _mean_last_loss(runs: list[dict[str, Any]]) -> float | None:
    last = [r["log"][-1]["loss"] for r in runs if r.get("log")]
    return round(statistics.fmean(last), 4) if last else None


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def arm(nproc: int, device_word: str) -> str:
    """A Musubi configuration's name: "Musubi 1 GPU", "Musubi 2 GPUs" (device_word is the plural)."""
    return f"Musubi {nproc} {device_word if nproc > 1 else device_word.removesuffix('s')}"


def model_verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """model -> PASS (every Musubi GPU count passes), FAIL (one fails), or the first other word (too few seeds,
    no runs); a plain loop below its floor is said after it."""
    out = {}
    for key in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == key]
        words = [r["verdict"] for r in mine if r["side"] == "musubi"]
        word = ("FAIL" if "FAIL" in words else "PASS" if words and all(w == "PASS" for w in words)
                else next((w for w in words if w != "PASS"), "no runs"))
        plain = next(r for r in mine if r["side"] == "plain")
        if not plain["reaches_floor"]:
            word += f" (the plain loop is below its floor {plain['floor']})"
        out[key] = word
    return out


def markdown(rows: list[dict[str, Any]], device_word: str) -> str:
    """The tables for BENCHMARKS.md: one per model, a line per configuration (the plain loop, Musubi at each
    GPU count) with every seed's final metric, mean ± sample sd, [min, max], and the verdict; then the model's
    verdict."""
    out = []
    verdicts = model_verdicts(rows)
    for key, word in verdicts.items():
        mine = [r for r in rows if r["model"] == key]
        out += [f"**{mine[0]['label']}** ({mine[0]['metric']}): **{word}**", "",
                "| run | per seed | mean ± sd | [min, max] | Δ mean vs plain | within 1 pt | in plain's range | "
                "verdict | last logged loss | run s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            run = "plain loop" if r["side"] == "plain" else arm(r["nproc"], device_word)
            seeds = ", ".join(f"{v:.3f}" for v in r["per_seed"].values()) or "-"
            if r["not_ok"]:
                seeds += f" ({'; '.join(r['not_ok'])})"
            spread = f"{_fmt(r.get('mean'))} ± {_fmt(r.get('sd'))}" if "mean" in r else "-"
            bounds = f"[{_fmt(r['min'])}, {_fmt(r['max'])}]" if "min" in r else "-"
            if r["side"] == "plain":
                floor = "reaches" if r["reaches_floor"] else "BELOW"
                cells = ["-", "-", "-", f"{floor} floor {r['floor']}"]
            else:
                yes = {True: "yes", False: "no", None: "-"}
                cells = [f"{r['delta']:+.3f}" if "delta" in r else "-", yes[r["within_1pt"]],
                         yes[r["within_spread"]], r["verdict"]]
            out.append(f"| {run} | {seeds} | {spread} | {bounds} | " + " | ".join(cells)
                       + f" | {_fmt(r['final_loss'], 4)} | {_fmt(r['wall_s'], 0)} |")
        out.append("")
    return "\n".join(out)


def mean_curve(runs: list[dict[str, Any]], series: str = "log", value: str = "loss"
               ) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps every run logged in `series` ("log": training lines, "evals": validations), and `value`'s mean,
    min and max over the runs at each."""
    logs = [{p["step"]: p[value] for p in r[series] if value in p} for r in runs if r.get(series)]
    if not logs:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(lg) for lg in logs)))
    vals = [[lg[s] for lg in logs] for s in steps]
    return steps, [statistics.fmean(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals]


def plot(records: list[dict[str, Any]], models: dict[str, dict[str, Any]], nprocs: Sequence[int], path: Path,
         title: str, device_word: str) -> None:
    """A PNG, a row per model: the training loss and the validation metric against samples seen (mean over
    seeds, band min..max) of each configuration side by side, and every seed's final metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    configs = [("plain", 1, "plain loop", "black")] + [
        ("musubi", n, arm(n, device_word), c) for n, c in zip(nprocs, colours, strict=False)]
    fig, axes = plt.subplots(len(models), 3, figsize=(14, 3.3 * len(models)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 3, 1.2]})
    for row, (key, m) in enumerate(models.items()):
        loss_ax, metric_ax, dots = axes[row]
        batch = m["global_batch"]
        for x, (side, n, label, colour) in enumerate(configs):
            runs = [r for r in records if r["model"] == key and r["side"] == side and r["nproc"] == n]
            for ax, series, value in ((loss_ax, "log", "loss"), (metric_ax, "evals", m["metric"])):
                steps, mean, lo, hi = mean_curve(runs, series, value)
                if steps:
                    samples = [s * batch for s in steps]
                    ax.plot(samples, mean, color=colour, label=f"{label} ({len(runs)} seeds)", lw=1.4, marker=".",
                            ms=4 if series == "evals" else 3)
                    ax.fill_between(samples, lo, hi, color=colour, alpha=0.15, lw=0)
            got = finished(records, key, side, n, m["metric"])
            dots.scatter([x] * len(got), list(got.values()), color=colour, s=18)
            if got:
                dots.hlines(statistics.fmean(got.values()), x - 0.3, x + 0.3, color=colour)
        loss_ax.set_title(f"{m['label']}: training loss", fontsize=9)
        metric_ax.set_title(f"validation {m['metric']}", fontsize=9)
        for ax in (loss_ax, metric_ax):
            ax.set_xlabel(f"samples seen (global batch {batch})", fontsize=8)
            ax.legend(fontsize=7)
        dots.set_title(f"final {m['metric']} by seed", fontsize=9)
        dots.set_xticks(range(len(configs)), ["plain"] + [f"Musubi\n{n}" for _, n, _, _ in configs[1:]], fontsize=7)
        dots.set_xlim(-0.6, len(configs) - 0.4)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lr_check(rec: dict[str, Any], lr: float, global_batch: int, plain_log: list[dict[str, Any]] | None
             ) -> dict[str, Any]:
    """Whether a Musubi run used the recipe's LR and global batch, and its logged LR curve the plain loop's
    (max relative difference over the steps both logged)."""
    out = {"lr_as_written": rec.get("lr") is not None and abs(rec["lr"] - lr) <= 1e-12 * lr,
           "global_batch_equal": rec.get("global_batch") == global_batch}
    if plain_log:
        ref = {p["step"]: p["lr"] for p in plain_log}
        diffs = [abs(p["lr"] - ref[p["step"]]) / lr for p in rec.get("log", []) if p["step"] in ref]
        out["lr_curve_max_rel_diff"] = max(diffs) if diffs else None
    return out


def write_files(result: dict[str, Any], out_dir: Path, stem: str, head: str, device_word: str) -> list[Path]:
    """A result's three files in `out_dir`: STEM.json (all of it), STEM.md (`head`, then the tables) and
    STEM.png (the curves and every seed's final metric)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths[1].write_text(head + markdown(result["rows"], device_word))
    plot(result["records"], result["recipes"], result["nprocs"], paths[2],
         f"quality parity, {result['card']}, {result['commit']}", device_word)
    return paths
