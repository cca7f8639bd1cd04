"""Labels, straggler scores and the report's JSON from synthetic step records (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musubi.cli import app
from musubi.diagnose.classify import analyze
from musubi.diagnose.timeline import load_job
from musubi.telemetry.host_lag import host_lag
from musubi.telemetry.straggler import StragglerDetector
from tests.diagnose.records import write_job


@pytest.mark.parametrize(("kwargs", "label"), [
    ({}, "healthy compute bound"),
    ({"data_ms": 15.0}, "input bound"),
    ({"comm_ms": 20.0}, "communication bound"),
    ({"ckpt_every": 10, "ckpt_ms": 200.0}, "periodic checkpoint stall"),
    ({"slow_rank": 2, "factor": 1.1, "ranks": 4}, "straggler"),
    ({"gpu": True}, "healthy compute bound"),
    ({"gpu": True, "busy": 35.0}, "host/launch bound"),  # host time == device time in these records
    # the GPU idles while it waits for the all-reduce: comm, not launches (p2p_off on 4x H200, 2026-11-26)
    ({"gpu": True, "busy": 17.0, "comm_ms": 30.0}, "communication bound"),
    ({"gpu": True, "alloc_retries": 40}, "memory pressure"),
])
def test_label_of_each_scenario(tmp_path: Path, kwargs: dict, label: str) -> None:
    a = analyze(load_job(write_job(tmp_path / "job", **kwargs)))
    assert a["label"] == label, a["evidence"]
    assert a["evidence"]
    if label == "straggler":
        assert a["text"] == "straggler (rank 2, section backward)"
        assert a["stragglers"]["stragglers"][0]["flagged_at"] <= 50
        # the others wait for rank 2 at the all-reduce: their long grad_comm is not "communication bound"
        assert all(f["label"] != "communication bound" for f in a["findings"])
    else:
        assert not a["stragglers"]["stragglers"]


def test_slow_rank_flagged_live_within_window_and_healthy_never() -> None:
    """The streaming detector flags rank 1 (10 % slow) by step 50; a healthy noisy run is never flagged."""
    def steps(slow: float, n: int = 120):
        import random

        rng = random.Random(1)
        for k in range(1, n + 1):
            work = {r: 33.0 * (1 + rng.uniform(-0.03, 0.03)) + (slow * 33.0 if r == 1 else 0.0) for r in range(2)}
            top = max(work.values())
            yield k, {r: {"step": k, "wall_ms": top + 2, "host": {"forward": w, "grad_comm": top - w + 2}}
                      for r, w in work.items()}

    slow = StragglerDetector(0.05)
    flags = [s for k, recs in steps(0.1) for s in slow.update(k, recs)]
    assert flags and flags[0].rank == 1 and flags[0].flagged_at <= 50 and flags[0].section == "forward"
    healthy = StragglerDetector(0.05)
    assert not [s for k, recs in steps(0.0) for s in healthy.update(k, recs)]


def test_report_json_and_window(tmp_path: Path) -> None:
    """`musubi report RUN --json`: one entry per job, label and figures; --steps narrows the window."""
    write_job(tmp_path / "run" / "a", ckpt_every=10, ckpt_ms=200.0)
    write_job(tmp_path / "run" / "b")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [j["label"] for j in out["jobs"]] == ["periodic checkpoint stall", "healthy compute bound"]
    assert out["jobs"][0]["figures"]["checkpoint"]["every_steps"] == 10
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run" / "a"), "--json", "--steps", "22:29"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["jobs"][0]["window"] == [22, 29]


@pytest.mark.parametrize("args", [["--steps", "9"], ["--steps", "a:b"], ["--steps", "30:10"]])
def test_report_bad_input_one_line(tmp_path: Path, args: list[str]) -> None:
    write_job(tmp_path / "run" / "a", steps=12)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), *args])
    assert res.exit_code == 2 and "--steps" in res.output and len(res.output.strip().splitlines()) == 1


def test_report_missing_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such run directory" in res.output


def test_report_shows_the_checklist_and_the_planner_beside_measured(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    job = tmp_path / "run" / "a"
    write_job(job)
    (job / "plan.json").write_text(json.dumps({
        "layout": "dp=2,zero=0,micro=8", "gpu": "H200", "global_batch": 16,
        "predicted": {"step_time_s": 0.05, "mfu": 0.4, "memory_gib": {"allocated": 3.0}}}))
    with open(job / "metrics.jsonl", "a") as f:
        for i in range(3):
            f.write(json.dumps({"kind": "train", "step": i, "samples_per_s": 400.0, "mem_peak_allocated_gib": 2.5}) + "\n")
    (tmp_path / "run" / "checklist.json").write_text(json.dumps({"ok": False, "items": [
        {"phase": "criteria", "job": "a", "check": "speedup", "status": "FAIL", "found": "1.2x <b>low</b>"}]}))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert "<h2>Checklist</h2>" in html and "did NOT meet its success criteria" in html
    assert "1.2x &lt;b&gt;low&lt;/b&gt;" in html  # escaped, like every string from the run
    assert "Planner: predicted beside measured" in html and "<td>50.0</td><td>40.0</td>" in html.replace(" ", "")
    assert "achieved MFU is the planner" in html
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json"])
    plan = json.loads(res.output)["jobs"][0]["planner"]
    assert plan["predicted"]["step_time_s"] == 0.05 and plan["measured"]["step_time_s"] == pytest.approx(0.04)
    assert plan["measured"]["mfu_achieved"] == pytest.approx(0.5) and plan["measured"]["memory_allocated_gib"] == 2.5
    (job / "plan.json").unlink()  # a job whose task has no plan_spec: said so, in the JSON and on the page
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json"])
    assert "plan_spec" in json.loads(res.output)["jobs"][0]["planner"]["note"]
    CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(out)])
    assert "no planner prediction" in out.read_text()


def _as_fsdp(job: Path) -> Path:
    """Records as FSDP leaves them: no comm-hook mark, the gradient sync inside backward."""
    for p in (job / "telemetry").glob("rank*.jsonl"):
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "step":
                rec["host"]["backward"] += rec["host"].pop("grad_comm")
                rec["spans"] = [s for s in rec["spans"] if s[0] != "grad_comm"]
            out.append(json.dumps(rec))
        p.write_text("\n".join(out) + "\n", encoding="utf-8")
    meta = json.loads((job / "job.json").read_text(encoding="utf-8"))
    meta["config"]["train"] = {"strategy": "fsdp"}
    (job / "job.json").write_text(json.dumps(meta), encoding="utf-8")
    return job


def test_fsdp_says_comm_and_stragglers_are_not_measured(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _as_fsdp(write_job(run / "job", ranks=2))
    a = analyze(load_job(run / "job"))
    assert a["label"] == "healthy compute bound"
    assert "gradient comm not measured" in a["evidence"] and "exposed gradient comm" not in a["evidence"]
    assert a["figures"]["grad_comm_share"] is None
    (lim,) = a["limitations"]
    assert "FSDP" in lim and "straggler" in lim
    res = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["jobs"][0]["limitations"] == [lim]
    from musubi.diagnose.report import build_report

    assert "Not measured:</b> gradient communication not separable (FSDP)" in Path(
        build_report(run)["html"]).read_text(encoding="utf-8")
    # a DDP job has the split: nothing to say
    assert analyze(load_job(write_job(tmp_path / "ddp", ranks=2)))["limitations"] == []


def test_report_without_matplotlib_writes_the_page_without_plots(tmp_path: Path, monkeypatch) -> None:
    import sys

    run = tmp_path / "run"
    write_job(run / "job", ranks=2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    res = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert [ln for ln in res.output.splitlines() if "matplotlib is not installed" in ln] == [
        "plots left out: matplotlib is not installed (pip install 'musubi-train[report]')"]
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<svg" not in page and "not drawn (matplotlib is not installed)" in page
    assert 'data-label="healthy compute bound"' in page and (tmp_path / "r.trace.json").is_file()


def test_a_failed_report_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    from musubi.diagnose import page

    run = tmp_path / "run"
    write_job(run / "job", ranks=2)

    def broken(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("render failed")

    monkeypatch.setattr(page, "render", broken)
    res = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "out" / "r.html")])
    assert res.exit_code != 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_drill_judge_needs_the_live_flag(tmp_path: Path) -> None:
    """The suite judges what rank 0's watch flagged during the run, not only the replayed detector."""
    from musubi.diagnose import drills

    job = write_job(tmp_path / "job", ranks=2, steps=80, slow_rank=1, factor=1.3)
    row = drills.judge(drills.SCENARIOS["slow_1.3"], job)
    assert row["flagged_at"] and row["live_flagged_at"] is None and not row["flagged_in_time"]  # no stragglers.jsonl
    (job / "telemetry" / "stragglers.jsonl").write_text(json.dumps({"kind": "straggler", "rank": 1, "step": 29}) + "\n")
    row = drills.judge(drills.SCENARIOS["slow_1.3"], job)
    assert row["live_flagged_at"] == 29 and row["flagged_in_time"]
    healthy = write_job(tmp_path / "healthy", ranks=2, steps=80)
    (healthy / "telemetry" / "stragglers.jsonl").write_text(json.dumps({"kind": "straggler", "rank": 0, "step": 40}))
    assert drills.judge(drills.SCENARIOS["healthy"], healthy)["false_straggler"]  # a live flag alone counts


