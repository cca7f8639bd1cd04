"""One quality report from the runs of several calls (bench/quality.py): a device call lasts <= 10 minutes, the
bench's runs may not, so a call finishes what an earlier one left (`bench/quality.py --finish A.json`) and the
calls' result files are merged into one report (JSON, table, plot) with the verdicts over all their seeds:

    python bench/quality.py merge A.json B.json [--out-dir bench/results]

Only like with like: the files must have trained the same recipes (every field that decides the training; the
planning figures and labels may differ), on the same data, device and card kind (the GPU's name; the count and
the driver may differ), with the same --max-steps. A run may be finished in one file only (one measurement a
run); a run cut or not started in one file and finished in another is taken from the one that finished it.
Anything else is refused with one line naming the file and what differs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench import quality_report
from bench.quality_plan import plan_runs
from bench.quality_recipes import training_fields

REPO = Path(__file__).resolve().parents[1]


class MergeRefused(ValueError):
    """Result files that cannot be judged together; the message names the file and what differs."""


def card_kind(card: str) -> str:
    """'2x NVIDIA H200, driver 580.159.04' -> 'NVIDIA H200': the card, not how many or which driver."""
    return re.sub(r"^\d+x\s*", "", card.split(", driver")[0]).strip()


def load(path: Path) -> dict[str, Any]:
    """A quality result file (refused: unreadable, or not this bench's)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MergeRefused(f"{path}: cannot read it as a result file ({type(e).__name__}: {e})") from e
    if not isinstance(result, dict) or result.get("bench") != "quality" or "records" not in result:
        raise MergeRefused(f"{path}: not a bench/quality.py result file (no 'bench': 'quality' and records)")
    return result


def check(results: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse files that did not train alike: device, card kind, data, --max-steps, or a shared model's recipe."""
    (first_name, first), rest = results[0], results[1:]
    for name, result in rest:
        for what, mine, theirs in (("device", first.get("device"), result.get("device")),
                                   ("card", card_kind(first.get("card", "")), card_kind(result.get("card", ""))),
                                   ("max_steps", first.get("max_steps"), result.get("max_steps"))):
            if mine != theirs:
                raise MergeRefused(f"{name}: {what} {theirs!r}, {first_name} has {mine!r}: runs of different "
                                   f"{what}s are not compared; merge files of one {what}")
        a, b = first.get("data", {}), result.get("data", {})
        if a != b:
            keys = sorted(k for k in set(a.get("params", {})) | set(b.get("params", {}))
                          if a.get("params", {}).get(k) != b.get("params", {}).get(k)) or ["the sets' contents"]
            raise MergeRefused(f"{name}: its data differ from {first_name}'s ({', '.join(keys)}): runs on "
                               "different data are not compared; rerun at the same --data-scale")
        for model in sorted(set(first["recipes"]) & set(result["recipes"])):
            x, y = training_fields(first["recipes"][model]), training_fields(result["recipes"][model])
            if x != y:
                diff = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                raise MergeRefused(f"{name}: recipe {model!r} differs from {first_name}'s in {', '.join(diff)}: "
                                   "runs of different recipes are not compared; rerun with the same recipe")


def merge(results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The merged result: every run once (the finished measurement where one file has it), the rows and
    verdicts over all of them, the LR check against the merged plain runs, and where each run came from."""
    if len(results) < 2:
        raise MergeRefused("merge needs two result files or more")
    check(results)
    recipes: dict[str, dict[str, Any]] = {}
    for _, result in results:
        recipes.update({k: v for k, v in result["recipes"].items() if k not in recipes})
    records: dict[str, dict[str, Any]] = {}
    for name, result in results:
        for rec in result["records"]:
            prev = records.get(rec["name"])
            if prev is not None and prev["status"] == "ok" and rec["status"] == "ok":
                raise MergeRefused(f"{rec['name']} finished in both {prev['call']} and {name}: a merge keeps one "
                                   "measurement a run; leave one of the files out")
            if prev is None or prev["status"] != "ok":
                records[rec["name"]] = {**rec, "call": Path(name).name}
    seeds = sorted({s for _, r in results for s in r["seeds"]})
    nprocs = sorted({n for _, r in results for n in r["nprocs"]})
    order = [run.name for run in plan_runs(list(recipes), seeds, nprocs)]
    ordered = [records[n] for n in order if n in records] + [r for n, r in records.items() if n not in order]
    plain_logs = {(r["model"], r["seed"]): r.get("log") for r in ordered if r["side"] == "plain" and r["status"] == "ok"}
    for rec in ordered:
        if rec["side"] == "musubi" and "lr" in rec:
            recipe = recipes[rec["model"]]
            rec["lr_check"] = quality_report.lr_check(rec, recipe["lr"], recipe["global_batch"],
                                                      plain_logs.get((rec["model"], rec["seed"])))
    rows = quality_report.summarise(ordered, recipes, nprocs)
    first = results[0][1]
    commits = list(dict.fromkeys(r["commit"] for _, r in results))
    return {"bench": "quality", "commit": "+".join(commits), "card": first["card"],
            "versions": "; ".join(dict.fromkeys(str(r.get("versions")) for _, r in results)),
            "command": [r["command"] for _, r in results], "device": first["device"], "nprocs": nprocs,
            "seeds": seeds, "runs_per_device": [r.get("runs_per_device") for _, r in results],
            "wall_s": round(sum(r.get("wall_s") or 0.0 for _, r in results), 1), "budget_s": None,
            "max_steps": first.get("max_steps"), "data": first["data"], "recipes": recipes, "rows": rows,
            "verdicts": quality_report.model_verdicts(rows), "records": ordered,
            "merged_from": [{"file": name, "commit": r["commit"], "command": r["command"], "wall_s": r.get("wall_s"),
                             "finished": sum(x["status"] == "ok" for x in r["records"])} for name, r in results]}


def stem_of(names: list[str], merged: dict[str, Any]) -> str:
    """quality-DATE-CARD-COMMIT+COMMIT-merged: the latest date and the card tag of the inputs' names."""
    found = [m for n in names if (m := re.match(r"quality-(\d{4}-\d{2}-\d{2})-([^-]+)-", Path(n).name))]
    date = max((m.group(1) for m in found), default="undated")
    tag = found[0].group(2) if found else "merged"
    return f"quality-{date}-{tag}-{merged['commit'].replace('+dirty', '-dirty')}-merged"


def write(results: list[tuple[str, dict[str, Any]]], out_dir: Path) -> tuple[dict[str, Any], list[Path], str]:
    """Merge and write the merged report's three files; (the merged result, their paths, the table's text)."""
    merged = merge(results)
    word = "GPUs" if merged["device"] == "cuda" else "CPU ranks"
    calls = "; ".join(f"`{m['command']}` ({m['finished']} runs finished, {m['wall_s']:.0f} s)"
                      for m in merged["merged_from"])
    head = (f"Quality parity, {merged['card']}, commits {merged['commit']}, merged from {len(results)} calls: "
            f"{calls} ({len(merged['seeds'])} seeds)\n\n")
    paths = quality_report.write_files(merged, out_dir, stem_of([n for n, _ in results], merged), head, word)
    return merged, paths, head + quality_report.markdown(merged["rows"], word)


def passed(result: dict[str, Any]) -> bool:
    """Every Musubi row judged PASS (a report's exit status)."""
    judged = [r for r in result["rows"] if r["side"] == "musubi"]
    return bool(judged) and all(r["verdict"] == "PASS" for r in judged)


def main(argv: list[str] | None = None) -> int:
    """`bench/quality.py merge A.json B.json ...`: the merged report; exit 0 when every Musubi arm passes, 1
    when one does not, 2 when the files are refused."""
    ap = argparse.ArgumentParser(prog="bench/quality.py merge", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="result JSON files of bench/quality.py calls")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    a = ap.parse_args(argv)
    try:
        merged, paths, text = write([(str(p), load(p)) for p in a.files], a.out_dir)
    except MergeRefused as e:
        print(f"merge refused: {e}", file=sys.stderr)
        return 2
    print(text + f"\nwrote {', '.join(str(p) for p in paths)}", flush=True)
    return 0 if passed(merged) else 1
