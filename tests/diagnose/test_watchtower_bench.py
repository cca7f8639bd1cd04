"""bench/watchtower.py's own logic: the overhead plan's order and deadline, its summaries, the checkpoint cases' jobs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from musubi.config.load import load_job
from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("watchtower_bench", REPO / "bench" / "watchtower.py")
wt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = wt  # its dataclasses look their module up there
_spec.loader.exec_module(wt)


def test_overhead_plan_runs_four_gpus_first_and_rotates_the_modes() -> None:
    plan = wt.overhead_plan(["resnet50", "fcos"], [1, 4, 2], 2, wt.OVH_MODES)
    assert len(plan) == 2 * 3 * 2 * 3
    assert [r.nproc for r in plan[:12]] == [4] * 12 and plan[-1].nproc == 1
    groups = wt.plan_groups(plan)
    assert [(g[0].model, g[0].nproc, g[0].repeat) for g in groups[:4]] == [
        ("resnet50", 4, 0), ("fcos", 4, 0), ("resnet50", 4, 1), ("fcos", 4, 1)]
    assert all(sorted(r.mode for r in g) == sorted(wt.OVH_MODES) for g in groups)
    # a model's repeats begin with different modes (no mode always runs first), the models' too
    assert groups[0][0].mode != groups[2][0].mode and groups[1][0].mode != groups[3][0].mode
    assert groups[0][0].mode != groups[1][0].mode


def test_side_by_side_rounds_use_disjoint_gpus_and_cores_and_swap_the_programs() -> None:
    cores = [str(c) for c in range(8)]  # one cpulist a rank of all slots
    one = wt.side_by_side(1, 4, 0, cores=cores[:4])
    assert wt.concurrent(one)
    assert [(s.mode, s.gpus, s.cpus) for s in one] == [("on", (0,), ("0",)), ("plain", (1,), ("1",)),
                                                      ("on", (2,), ("2",)), ("plain", (3,), ("3",))]
    two = [wt.side_by_side(2, 4, r, cores=cores[:4]) for r in (0, 1)]
    assert [(s.mode, s.gpus, s.cpus) for s in two[0]] == [("on", (0, 1), ("0", "1")), ("plain", (2, 3), ("2", "3"))]
    assert [s.mode for s in two[1]] == ["plain", "on"]  # the next round swaps places
    # one slot (a run needs every GPU): both programs on the same GPUs, one after the other, the first swapping
    four = [wt.side_by_side(4, 4, r, cores=cores[:4]) for r in (0, 1)]
    assert not wt.concurrent(four[0]) and all(s.gpus == (0, 1, 2, 3) for s in four[0])
    assert [s.mode for s in four[0]] == ["on", "plain"] and [s.mode for s in four[1]] == ["plain", "on"]
    # more GPUs than two slots of 3: the one left over stays idle
    assert [s.gpus for s in wt.side_by_side(3, 7, 0, cores=cores[:6])] == [(0, 1, 2), (3, 4, 5)]


def test_a_rounds_time_is_its_longest_run_or_with_one_slot_the_sum_measured_times_first() -> None:
    cores = [str(c) for c in range(4)]
    side, turns = wt.side_by_side(1, 4, 0, cores=cores), wt.side_by_side(4, 4, 0, cores=cores)
    assert wt.round_seconds("fcos", 50.0, side, {}) == 50.0 and wt.round_seconds("fcos", 50.0, turns, {}) == 100.0
    measured = {("fcos", "on"): 53.0, ("fcos", "plain"): 38.0}
    assert wt.round_seconds("fcos", 50.0, side, measured) == 53.0
    assert wt.round_seconds("fcos", 50.0, turns, measured) == 91.0
    assert wt.round_seconds("fcos", 50.0, turns, {("fcos", "on"): 53.0}) == 103.0  # plain not yet run: the prior


def test_fit_plan_keeps_whole_groups_in_order_and_stops_at_the_first_that_does_not_fit() -> None:
    plan = wt.overhead_plan(["resnet50", "fcos"], [4, 2], 2, wt.OVH_MODES)
    est = {(m, mode): wt.OVH_MODELS[m].est_s for m in ("resnet50", "fcos") for mode in wt.OVH_MODES}
    r50, fcos = est[("resnet50", "on")], est[("fcos", "on")]
    kept, total = wt.fit_plan(plan, est, 3 * r50 + 3 * fcos + 3 * r50 + 3 * fcos - 1)
    # the 4-GPU fcos of the second repeat does not fit; the cheaper 2-GPU resnet50 after it is not run either
    assert [(r.model, r.nproc, r.repeat) for r in kept[::3]] == [("resnet50", 4, 0), ("fcos", 4, 0),
                                                                  ("resnet50", 4, 1)]
    assert total == 3 * r50 + 3 * fcos + 3 * r50


def test_overhead_summary_per_model_and_gpu_count() -> None:
    runs = [{"model": m, "world": n, "mode": mode, "samples_per_s": v, "per_gpu_batch": 16}
            for m, n, mode, v in [("fcos", 4, "on", 460.0), ("fcos", 4, "off", 462.3), ("fcos", 4, "plain", 464.6),
                                  ("fcos", 4, "on", 462.0), ("resnet50", 1, "on", 4500.0),
                                  ("resnet50", 1, "plain", 4400.0)]]
    runs.append({"model": "fcos", "world": 4, "mode": "off", "error": "skipped"})
    fcos, r50 = wt.summarize_overhead(runs, "cuda")
    assert (fcos["model"], fcos["world"], fcos["runs"]) == ("fcos", 4, {"on": 2, "off": 1, "plain": 1})
    assert fcos["samples_per_s"]["on"] == 461.0
    assert fcos["telemetry_overhead_pct"] == round(100 * (462.3 / 461.0 - 1), 2)
    assert fcos["musubi_on_vs_plain_wall"] == round(461.0 / 464.6, 4)
    assert "telemetry_overhead_pct" not in r50 and r50["musubi_on_vs_plain_wall"] == round(4500 / 4400, 4)


def test_checkpoint_cases_are_valid_jobs_that_save_twice_a_segment(tmp_path: Path) -> None:
    for cpu in (False, True):
        job, sets = wt.jobs(cpu, tmp_path)["ckpt"]
        for name, mode in (("ckpt_sync", "off"), ("ckpt_async", "auto")):
            case = wt.CASES[name]
            spec = load_job(job, [*sets, "checkpoint.enabled=false", *case.sets])
            assert spec.checkpoint.enabled and spec.checkpoint.async_mode == mode
            assert spec.train.optimizer == "adamw"
            assert spec.checkpoint.every_steps == wt.CKPT_EVERY
    args = argparse.Namespace(cpu=False, steps=30, segments=10)
    assert wt.case_estimate("ckpt_sync", args) == wt.CASE_EST_S["ckpt_sync"]


def test_checkpoint_cases_train_through_their_first_two_saves_before_counting() -> None:
    # A save after step k is timed in step k + 1: the second save (every 30 steps) is in step 61, so 60-step
    # segments need two warm ones (4x H200, 2026-11-27: with one, a save blocked 8 s was counted, most likely that one)
    case = wt.CASES["ckpt_async"]
    assert wt.CKPT_EVERY == 30
    assert [case.warm_segments(n) for n in (25, 30, 60, 61, 120)] == [3, 3, 2, 1, 1]
    assert wt.CASES["healthy"].warm_segments(60) == 0


def test_checkpoint_cases_refuse_segments_without_two_saves(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    # The label needs two saves in a judged segment: fewer steps than that is refused before anything runs.
    base = ["watchtower.py", "--part", "scenarios", "--nproc", "4", "--cases", "healthy,ckpt_async", "--plan"]
    monkeypatch.setattr(sys, "argv", [*base, "--steps", str(2 * wt.CKPT_EVERY - 1)])
    with pytest.raises(SystemExit) as e:
        wt.main()
    assert e.value.code == 2 and f"use --steps {2 * wt.CKPT_EVERY} or more" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", [*base, "--steps", str(2 * wt.CKPT_EVERY)])
    wt.main()  # --plan: prints the runs, starts none
    assert "scenario ckpt_async" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [*base[:-2], "healthy", "--plan", "--steps", "25"])  # no checkpoint case
    wt.main()


def test_musubi_rate_over_the_window_and_each_log_interval(tmp_path: Path) -> None:
    recs = [{"kind": "train", "step": k, "time": t} for k, t in ((10, 0.0), (20, 1.0), (30, 2.0), (40, 3.5),
                                                                 (50, 4.5))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rate = wt.musubi_rate(tmp_path, batch=16, world=2, warm=20, stop=50)
    assert rate["samples_per_s"] == round(16 * 2 * 30 / 3.5, 1) and rate["mean_step_ms"] == round(3.5 / 30 * 1e3, 3)
    assert rate["interval_step_ms"] == [100.0, 150.0, 100.0]  # the slow interval shows, the window's mean hides it
    with pytest.raises(RuntimeError, match="log steps 20 and 60 missing"):
        wt.musubi_rate(tmp_path, batch=16, world=2, warm=20, stop=60)


def test_checkpoint_saves_read_from_metrics(tmp_path: Path) -> None:
    recs = [{"kind": "train", "step": 10, "time": 1.0},
            {"kind": "checkpoint", "step": 12, "mode": "process", "blocked_s": 0.05, "durable_s": 0.9, "ok": True},
            {"kind": "checkpoint", "step": 24, "mode": "process", "blocked_s": 0.03, "durable_s": 1.1, "ok": True},
            {"kind": "checkpoint", "step": 36, "mode": "process", "blocked_s": 0.04, "ok": False}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert wt.checkpoint_saves(tmp_path) == {"mode": "process", "count": 3, "blocked_s_median": 0.04,
                                             "blocked_s_max": 0.05, "durable_s_median": 1.0, "failed": 1}
    assert wt.checkpoint_saves(tmp_path / "none") is None


def test_stalls_name_the_slow_step_its_rank_and_section(tmp_path: Path) -> None:
    tele = tmp_path / "telemetry"
    tele.mkdir()
    for rank in range(2):
        lines = []
        for step in range(1, 41):
            gpu = {"forward": 20.0, "backward": 30.0, "grad_comm": 1.0}
            if step == 33 and rank == 1:
                gpu["backward"] += 90.0  # rank 1 stalls once, in backward
            if step == 33 and rank == 0:
                gpu["grad_comm"] += 90.0  # rank 0 waits for it
            if step == 5:
                gpu["forward"] += 500.0  # before the window: not counted
            lines.append(json.dumps({"kind": "step", "step": step, "rank": rank, "wall_ms": sum(gpu.values()),
                                     "gpu": gpu}))
        (tele / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    found = wt.stalls(tmp_path, warm=20, stop=40)
    assert [s["step"] for s in found] == [33]
    (s,) = found
    assert s["median_step_ms"] == 51.0 and s["wall_ms"] == {0: 141.0, 1: 141.0}
    assert s["over_median_ms"] == {0: {"grad_comm": 90.0}, 1: {"backward": 90.0}}
    assert wt.stalls(tmp_path, warm=33, stop=40) == []  # a steady window: nothing