def test_steps_window_covers_plots_and_trace_and_live_flag_is_the_live_one(tmp_path: Path) -> None:
    from musubi.diagnose.report import build_report

    run = tmp_path / "run"
    job = write_job(run / "job", ranks=2, steps=90, slow_rank=1, factor=1.3)
    (job / "telemetry" / "stragglers.jsonl").write_text(json.dumps({"kind": "straggler", "rank": 1, "step": 29}) + "\n")
    a = analyze(load_job(job), 40, 80)
    assert "flagged live at step 29" in a["evidence"] and "replayed over steps" in a["evidence"]
    res = build_report(run, tmp_path / "w.html", "40:60")
    trace = json.loads(Path(res["trace"]).read_text(encoding="utf-8"))
    steps = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert steps == set(range(40, 61))
    tele = load_job(job).window(40, 60)
    assert {r["step"] for recs in tele.steps.values() for r in recs} == set(range(40, 61)) and not tele.flags
    t0 = min(r["t"] for recs in tele.steps.values() for r in recs)
    assert tele.samples[0] and all(s["t"] >= t0 for s in tele.samples[0])


def test_trace_of_a_long_run_is_capped_keeping_the_slow_steps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_job(run / "job", ranks=2, steps=3000, ckpt_every=500, ckpt_ms=300.0)
    res = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html"), "--trace-steps", "400"])
    assert res.exit_code == 0, res.output
    assert "trace: 2600 steps of job left out" in res.output
    trace = json.loads((tmp_path / "r.trace.json").read_text(encoding="utf-8"))
    steps = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(steps) == 400 and trace["otherData"]["steps_left_out"] == {"job": 2600}
    assert {501, 1001, 2501} <= steps and {1, 50, 3000} <= steps  # checkpoints, the start, the end
    res = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "all.html"), "--trace-steps", "0"])
    trace = json.loads((tmp_path / "all.trace.json").read_text(encoding="utf-8"))
    assert len({e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}) == 3000


