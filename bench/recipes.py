"""Every shipped recipe as shipped: run it, read the score it reached and time it; the floors table.

    python bench/recipes.py [NAME ...] [--device cpu|cuda] [--out DIR] [--json FILE]

NAME: any of RECIPES below (default: those of --device's kind: the CPU recipes on 2 CPU ranks, or the GPU
ones on every visible GPU). Each runs from a fresh folder under --out (default: a new /tmp folder) with
`musubi train` / `musubi run` exactly as a user would (the quickstart: the guide's own bash blocks), and
prints one row a recipe: metric reached, wall time of the command (start-up, preflight, validation and
export included), load average before and after (a shared machine's timings are only as good as its
load). Exit 0 when every recipe reached its floor (tests/recipes/floors.py holds the CPU ones in the suite).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Recipe:
    """One shipped recipe: the command that runs it, the kind of machine it names and the score it is held to."""

    argv: tuple[str, ...]  # after `musubi`; "{out}" is the run directory
    kind: str  # cpu | cuda
    metric: str  # read from eval.json (a job), the leaderboard's worst row (a fleet), or "samples_per_s"
    floor: float


RECIPES: dict[str, Recipe] = {
    "classify-synthetic": Recipe(("train", "examples/classify-synthetic.yaml", "--out", "{out}"), "cpu", "top1", 0.9),
    "quickstart": Recipe(("quickstart",), "cpu", "top1", 0.95),
    "own-model": Recipe(("train", "examples/own_model/job.yaml", "--out", "{out}"), "cpu", "acc", 0.9),
    "detect-synthetic": Recipe(("train", "examples/detect-synthetic.yaml", "--out", "{out}"), "cpu", "map50", 0.15),
    "lm-fsdp": Recipe(("train", "examples/lm-fsdp.yaml", "--out", "{out}"), "cpu", "val_acc", 0.5),
    "fleet-demo": Recipe(("run", "examples/fleet-demo.yaml", "--out", "{out}"), "cpu", "map50", 0.1),
    "detect-efficientdet": Recipe(("train", "examples/detect-efficientdet.yaml", "--out", "{out}"), "cuda", "map50",
                                  0.3),
    "detect-rtdetr": Recipe(("train", "examples/detect-rtdetr.yaml", "--out", "{out}"), "cuda", "map50", 0.3),
    "resnet50-bench": Recipe(("train", "examples/resnet50-bench.yaml", "--out", "{out}", "--max-steps", "200"),
                             "cuda", "samples_per_s", 0.0),
    "fcos-bench": Recipe(("train", "examples/fcos-bench.yaml", "--out", "{out}", "--max-steps", "200"), "cuda",
                         "samples_per_s", 0.0),
}


def guide_block(marker: str) -> str:
    """The bash block after `<!-- marker -->` in docs/guides/quickstart.md."""
    text = (REPO / "docs" / "guides" / "quickstart.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```", text, re.S)
    if not m:
        raise SystemExit(f"docs/guides/quickstart.md has no {marker} block")
    return m.group(1)


def quickstart_script() -> str:
    """The guide's data block, then its training block: what a reader without images runs."""
    return guide_block("quickstart-data") + "\n" + guide_block("quickstart")


def newcomer_env(work: Path) -> dict[str, str]:
    """`musubi` and `python` as a newcomer's activated venv has them (this checkout first on the path), in work/bin."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "musubi").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m musubi.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run_quickstart(work: Path, log) -> float | None:
    """The guide's data and training blocks in `work`, with this checkout's musubi first on the path."""
    env, script = newcomer_env(work), quickstart_script()
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, stdout=log,
                   stderr=subprocess.STDOUT, check=False)
    m = re.search(r"top1: ([\d.]+)", (work / "console.log").read_text())
    return float(m.group(1)) if m else None


def score(recipe: Recipe, run_dir: Path) -> float | None:
    """The recipe's metric from its run directory (a fleet: its worst task job's, the floor every job holds)."""
    if recipe.metric == "samples_per_s":
        rates = [json.loads(line).get("samples_per_s") for p in run_dir.glob("*/metrics.jsonl")
                 for line in p.read_text().splitlines() if '"kind": "train"' in line]
        rates = [r for r in rates if r][2:]  # past the first records (warm-up)
        return sorted(rates)[len(rates) // 2] if rates else None
    if recipe.argv[0] == "run":
        rows = json.loads((run_dir / "leaderboard.json").read_text()).get("rows", [])
        values = [r.get("metrics", {}).get(recipe.metric) for r in rows]
        values = [v for v in values if isinstance(v, (int, float))]
        return min(values) if values else None
    evals = list(run_dir.glob("*/eval.json"))
    return json.loads(evals[0].read_text())["metrics"].get(recipe.metric) if evals else None


def main() -> int:
    """Run the recipes named (or those of the device kind), print and optionally save the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"recipes to run, of {', '.join(RECIPES)} (default: all of --device's kind)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a new /tmp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    names = args.names or [n for n, r in RECIPES.items() if r.kind == args.device]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        ap.error(f"unknown recipe(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="musubi-recipes-"))
    rows = []
    for name in names:
        recipe, work = RECIPES[name], out / name
        work.mkdir(parents=True, exist_ok=False)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        with open(work / "console.log", "w") as log:
            if recipe.argv == ("quickstart",):
                value = run_quickstart(work, log)
            else:
                argv = [sys.executable, "-m", "musubi.cli",
                        *(a.replace("{out}", str(work / "run")) for a in recipe.argv), "--device", args.device]
                subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
                value = score(recipe, work / "run")
        row = {"recipe": name, "metric": recipe.metric, "value": value, "floor": recipe.floor,
               "held": value is not None and value >= recipe.floor, "wall_s": round(time.perf_counter() - t0, 1),
               "device": args.device, "load_before": round(load0, 1), "load_after": round(os.getloadavg()[0], 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"\n| recipe | {'metric':8} | reached | floor | wall s | load |")
    for r in rows:
        v = "-" if r["value"] is None else f"{r['value']:.3g}"
        print(f"| {r['recipe']} | {r['metric']} | {v} | {r['floor']} | {r['wall_s']} | {r['load_before']} |")
    return 0 if all(r["held"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
