"""The fleet soak (bench/soak.py --jobs N): several soaked jobs at once, faults striking random jobs' ranks.

Each job is a `musubi train` launch of its own (OUT/job{i}/run, its own torchrun, its own port), all of
the same job file, started together. Faults come one at a time across the fleet: each strikes `gap_s`
seconds after the previous one struck (the fleet trains on while a job recovers), on the job the seeded
schedule names, once that job trains (a job still recovering is waited for; the others keep training). At
the end every struck job is given time to train again, then every job is stopped. bench/soak.py analyses
each job as it does a single soak and sums them up (soak.fleet_result).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench import soak_records as rec
from bench.soak_job import RECOVER_TIMEOUT_S, Console, Soak


class Fleet:
    """Drives N soaked jobs: launches them, strikes the faults, lets them recover, stops them."""

    def __init__(self, args: argparse.Namespace, job_file: Path, out: Path, jobs: int) -> None:
        self.out = out
        self.soaks: list[Soak] = []
        for i in range(jobs):
            (out / f"job{i}").mkdir(parents=True, exist_ok=True)
            self.soaks.append(Soak(args, job_file, out / f"job{i}", name=f"job{i}"))
        self.console = Console(out / "soak.log")  # the fleet's own

    def wait_for(self, until: float, cond: Any) -> Any:
        """Poll every job's commits until `cond()` is truthy or the clock passes `until`; its value or None (also
        when a job ended on its own: a failure the analysis reports)."""
        while time.time() < until:
            for s in self.soaks:
                s.poll_commits()
            got = cond()
            if got:
                return got
            if any(s.proc is not None and s.proc.poll() is not None for s in self.soaks):
                return None
            time.sleep(0.1)
        return None

    def run(self, faults: list[dict[str, Any]], wall_s: float) -> list[dict[str, Any]]:
        """The soak; per job: its t0, t_end, its faults and its exit code if it ended on its own."""
        t0 = time.time()
        for s in self.soaks:
            s.launch(resume=False)
        self.console.say(f"launched {len(self.soaks)} jobs of {self.soaks[0].args.nprocs} {self.soaks[0].args.device} rank(s); "
                 f"{len(faults)} fault(s) scheduled over {wall_s:.0f} s")
        end = t0 + wall_s
        struck: dict[int, str | None] = {i: None for i in range(len(self.soaks))}  # job -> attempt struck last
        done: list[dict[str, Any]] = []
        last = t0
        for f in faults:
            j = f["job"]
            s = self.soaks[j]
            a = self.wait_for(end, lambda s=s, j=j: s.training(struck[j]))
            if a is None:
                break
            struck[j] = None  # it trains again: recovered
            self.wait_for(min(end, max(last, a.train_start or last) + f["gap_s"]), lambda: False)
            a = s.training(None)
            if a is None or time.time() >= end:
                break
            f["t"] = s.strike(f, a)
            done.append(f)
            if f["t"] is None:
                f["error"] = "the fault never struck"
                self.console.say(f"fault {f['n']} {f['kind']} on job{j}: never struck")
                break
            f["t_s"] = round(f["t"] - t0, 2)
            last = f["t"]
            self.console.say(f"fault {f['n']}: {f['kind']} on job{j} (rank {f['rank']}) at {f['t_s']} s, attempt {a.id}")
            if f["kind"] in rec.RESTARTING:
                struck[j] = a.id
        # Every struck job trains again before the end (its recovery is measured whole), within the usual bound.
        for j, attempt in struck.items():
            if attempt is not None:
                s = self.soaks[j]
                if self.wait_for(max(end, time.time() + RECOVER_TIMEOUT_S),
                                 lambda s=s, at=attempt: s.training(at)) is None:
                    [f for f in done if f["job"] == j][-1]["error"] = "not recovered: the job did not train again"
        asked = self.soaks[0].args.faults
        if asked and len(done) == asked and not any("error" in f for f in done):
            end = time.time()  # every fault asked for struck and was recovered: nothing left to wait for
        self.wait_for(end, lambda: False)
        runs = []
        for j, s in enumerate(self.soaks):
            exited = s.proc.poll() if s.proc is not None else None
            t_end = s.stop()
            s.poll_commits()
            runs.append({"t0": t0, "t_end": t_end, "faults": [f for f in done if f["job"] == j], "job_exit": exited})
        self.console.say(f"stopped after {time.time() - t0:.0f} s")
        return runs