def test_per_rank_step_time_tail_in_the_report(tmp_path: Path) -> None:
    """Each rank's step-time CV and p99/p50 after warm-up: in the report's JSON and on its console line."""
    from musubi.telemetry.straggler import tail

    assert tail([10.0] * 50) == (0.0, 1.0)
    cv, ratio = tail([10.0] * 98 + [30.0, 30.0])
    assert ratio is not None and 2.9 < ratio <= 3.0 and cv is not None and cv > 0.2
    assert tail([10.0]) == (None, None)
    write_job(tmp_path / "run" / "s", slow_rank=2, factor=1.1, ranks=4)
    a = analyze(load_job(tmp_path / "run" / "s"))
    ranks = a["stragglers"]["ranks"]
    assert len(ranks) == 4 and all(r["cv"] is not None and r["p99_p50"] >= 1.0 for r in ranks)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "step-time tail after warm-up, worst rank: CV" in res.output and "p99/p50" in res.output


def test_short_cpu_run_names_no_straggler_and_says_why(tmp_path: Path) -> None:
    """16 steps of 2 CPU ranks, one 6 % behind in backward (the noise of a shared 2-core host): not judged."""
    a = analyze(load_job(write_job(tmp_path / "job", ranks=2, steps=16, slow_rank=1, factor=1.06)))
    assert a["label"] == "healthy compute bound", a["text"]
    assert not a["stragglers"]["stragglers"] and a["stragglers"]["judged"] is False
    assert any("stragglers: 11 steady step(s)" in lim and "20 needed" in lim for lim in a["limitations"])
    assert "stragglers not judged (too few steps)" in a["evidence"]


