"""What a fleet benchmark would give before device time is spent on it: the fleet's own packer on history
recorded on the GPU machine.

    python bench/fleet_whatif.py WORK [--fleet bench/fleet-bench.yaml] [--copies 1,2,3] [--ship-s 15.8]

WORK is a `bench/fleet.py --work` folder brought back from the lent machine (its musubi.db and modes.json;
bench/results/fleet-*-store.tgz holds one). The store's history is keyed by machine (host and GPU models),
so the machine is read from the store's newest run, not from this machine. `--copies K` plans K copies of
every job (RGB and thermal variants of each model, say: same durations, other names) and compares with
(a) = K x the jobs' measured seconds alone (modes.json, or --alone JOB=SECONDS), the shipping tail (leaderboard, export, registry)
added to the planned makespan. The plan is `moldable.best_plan`, the function `musubi run` plans with;
durations come from `durations.estimate` and each job's demand from `durations.demand_of`, as in the fleet. A prediction, not a measurement: it says which
fleet is worth a GPU run.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from musubi.config.load import load_fleet  # noqa: E402
from musubi.fleet.durations import demand_of  # noqa: E402
from musubi.fleet.local import estimates  # noqa: E402
from musubi.fleet.moldable import best_plan, lower_bound  # noqa: E402
from musubi.fleet.sharing import share_policy  # noqa: E402


def recorded_machine(db: Path) -> list:
    """The machine part of the newest history row's key (what the GPU machine's runs were recorded under)."""
    con = sqlite3.connect(str(db))
    try:
        row = con.execute("SELECT key FROM job_runs ORDER BY created DESC LIMIT 1").fetchone()
    finally:
        con.close()
    if row is None:
        raise SystemExit(f"{db}: no job history; run bench/fleet.py --work there first")
    return json.loads(row[0])["machine"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="a bench/fleet.py --work folder (musubi.db, modes.json)")
    ap.add_argument("--fleet", type=Path, default=REPO / "bench" / "fleet-bench.yaml")
    ap.add_argument("--copies", default="1,2,3", help="comma-separated: plan this many copies of every job")
    ap.add_argument("--ship-s", type=float, default=15.8,
                    help="seconds after the last job (leaderboard, export, registry); 4x H200 2026-11-27: 15.8")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--gpu-memory-gib", type=float, default=None,
                    help="one GPU's memory: with the fleet's machine.share_gpus auto, measured jobs may share GPUs")
    ap.add_argument("--alone", action="append", default=[], metavar="JOB=SECONDS",
                    help="a job's (a) seconds instead of modes.json's (e.g. one measured unfairly)")
    args = ap.parse_args()
    db, modes = args.work / "musubi.db", json.loads((args.work / "modes.json").read_text())
    alone = dict(modes.get("job_s", {}).get("a", {}))
    for item in args.alone:
        name, _, seconds = item.partition("=")
        try:
            alone[name] = float(seconds)
        except ValueError:
            raise SystemExit(f"--alone {item!r}: write JOB=SECONDS") from None
    spec = load_fleet(args.fleet)
    missing = [j.name for j in spec.jobs if j.name not in alone]
    if missing:
        raise SystemExit(f"modes.json has no (a) seconds for {', '.join(missing)}; measure them with bench/fleet.py")
    machine = recorded_machine(db)
    est = estimates(spec, args.gpus, db, machine, "cuda")
    share = share_policy(spec.machine.share_gpus, "cuda", args.gpu_memory_gib)
    print(f"machine {machine}; per job: " + "; ".join(
        f"{n} {e.source} {dict(zip(e.widths, e.seconds, strict=True))}" for n, e in est.items()))
    for copies in (int(c) for c in args.copies.split(",")):
        # Copy c of a job waits for copy c of the jobs it waits for.
        queue = [replace(demand_of(j, est[j.name], name=f"{j.name}-{c}"), after=tuple(f"{a}-{c}" for a in j.after))
                 for c in range(copies) for j in spec.jobs]
        plan = best_plan(list(range(args.gpus)), queue, share=share)
        total = plan.makespan + args.ship_s
        a = copies * sum(alone[j.name] for j in spec.jobs)
        print(f"{copies} x {len(spec.jobs)} jobs: plan '{plan.how}' {plan.makespan:.0f} s (lower bound "
              f"{lower_bound(queue, args.gpus):.0f} s) + shipping {args.ship_s:.1f} s = {total:.0f} s; (a) {a:.0f} s "
              f"-> {a / total:.2f}x = {a / total / args.gpus:.2f} x {args.gpus} GPUs"
              + (f"; GPUs shared (unshared {plan.unshared:.0f} s)" if plan.share else ""))


if __name__ == "__main__":
    main()
