"""The run checklist: before, during and after training, and the run's own success criteria.

Built from what a run directory already holds (preflight.json, fleet.json, each job's
job.json, metrics.jsonl, memory/ OOM records, telemetry, eval.json, leaderboard.json,
exports, manifest.json), so `musubi checklist RUN` gives the same answer later as the run
gave at its end. Every item is PASS, WARN, FAIL or SKIP (evidence the run cannot have, such
as GPU utilisation on CPU ranks: never counted as met). A FAIL means the run did not meet
its criteria: `musubi run`/`train` then exit 1. A threshold the user did not write (a default of
config/success.py) is measured and shown, but missing it is a WARN; each threshold item says
whose it is (`criterion`: "yours" or "default").
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from musubi.config.success import YOURS, SuccessSpec
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.leaderboard import external_model, nothing_to_ship
from musubi.records import evidence
from musubi.records.learning import Verdict, judge

CHECKLIST_FILE = RUN_FILES.checklist

#: Goodput under this is a warning even without a failure, on a run of LONG_RUN_S or more: half its wall
#: time made no progress.
GOODPUT_WARN = 0.5

#: Wall seconds from which a run without failures is judged on its goodput. Start-up (imports, process group,
#: data, model) takes 20-60 s whatever the run's length, so a shorter run is mostly start-up by nature: its
#: split is stated, not warned about.
LONG_RUN_S = 600.0

#: Why speed criteria are reported but not judged on CPU ranks.
CPU_NOTE = "CPU ranks share this machine's cores: reported, not judged"


def _unit(device: str) -> str:
    """What a job's rank runs on, in words: GPU, or CPU rank."""
    return "GPU" if device == "cuda" else "CPU rank"


def _judged(item: Item, device: str) -> Item:
    """A missed speed criterion fails a GPU run; on CPU ranks it is a warning (see CPU_NOTE)."""
    if item.status == "FAIL" and device == "cpu":
        return Item("during", item.check, "WARN", f"{item.found} ({CPU_NOTE})", item.job, item.criterion)
    return item


def _threshold(check: str, job: str | None, found: str, missed: str | None, success: SuccessSpec, name: str,
               phase: str = "during") -> Item:
    """A threshold item: PASS when met; missed, FAIL when the user wrote `success.<name>`, else a warning."""
    origin = success.origin(name)
    if missed is None:
        return Item(phase, check, "PASS", found, job, origin)
    if origin == YOURS:
        return Item("criteria", check, "FAIL", f"{found} ({missed})", job, origin)
    return Item(phase, check, "WARN", f"{found} ({missed}: a default, not a criterion you wrote; write "
                f"success.{name} to judge it)", job, origin)


@dataclass(frozen=True)
class Item:
    """One line of the checklist."""

    phase: str  # before | during | after | criteria
    check: str
    status: str  # PASS | WARN | FAIL | SKIP
    found: str
    job: str | None = None
    criterion: str | None = None  # a threshold item: "yours" (written in success:) or "default"


@dataclass
class Checklist:
    """Every item of one run, and whether the run met its criteria."""

    run_dir: str
    items: list[Item] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # per job: throughput, speedup, ...
    score: str = ""  # the run's headline result in words ("top1 1 (my-images)"), "" when it has none

    @property
    def ok(self) -> bool:
        """No FAIL item."""
        return not any(i.status == "FAIL" for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(1 for i in self.items if i.status == s) for s in ("PASS", "WARN", "FAIL", "SKIP")}
        return {"ok": self.ok, "counts": counts, "items": [asdict(i) for i in self.items], "figures": self.figures,
                "score": self.score, "run_dir": self.run_dir}


def _losses(records: list[dict[str, Any]]) -> list[float]:
    return [float(r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))]