def test_default_straggler_bar_depends_on_the_device(tmp_path: Path) -> None:
    """The same 6 % lead over 60 steps: below the CPU bar (7 %, cores are shared), above the GPU bar (5 %)."""
    cpu = analyze(load_job(write_job(tmp_path / "cpu", ranks=2, steps=60, slow_rank=1, factor=1.06)))
    gpu = analyze(load_job(write_job(tmp_path / "gpu", ranks=2, steps=60, slow_rank=1, factor=1.06, gpu=True)))
    assert cpu["label"] == "healthy compute bound" and cpu["stragglers"]["threshold"] == 0.07
    assert gpu["text"] == "straggler (rank 1, section backward)" and gpu["stragglers"]["threshold"] == 0.05


def test_report_draws_loss_and_metric_curves_from_metrics_jsonl(tmp_path: Path) -> None:
    """A 'Training curves' figure per job (train loss, val loss, val metrics); a metric of odd name is numbered."""
    pytest.importorskip("matplotlib")
    job = write_job(tmp_path / "run" / "a")
    recs = [{"kind": "train", "step": k, "loss": 2.0 / k} for k in range(1, 9)]
    recs += [{"kind": "val", "step": k, "top1": k / 10, "val_loss": 1.0 / k, "<b>x</b>": 0.5, "eval_s": 0.1}
             for k in (4, 8)]
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--html", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "r.html").read_text()
    section = html[html.index("<h3>Training curves</h3>"):html.index("<h3>Step-time breakdown")]
    assert "<svg" in section and "Loss and validation metrics per step" in section
    assert "<b>x</b>" not in html  # a metric name is never written into the page


def test_report_out_still_names_the_html_file_with_a_deprecation_line(tmp_path: Path) -> None:
    """--html (or -o) is the page; the old --out keeps working and says it is deprecated."""
    write_job(tmp_path / "run" / "a", steps=30)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "old.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "old.html").is_file() and "deprecated: use --html" in res.output
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(tmp_path / "new.html")])
    assert res.exit_code == 0 and (tmp_path / "new.html").is_file() and "deprecated" not in res.output


def test_a_rank_starved_of_cpu_is_input_starved_not_host_bound(tmp_path: Path) -> None:
    """Session 6's cpu_hog on 2 GPUs: spinners on rank 1's cores. Its batch wait grows (and its launching
    thread gets less CPU, so most of its lead shows in backward), the other GPU idles waiting for it: the
    label is the straggler, input starved by CPU contention - not a job-wide host/launch bound."""
    hog = {0: {"cores": 16, "cores_cpu": 40.0, "proc_cpu": 200.0, "workers_cpu": 175.0},
           1: {"cores": 16, "cores_cpu": 100.0, "proc_cpu": 50.0, "workers_cpu": 170.0}}
    kw = {"gpu": True, "busy": 30.0, "slow_rank": 1, "factor": 1.5, "ranks": 2}
    a = analyze(load_job(write_job(tmp_path / "hog", data_extra={1: 5.0}, cpu=hog, **kw)))
    assert a["label"] == "straggler" and a["text"] == "straggler (rank 1, section data): input starved by CPU contention"
    # the culprit as the diagnosis names it (what bench/watchtower.py scores), not the detector's raw section
    assert a["culprit"] == {"rank": 1, "section": "data", "cause": "input starved"}
    assert a["stragglers"]["stragglers"][0]["section"] == "backward"
    assert "its 16 core(s) are 100 % busy, 86.2 % of that not its own" in a["evidence"]
    assert "waits 6.1 ms a step for its batch" in a["evidence"] and "against 1.1 ms" in a["evidence"]
    assert all(f["label"] != "host/launch bound" for f in a["findings"])
    # Its cores busy with its own work (a loader that needs them all): slow, but not starved by others.
    own = {**hog, 1: {"cores": 16, "cores_cpu": 100.0, "proc_cpu": 200.0, "workers_cpu": 1350.0}}
    b = analyze(load_job(write_job(tmp_path / "own", data_extra={1: 5.0}, cpu=own, **kw)))
    assert b["text"] == "straggler (rank 1, section backward)" and "input starved" not in b["evidence"]
    assert b["culprit"] == {"rank": 1, "section": "backward"}
    # Contended cores but no longer batch wait (a GPU-bound lead): the section is where the time goes.
    c = analyze(load_job(write_job(tmp_path / "gpu", cpu=hog, **kw)))
    assert c["text"] == "straggler (rank 1, section backward)"


def test_a_rank_whose_gpu_waits_for_its_quiet_host_is_host_lag_not_a_straggler(tmp_path: Path) -> None:
    """The healthy resnet50 runs on 2x H200 (2026-11-26) that flagged a rank 9-13 % behind: its GPU was less
    busy than its peer's (81-89 % against 96-100 %) and its cores ~8 % busy. That is a `host lag` finding,
    not the label and not in the stragglers; a GPU slowed by another process (as busy as its peer), or a
    rank not pinned (contention cannot be told), stays a straggler."""
    kw = {"gpu": True, "busy": 85.0, "slow_rank": 0, "factor": 1.12, "ranks": 2}
    host = {0: {"util": 85.0, "proc_cpu": 110.0, "cores": 16, "cores_cpu": 7.0},
            1: {"util": 99.0, "proc_cpu": 145.0, "cores": 16, "cores_cpu": 9.0}}
    a = analyze(load_job(write_job(tmp_path / "host", cpu=host, **kw)))
    assert a["label"] == "healthy compute bound" and not a["stragglers"]["stragglers"], a["text"]
    assert [s["rank"] for s in a["stragglers"]["host_lag"]] == [0]
    assert "rank(s) 0 behind on their host only" in a["evidence"]
    (lag,) = [f for f in a["findings"] if f["label"] == "host lag"]
    assert lag["rank"] == 0 and lag["cause"] == "host side" and lag["alarm"] is False
    assert "its GPU was busy 85 % of the time against 99 % on the other ranks" in lag["evidence"]
    for name, cpu in (("gpu", {0: {"util": 100.0, "cores": 16, "cores_cpu": 7.0}, 1: {"util": 99.0}}),
                      ("unpinned", {0: {"util": 85.0}, 1: {"util": 99.0}})):
        b = analyze(load_job(write_job(tmp_path / name, cpu=cpu, **kw)))
        assert b["label"] == "straggler" and b["culprit"] == {"rank": 0, "section": b["culprit"]["section"]}, name
        assert not b["stragglers"]["host_lag"] and all(f["label"] != "host lag" for f in b["findings"])


def test_host_lag_rule_on_the_recorded_2xh200_segments() -> None:
    """The rule against every segment of the recorded GPU run (bench/results, 2x H200, 2026-11-26): each rank
    the detector flagged in a healthy segment (4 false alarms) is host lag; gpu_hog's and cpu_hog's culprit
    (rank 1, all 20 segments) is not, so both stay flagged."""
    path = Path(__file__).resolve().parents[2] / "bench/results/watchtower-scenarios-2026-11-26-2xH200-ff80f60.json"
    rows = json.loads(path.read_text(encoding="utf-8"))["scenarios"]
    seen = {"healthy": 0, "gpu_hog": 0, "cpu_hog": 0}
    for row in rows:
        figs = {int(r): mean for r, mean in row["hardware"].items()}
        for rank in row["flagged"]:
            lag = host_lag(rank, figs)
            seen[row["case"]] += 1
            if row["case"] == "healthy":
                assert lag is not None, (row["segment"], figs)
            else:
                assert lag is None and rank == 1, (row["case"], row["segment"], lag)
    assert seen == {"healthy": 4, "gpu_hog": 10, "cpu_hog": 10}