def _loss_item(job: str, records: list[dict[str, Any]], learned: Verdict) -> Item:
    """The loss finite, and its trend; a trend that is not falling warns only where no validation metric
    judges learning (records/learning.py: a two-stage detector's loss climbs as it gets better)."""
    losses = _losses(records)
    if any(not math.isfinite(v) for v in losses):
        return Item("during", "loss", "FAIL", "a non-finite loss was logged", job)
    if len(losses) < 2:
        return Item("during", "loss", "SKIP", f"{len(losses)} loss record(s): too few to see a trend", job)
    third = max(1, len(losses) // 3)
    first, last = statistics.fmean(losses[:third]), statistics.fmean(losses[-third:])
    if last < first:
        return Item("during", "loss", "PASS", f"finite and falling on rank 0 ({first:.4g} -> {last:.4g})", job)
    if learned.basis == "metric":
        return Item("during", "loss", "PASS", f"finite, not falling on rank 0 ({first:.4g} -> {last:.4g}); "
                    "whether it learned is judged by the validation metric (see 'learned')", job)
    return Item("during", "loss", "WARN", f"finite but not falling on rank 0 ({first:.4g} -> {last:.4g})", job)


def learning_verdict(job_dir: Path, records: list[dict[str, Any]] | None = None) -> Verdict:
    """Whether the job in `job_dir` learned (records/learning.py): by its headline validation metric at its
    validations (eval.json's figure where metrics.jsonl has none), else by rank 0's training loss."""
    metric = evidence.headline_metric(job_dir)
    vals = evidence.val_records(job_dir)
    if metric and not any(metric in r for r in vals):  # validated outside the loop (an external job, evaluate)
        ev = evidence.eval_metrics(job_dir)
        if metric in ev:
            step = (evidence.read_json_or_none(job_dir / RUN_FILES.eval) or {}).get("step")
            vals = [{"step": step if isinstance(step, int) else 0, metric: ev[metric]}]
    train = evidence.train_records(job_dir) if records is None else records
    return judge(metric, vals, _losses(train), evidence.num_classes(job_dir))


def _learned_item(job: str, verdict: Verdict) -> Item:
    status = {True: "PASS", False: "WARN", None: "SKIP"}[verdict.learned]
    return Item("after", "learned", status, verdict.found, job)


def _oom_item(job: str, job_dir: Path, ended_well: bool) -> Item:
    ooms = evidence.oom_records(job_dir)
    if not ooms:
        return Item("during", "oom", "PASS", "no out-of-memory error", job)
    batches = sorted({o.get("per_rank_batch") for o in ooms if o.get("per_rank_batch")}, reverse=True)
    what = f"{len(ooms)} OOM record(s) (per-rank batch {', '.join(map(str, batches)) or '?'})"
    if ended_well:
        return Item("during", "oom", "PASS", f"{what}, recovered: the job finished", job)
    return Item("during", "oom", "FAIL", f"{what}, not recovered", job)


def _ranks_item(job: str, job_dir: Path, nproc: int, ended_well: bool) -> Item:
    steps = evidence.rank_steps(job_dir)
    if steps:
        behind = {r: s for r, s in steps.items() if s < max(steps.values())}
        missing = [r for r in range(nproc) if r not in steps]
        if missing or behind:
            lag = ", ".join(f"rank {r} at step {s}" for r, s in sorted(behind.items()))
            gone = ", ".join(f"rank {r}" for r in missing)
            return Item("during", "ranks", "FAIL", f"not every rank progressed: {'; '.join(x for x in (gone and gone + ' recorded nothing', lag) if x)}", job)
        return Item("during", "ranks", "PASS", f"all {nproc} rank(s) reached step {max(steps.values())} (telemetry)",
                    job)
    if ended_well:
        return Item("during", "ranks", "PASS", f"all {nproc} rank(s) finished (synchronous steps need every rank)",
                    job)
    return Item("during", "ranks", "SKIP", "no per-rank telemetry and the job did not finish", job)


def _restarts_item(job: str, job_dir: Path, ended_well: bool) -> Item | None:
    """Failures the job met (recovered by torchrun restarts or not) and its goodput (JOB/goodput.json)."""
    rec = evidence.read_json_or_none(job_dir / RUN_FILES.goodput)
    if not isinstance(rec, dict):
        return None
    from musubi.recovery.goodput import failure_summary

    g = rec.get("goodput")
    ratio = f"goodput {g:.1%}" if isinstance(g, (int, float)) else "goodput n/a"
    failures = [f for f in rec.get("failures") or [] if isinstance(f, dict)]
    if not failures:
        if not isinstance(g, (int, float)) or g >= GOODPUT_WARN:
            return Item("during", "restarts", "PASS", f"no failure; {ratio}", job)
        wall = float(rec.get("wall_s") or 0.0)
        if wall >= LONG_RUN_S:
            return Item("during", "restarts", "WARN", f"no failure, but {ratio}: {_goodput_split(rec)}", job)
        return Item("during", "restarts", "PASS", f"no failure; {ratio}: {_goodput_split(rec)}; a run under "
                    f"{LONG_RUN_S / 60:.0f} min is mostly start-up by nature (judged on longer runs)", job)
    causes = "; ".join(failure_summary({k: v for k, v in f.items() if k != "detail"}) for f in failures)
    what = (f"{len(failures)} failure(s) ({causes}), {rec.get('lost_steps', 0)} step(s) lost, "
            f"{rec.get('downtime_s', 0):.1f}s down; {ratio}")
    defect = rec.get("defect")
    if isinstance(defect, dict) and defect.get("attempts"):
        # Recovery must not hide a defect: the same cause after a restart fails the job, finished or not.
        return Item("during", "restarts", "FAIL", f"a defect, not a transient fault: the same failure "
                    f"({defect.get('cause')}) struck attempts {', '.join(map(str, defect['attempts']))}; {what}", job)
    if ended_well:
        return Item("during", "restarts", "WARN", f"recovered from {what}", job)
    return Item("during", "restarts", "FAIL", f"not recovered: {what}", job)


def _goodput_split(rec: dict[str, Any]) -> str:
    """Where the wall time of a job without failures went: start-up, training steps, the rest."""
    wall, steps = float(rec.get("wall_s") or 0.0), float(rec.get("productive_s") or 0.0)
    if not isinstance(rec.get("startup_s"), (int, float)):  # goodput.json of an older musubi
        return f"{steps:.1f}s of {wall:.1f}s wall in training steps"
    start = float(rec["startup_s"])
    share = f" ({start / wall:.0%})" if wall > 0 else ""
    return (f"of {wall:.1f}s wall, {start:.1f}s{share} start-up before the first step (imports, process group, data, "
            f"model), {steps:.1f}s training steps, {max(0.0, wall - start - steps):.1f}s after them (validation, "
            "checkpoint, exit)")


def _throughput_items(job: str, job_dir: Path, records: list[dict[str, Any]], success: SuccessSpec,
                      figures: dict[str, Any]) -> list[Item]:
    rate = evidence.median_rate(records)
    if rate is None:
        return [Item("during", "throughput", "SKIP", "fewer than 2 training log records", job)]
    figures["samples_per_s"] = round(rate, 3)
    earlier = evidence.earlier_rates(job_dir)
    if not earlier:
        return [Item("during", "throughput", "SKIP",
                     f"{rate:.1f} samples/s; no earlier run of this job on this machine to compare with", job)]
    ref = statistics.median(earlier)
    change = rate / ref - 1
    figures["throughput_change"] = round(change, 4)
    found = f"{rate:.1f} samples/s, {change:+.1%} against the median of {len(earlier)} earlier run(s) ({ref:.1f})"
    tol = success.max_throughput_drop
    if tol is None:
        return [Item("during", "throughput", "PASS", found, job)]
    return [_threshold("throughput", job, found, f"a regression beyond {tol:.0%}" if change < -tol else None,
                       success, "max_throughput_drop")]


def _telemetry_items(job: str, job_dir: Path, success: SuccessSpec, figures: dict[str, Any],
                     device: str = "cuda") -> list[Item]:
    out: list[Item] = []
    util = evidence.gpu_utilisation(job_dir)
    if util is None:
        why = "CPU ranks: no GPU to sample" if device == "cpu" else "no GPU utilisation samples (no NVML)"
        out.append(Item("during", "gpu_util", "SKIP", why, job, success.origin("min_gpu_util")))
    else:
        figures["gpu_util"] = {str(k): round(v, 3) for k, v in util.items()}
        low = {g: u for g, u in util.items() if success.min_gpu_util is not None and u < success.min_gpu_util}
        found = ", ".join(f"GPU {g} {u:.0%}" for g, u in sorted(util.items()))
        out.append(_threshold("gpu_util", job, f"after warm-up: {found}",
                              f"below {success.min_gpu_util:.0%}" if low else None, success, "min_gpu_util"))
    wait = evidence.data_wait_share(job_dir)
    if wait is None:
        out.append(Item("during", "data_wait", "SKIP", "no per-step data-wait spans recorded", job,
                        success.origin("max_data_wait")))
    else:
        figures["data_wait"] = round(wait, 4)
        bad = success.max_data_wait is not None and wait > success.max_data_wait
        out.append(_threshold("data_wait", job, f"{wait:.1%} of step time waiting for data",
                              f"above {success.max_data_wait:.0%}" if bad else None, success, "max_data_wait"))
    return out


def _speedup_items(job: str, job_dir: Path, gpus: int, success: SuccessSpec, figures: dict[str, Any],
                   device: str = "cuda") -> list[Item]:
    if gpus < 2:
        return []
    base = evidence.baseline(job_dir)
    rate = figures.get("samples_per_s")
    wanted = success.min_speedup is not None or success.min_scaling_efficiency is not None
    if base is None or rate is None:
        if wanted:
            return [Item("criteria", "speedup", "SKIP", f"not measured: no single-{_unit(device)} baseline "
                         "(success.baseline_steps is 0 or the baseline failed)", job, YOURS)]
        return []
    speedup = rate / base["samples_per_s"]
    eff = speedup / gpus
    figures.update(speedup=round(speedup, 3), scaling_efficiency=round(eff, 3))
    found = (f"{speedup:.2f}x over one {_unit(device)} ({base['samples_per_s']:.1f} samples/s), {eff:.0%} scaling "
             f"efficiency on {gpus} {_unit(device)}s")
    miss = []
    if success.min_speedup and speedup < success.min_speedup:
        miss.append(f"speedup below {success.min_speedup}")
    if success.min_scaling_efficiency and eff < success.min_scaling_efficiency:
        miss.append(f"efficiency below {success.min_scaling_efficiency:.0%}")
    # Both have no default: a speed-up criterion is always one the user wrote.
    return [Item("criteria", "speedup", "FAIL" if miss else "PASS", found + (f" ({'; '.join(miss)})" if miss else ""),
                 job, YOURS if wanted else None)]


def job_items(name: str, job_dir: Path, state: str, gpus: int, kind: str, success: SuccessSpec,
              figures: dict[str, Any], device: str = "cuda", in_fleet: bool = True) -> list[Item]:
    """Every item of one job (task jobs have training evidence; external ones only their results)."""
    ended_well = state in ("done", "stopped")
    items: list[Item] = []
    if state == "stopped":
        items.append(Item("during", "finished", "WARN", "stopped by --max-steps before its last step (--resume "
                          "finishes it)", name))
    elif not ended_well:
        items.append(Item("during", "finished", "FAIL", f"the job ended {state}", name))
    if kind == "task":
        records = evidence.train_records(job_dir)
        learned = learning_verdict(job_dir, records)
        items.append(_loss_item(name, records, learned))
        items.append(_oom_item(name, job_dir, ended_well))
        fallbacks = evidence.precision_fallbacks(job_dir)
        if fallbacks:
            what = "; ".join(f"{f.get('from')} -> {f.get('to')} after a non-finite loss at step {f.get('step')} "
                             f"(rolled back to step <= {f.get('last_good_step')})" for f in fallbacks)
            items.append(Item("during", "numerics", "WARN", f"{len(fallbacks)} precision fallback(s): {what}", name))
        else:
            items.append(Item("during", "numerics", "PASS", "no non-finite loss", name))
        items.append(_ranks_item(name, job_dir, gpus, ended_well))
        restarts = _restarts_item(name, job_dir, ended_well)
        if restarts is not None:
            items.append(restarts)
        speed = (_throughput_items(name, job_dir, records, success, figures)
                 + _telemetry_items(name, job_dir, success, figures, device)
                 + _speedup_items(name, job_dir, gpus, success, figures, device))
        items += [_judged(i, device) for i in speed]
    if ended_well:
        ev = evidence.eval_metrics(job_dir)
        if ev:
            items.append(Item("after", "eval", "PASS",
                              f"eval.json: {', '.join(f'{k} {v:.4g}' for k, v in list(ev.items())[:3])}", name))
        else:
            items.append(_no_metrics_item(name, job_dir, in_fleet))
        verdict = learned if kind == "task" else learning_verdict(job_dir, [])
        if verdict.learned is not None or kind == "task":
            items.append(_learned_item(name, verdict))
    return items


def _no_metrics_item(job: str, job_dir: Path, in_fleet: bool) -> Item:
    """A job that ended well without metrics, described as its files are (eval.json there or not,
    a validation split configured or not)."""
    found = ("eval.json has no metrics" if (job_dir / RUN_FILES.eval).is_file() else "no eval.json")
    has_val = evidence.has_validation_split(job_dir)
    why = {True: "although the job has a validation split", False: "the job has no validation split",
           None: "the job reported none"}[has_val]
    if in_fleet:  # a fleet ranks its models: every job owes its metrics
        return Item("after", "eval", "FAIL", f"{found} ({why})", job)
    return Item("after", "eval", "WARN" if has_val else "SKIP", f"{found} ({why})", job)


def build_checklist(run_dir: Path, success: SuccessSpec | None = None) -> Checklist:
    """The checklist of a `musubi run` or `musubi train` run directory."""
    run = evidence.read_run(run_dir)
    success = success or run.success
    cl = Checklist(str(run_dir))
    pre = run.preflight
    if pre is None:
        skipped = run.preflight_skipped
        cl.items.append(Item("before", "preflight", "WARN" if skipped else "SKIP",
                             "skipped (--no-check)" if skipped else "no preflight.json"))
    else:
        counts = pre.get("counts", {})
        cl.items.append(Item("before", "preflight", "PASS" if pre.get("ok") else "FAIL",
                             f"{counts.get('PASS', 0)} passed, {counts.get('WARN', 0)} warnings, "
                             f"{counts.get('FAIL', 0)} failed"))
    for job in run.jobs:
        cl.figures[job.name] = {}
        # In a fleet a job's own written criteria (its `success:` or the fleet's `defaults:`) beat the fleet's.
        mine = success.under(job.success) if run.fleet else success
        cl.items += job_items(job.name, job.dir, job.state, job.gpus, job.kind, mine, cl.figures[job.name],
                              job.device, run.fleet)
    failed = [j.name for j in run.jobs if j.state not in ("done", "stopped")]
    # Not softened when defaulted: a job that failed fails the run; max_failures lets the user allow some.
    cl.items.append(Item("criteria", "failures", "FAIL" if len(failed) > success.max_failures else "PASS",
                         f"{len(failed)} job(s) failed{': ' + ', '.join(failed) if failed else ''} "
                         + (f"(allowed: {success.max_failures})" if success.origin("max_failures") == YOURS
                            else "(allowed: 0 by default; success.max_failures allows some)"),
                         None, success.origin("max_failures")))
    cl.score = score_text(run_dir, run)
    if run.fleet:
        _fleet_after(run_dir, run, success, cl)
    elif success.min_score is not None and run.jobs:
        ev = evidence.eval_metrics(run.jobs[0].dir)
        metric = evidence.primary_metric(run.jobs[0].dir)
        value = ev.get(metric) if metric else None
        if value is None:
            cl.items.append(Item("criteria", "score", "FAIL", f"no {metric or 'headline metric'} to compare with "
                                 f"success.min_score {success.min_score}", None, YOURS))
        else:
            ok = value >= success.min_score
            cl.items.append(Item("criteria", "score", "PASS" if ok else "FAIL",
                                 f"{metric} {value:.4g} {'>=' if ok else '<'} {success.min_score}", None, YOURS))
    return cl


#: Jobs whose headline metric the summary names one by one; a fleet beyond it is named by its leaderboard's best.
SCORED_JOBS = 3


def score_text(run_dir: Path, run: evidence.RunEvidence) -> str:
    """The run's result in a few words: each job's headline metric (eval.json), or a fleet's best ranked job."""
    ranked = [r for r in evidence.leaderboard_rows(run_dir) if r.get("rank") is not None]
    if run.fleet and ranked and isinstance(ranked[0].get("score"), (int, float)):
        best = ranked[0]
        return f"best {best['job']} score {best['score']:.4g} ({len(ranked)} ranked)"
    said = []
    for job in run.jobs[:SCORED_JOBS]:
        metric = evidence.primary_metric(job.dir)
        value = evidence.eval_metrics(job.dir).get(metric) if metric else None
        if value is not None:
            said.append(f"{metric} {value:.4g} ({job.name})")
    more = len(run.jobs) - SCORED_JOBS
    return ", ".join(said) + (f" and {more} more job(s)" if said and more > 0 else "")


def _fleet_after(run_dir: Path, run: evidence.RunEvidence, success: SuccessSpec, cl: Checklist) -> None:
    board = evidence.leaderboard_rows(run_dir)
    ranked = [r for r in board if r.get("rank") is not None]
    if not board:
        cl.items.append(Item("after", "leaderboard", "FAIL", "no leaderboard.json"))
    else:
        top = ranked[0] if ranked else None
        # Nothing ranked fails a fleet that is to ship its top models; otherwise it is a warning.
        cl.items.append(Item("after", "leaderboard", "PASS" if ranked else "FAIL" if run.export_top else "WARN",
                             f"{len(ranked)} of {len(board)} job(s) ranked"
                             + (f"; best {top['job']} score {top['score']:.4f}" if top else "")))
    cl.items.append(_export_item(run_dir, ranked, run.export_top))
    manifest = evidence.read_json_or_none(run_dir / "manifest.json")
    cl.items.append(Item("after", "manifest", "PASS" if manifest is not None else "FAIL",
                         f"manifest.json lists {len(manifest.get('models', []))} model(s)"
                         if isinstance(manifest, dict) else "no manifest.json"))
    if success.min_score is not None:
        best = ranked[0]["score"] if ranked else None
        ok = best is not None and best >= success.min_score
        cl.items.append(Item("criteria", "score", "PASS" if ok else "FAIL",
                             f"best score {best:.4f} {'>=' if ok else '<'} {success.min_score}" if best is not None
                             else f"no ranked job to compare with success.min_score {success.min_score}", None, YOURS))


def _export_item(run_dir: Path, ranked: list[dict[str, Any]], export_top: int) -> Item:
    """Whether each leaderboard table shipped its top-k, saying who won it and what was shipped. An external job
    that wrote no model.onnx has nothing to ship: not counted against the fleet (the next model of its table
    is), and a fleet of only such jobs passes with the reason said."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for r in ranked:
        tables.setdefault(str(r.get("table") or r.get("metric")), []).append(r)
    want = exported = 0
    said, unshippable = [], []
    for metric, rows in tables.items():
        shippable = [r for r in rows if not nothing_to_ship(run_dir / r["job"], r.get("kind"))]
        unshippable += [r["job"] for r in rows if r not in shippable]
        done = [r["job"] for r in rows if (run_dir / r["job"] / RUN_FILES.export / RUN_FILES.registered).is_file()]
        want += min(export_top, len(shippable))
        exported += len(done)
        best = rows[0]
        won = f"{metric}: best {best['job']}" + (
            " (external, no model.onnx: not shipped)" if nothing_to_ship(run_dir / best["job"], best.get("kind")) else
            f" (external: {external_model(run_dir / best['job'])})" if best.get("kind") == "external" else "")
        said.append(won + (f", shipped {', '.join(done)}" if done else ", nothing shipped"))
    if export_top and ranked and want == 0:
        return Item("after", "export", "PASS", "no built-in model to export: the ranked jobs are external and "
                    f"wrote no model.onnx ({', '.join(unshippable)}); nothing to ship is not a failure")
    return Item("after", "export", "PASS" if exported >= want else "FAIL",
                f"{exported} of the top {want} exported and registered" + (f" ({'; '.join(said)})" if said else ""))


def checklist_target(path: Path) -> tuple[Path, str | None]:
    """(run directory, job or None): a job's folder (RUN/JOB, as `musubi report` takes) is judged in its run."""
    if (path / RUN_FILES.job).is_file() and not (path / RUN_FILES.run).is_file() and not (path / RUN_FILES.fleet).is_file():
        return path.parent, path.name
    return path, None


def job_view(cl: Checklist, job: str) -> Checklist:
    """The items of one job, and the run's preflight (the run-wide criteria judge every job together)."""
    return Checklist(cl.run_dir, [i for i in cl.items if i.job == job or (i.job is None and i.phase == "before")],
                     {k: v for k, v in cl.figures.items() if k == job})


def write_checklist(run_dir: Path, cl: Checklist) -> Path:
    """RUN/checklist.json."""
    from musubi.store.rundir import write_json

    path = run_dir / CHECKLIST_FILE
    write_json(path, cl.to_dict())
    return path


def verdict_line(cl: Checklist) -> str:
    """'run met its criteria: 9 passed, 1 warnings, 0 failed, 2 not measured' (+ the score)."""
    d = cl.to_dict()["counts"]
    verdict = "met its criteria" if cl.ok else "did NOT meet its criteria"
    return (f"run {verdict}: {d['PASS']} passed, {d['WARN']} warnings, {d['FAIL']} failed, {d['SKIP']} not measured"
            + (f"; {cl.score}" if cl.score else ""))


def summary_lines(cl: Checklist) -> list[str]:
    """The console's checklist: the verdict and score, every failed and warning item in full, where the rest is.

    A run's end is read, not scanned: the items that passed or were not measured stay in RUN/checklist.json
    (and `musubi checklist RUN` draws them all as a table)."""
    lines = [verdict_line(cl)]
    for status in ("FAIL", "WARN"):
        lines += [f"  {status} {i.job + ' ' if i.job else ''}{i.check}: {i.found}" for i in cl.items
                  if i.status == status]
    run_dir = Path(cl.run_dir)
    lines.append(f"full checklist: {run_dir / CHECKLIST_FILE} (as a table: musubi checklist {run_dir})")
    return lines


def render_summary(cl: Checklist, console: Any) -> None:
    """The short form of the checklist on the console (summary_lines), failures in red and warnings in yellow."""
    from rich.text import Text

    colors = {"  FAIL": "red", "  WARN": "yellow"}
    for line in summary_lines(cl):
        # Text: job names and findings are data, never rich markup
        console.print(Text(line, style=colors.get(line[:6], "")), soft_wrap=True)


def render(cl: Checklist, console: Any) -> None:
    """The checklist as a rich table, then one summary line."""
    from rich.table import Table
    from rich.text import Text

    colors = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim"}
    table = Table(title="run checklist", show_lines=False)
    for col in ("phase", "job", "check", "status", "criterion", "found"):
        table.add_column(col, overflow="fold")
    for i in cl.items:
        table.add_row(Text(i.phase), Text(i.job or "-"), Text(i.check), Text(i.status, style=colors[i.status]),
                      Text(i.criterion or "", style="dim" if i.criterion != YOURS else ""),
                      Text(i.found))  # Text: job names and findings are data, never rich markup
    console.print(table)
    console.print(Text(f"{verdict_line(cl)} -> {Path(cl.run_dir) / CHECKLIST_FILE}"))


def checklist_json(cl: Checklist) -> str:
    """What `--json` prints."""
    return json.dumps(cl.to_dict(), indent=1)