def test_a_gpu_shared_with_another_process_is_said_under_the_bar_and_in_a_stragglers_evidence(tmp_path: Path) -> None:
    """4x H200 (2026-11-27): a process busy 10 % of the time on rank 1's GPU made the job 10.6 % slower and rank
    1's own work only 3.3-5.8 %, under the straggler bar: the label stays healthy, but a `gpu shared` finding
    (evidence, not an alarm) names the rank and the process NVML saw; a flagged rank's evidence starts with it."""
    others = {1: {"util": 99.0, "gpu_others": 1, "gpu_others_mib": 1094}, 0: {"util": 99.0, "gpu_others": 0,
                                                                            "gpu_others_mib": 0}}
    a = analyze(load_job(write_job(tmp_path / "light", gpu=True, busy=95.0, cpu=others)))
    assert a["label"] == "healthy compute bound"
    assert "rank(s) 1 share their GPU with another process" in a["evidence"]
    (f,) = [f for f in a["findings"] if f["label"] == "gpu shared"]
    assert f["rank"] == 1 and f["alarm"] is False
    assert "NVML saw 1 other process(es) on rank 1's GPU in 100.0 % of the samples (up to 1094 MiB" in f["evidence"]
    assert a["figures"]["hardware"][1]["gpu_shared"] == 1.0 and a["figures"]["hardware"][0]["gpu_shared"] == 0.0
    b = analyze(load_job(write_job(tmp_path / "hog", gpu=True, busy=95.0, cpu=others, slow_rank=1, factor=1.5)))
    assert b["label"] == "straggler" and b["culprit"]["rank"] == 1 and b["culprit"]["cause"] == "GPU shared"
    assert b["evidence"].startswith("NVML saw 1 other process(es) on rank 1's GPU")
    assert b["text"].endswith(": its GPU is shared with another process")
    assert all(f["label"] != "gpu shared" for f in b["findings"])
    # without the process figures (older runs, NVML unable to list): nothing said
    c = analyze(load_job(write_job(tmp_path / "old", gpu=True, busy=95.0)))
    assert "gpu_shared" not in c["figures"]["hardware"][1] and all(f["label"] != "gpu shared" for f in c["findings"])


def test_report_process_never_imports_torch(tmp_path: Path) -> None:
    """`musubi report` (HTML and --json) reads records, it computes with no tensor: its process must not
    pay `import torch` (4-7 s of CPU). A fresh interpreter, so nothing this test process imported counts."""
    import subprocess
    import sys

    write_job(tmp_path / "run" / "a", gpu=True, ckpt_every=10, ckpt_ms=200.0)
    write_job(tmp_path / "run" / "b", slow_rank=1, factor=1.3)
    (tmp_path / "run" / "a" / "plan.json").write_text(json.dumps({
        "layout": "dp=2,zero=0,micro=8", "gpu": "H200", "global_batch": 16,
        "predicted": {"step_time_s": 0.05, "mfu": 0.4, "memory_gib": {"allocated": 3.0}}}))
    probe = ("import json, sys\nfrom musubi.cli import app\n"
             "for args in (['-o', sys.argv[2]], ['--json']):\n"
             "    try:\n        app(['report', sys.argv[1], *args])\n"
             "    except SystemExit as e:\n        assert not e.code, e.code\n"
             "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))\n")
    res = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run"), str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "r.html").is_file() and '"jobs"' in res.stdout
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [], "musubi report imported torch"


def test_a_slow_rank_not_flagged_is_right_only_where_the_noise_could_not_tell_it(tmp_path: Path) -> None:
    """The scenario test's judgement of a 10 %-slow drill the detector did not flag (tests/diagnose/noise.py):
    on a quiet machine it must have been flagged; on a noisy one the slowdown must still show against the noise."""
    from tests.diagnose.noise import slow_rank_against_noise

    row = {"scenario": "slow_1.1", "label": "healthy compute bound", "stragglers": [], "live_flags": []}
    quiet, noisy = write_job(tmp_path / "quiet"), write_job(tmp_path / "noisy", noise=0.2, seed=1)
    slow = write_job(tmp_path / "slow", slow_rank=1, factor=1.1, noise=0.2, seed=2)
    not_slow = write_job(tmp_path / "not-slow", noise=0.2, seed=2)
    right, figures = slow_rank_against_noise(row, quiet, slow, 0.07)
    assert not right and figures["predicted_low"] >= 0.08, figures  # a quiet machine tells a 10 % rank apart
    right, figures = slow_rank_against_noise(row, noisy, slow, 0.07)
    assert right and figures["predicted_low"] < 0.08 and figures["shift_z"] >= 2.326, figures
    assert not slow_rank_against_noise(row, noisy, not_slow, 0.07)[0]  # no slowdown to show: wrong
    assert not slow_rank_against_noise({**row, "stragglers": [0]}, noisy, slow, 0.07)[0]  # another rank named
