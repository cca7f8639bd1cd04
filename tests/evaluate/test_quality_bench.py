"""bench/quality.py's pure parts: the composed scenes' exact boxes, the split, the verdict, the plan, the jobs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from bench import quality
from bench import quality_plan as plan
from musubi.config.batch_plan import plan_batch
from musubi.config.job import JobSpec

data, report = quality.quality_data, quality.quality_report


def fake_digits(n: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """8x8 uint8 'digits' with ink in a random sub-rectangle (zero margins), labels 0..9."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, 8, 8), dtype=np.uint8)
    for im in images:
        r0, c0 = rng.integers(0, 3, 2)
        r1, c1 = rng.integers(5, 9, 2)
        im[r0:r1, c0:c1] = rng.integers(40, 256, (r1 - r0, c1 - c0))
    return images, rng.integers(0, 10, n)


def test_composed_scene_boxes_are_the_exact_extent_of_each_digits_ink() -> None:
    images, labels = fake_digits()
    p = data.DataParams(canvas=96, min_digit=16, max_digit=40, min_objects=3, max_objects=6)
    rng = np.random.default_rng(1)
    for _ in range(20):
        canvas, boxes = data.compose_scene(rng, images, labels, p)
        assert canvas.shape == (96, 96) and canvas.dtype == np.uint8 and boxes
        outside = np.ones_like(canvas, dtype=bool)
        for i, (x, y, w, h, label) in enumerate(boxes):
            assert 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96 and 0 <= label <= 9
            crop = canvas[y : y + h, x : x + w]
            # tight: ink on the first and last row and column of the box
            assert crop[0].any() and crop[-1].any() and crop[:, 0].any() and crop[:, -1].any()
            assert crop.min() == 0 or crop.all()  # a real patch, not a filled rectangle by accident
            outside[y : y + h, x : x + w] = False
            for bx, by, bw, bh, _ in boxes[i + 1 :]:  # apart by at least the 2-px gap
                assert x + w + 2 <= bx or bx + bw + 2 <= x or y + h + 2 <= by or by + bh + 2 <= y
        assert not canvas[outside].any()  # no ink outside the boxes


def test_ink_patch_drops_the_interpolation_halo_and_crops_to_ink() -> None:
    digit = np.zeros((8, 8), dtype=np.uint8)
    digit[2:6, 3:5] = 255
    patch = data.ink_patch(digit, 32)
    assert patch.min() == 0 or patch.all()
    assert (patch[patch > 0] >= data.INK).all()
    big = data.upscale(digit, 32).copy()
    big[big < data.INK] = 0
    rows, cols = np.flatnonzero(big.any(1)), np.flatnonzero(big.any(0))
    assert patch.shape == (rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1)


def test_coco_scenes_on_disk_match_their_annotations(tmp_path: Path) -> None:
    images, labels = fake_digits()
    p = data.DataParams(canvas=64, min_digit=12, max_digit=28)
    counts = data.coco_scenes(tmp_path, images, labels, 6, seed=3, p=p)
    coco = json.loads((tmp_path / "annotations.json").read_text())
    assert counts == {"images": 6, "boxes": len(coco["annotations"])}
    assert [c["id"] for c in coco["categories"]] == list(range(1, 11))
    rng = np.random.default_rng(3)  # the same draws give the same scenes: compare pixels and boxes
    for info in coco["images"]:
        canvas, boxes = data.compose_scene(rng, images, labels, p)
        on_disk = np.asarray(Image.open(tmp_path / "images" / info["file_name"]))
        assert (on_disk == canvas).all() and info["width"] == info["height"] == 64
        anns = [a for a in coco["annotations"] if a["image_id"] == info["id"]]
        assert [(a["bbox"], a["category_id"], a["area"]) for a in anns] == [
            ([x, y, w, h], d + 1, w * h) for x, y, w, h, d in boxes]


def test_split_is_stratified_disjoint_and_complete() -> None:
    labels = np.repeat(np.arange(10), [20, 30, 10, 15, 25, 20, 20, 20, 20, 20])
    train, val = data.stratified_split(labels, 0.2, seed=0)
    assert not set(train) & set(val) and sorted([*train, *val]) == list(range(len(labels)))
    for c, n in zip(range(10), [20, 30, 10, 15, 25, 20, 20, 20, 20, 20], strict=True):
        assert (labels[val] == c).sum() == round(0.2 * n)
    assert (data.stratified_split(labels, 0.2, seed=0)[1] == val).all()


def test_verdict_needs_the_mean_within_one_point_or_inside_the_plain_loops_spread() -> None:
    plain = [0.500, 0.520, 0.540]
    ok = report.verdict(plain, [0.515, 0.525, 0.530])
    assert ok["verdict"] == "PASS" and ok["within_spread"] and ok["within_1pt"]
    assert ok["delta"] == pytest.approx(0.0033333, abs=1e-6)
    # 1.5 points off the mean, but inside the plain loop's own seed-to-seed range: noise the bench cannot split
    wide = report.verdict(plain, [0.535, 0.535, 0.535])
    assert wide["verdict"] == "PASS" and wide["within_spread"] and not wide["within_1pt"]
    # outside a narrow range, but within 1 point of its mean
    narrow = report.verdict([0.800, 0.801, 0.802], [0.808, 0.808, 0.808])
    assert narrow["verdict"] == "PASS" and not narrow["within_spread"] and narrow["within_1pt"]
    # neither: 3 points below a range 4 points wide
    low = report.verdict(plain, [0.47, 0.47, 0.47])
    assert low["verdict"] == "FAIL" and not low["within_spread"] and not low["within_1pt"]
    assert report.verdict(plain, [0.52, 0.52])["verdict"] == "too few seeds"
    assert report.verdict([], [0.5])["verdict"] == "no runs"


def _record(model: str, side: str, nproc: int, seed: int, value: float, status: str = "ok") -> dict:
    return {"model": model, "side": side, "nproc": nproc, "seed": seed, "status": status, "wall_s": 10.0,
            "final": {"top1": value}, "log": [{"step": 10, "loss": 1.0 - value, "lr": 0.1},
                                              {"step": 20, "loss": 0.5 - value / 2, "lr": 0.05}],
            "evals": [{"step": 10, "top1": value / 2}, {"step": 20, "top1": value}]}


def test_summary_rows_judge_musubi_per_gpu_count_and_the_tables_say_so(tmp_path: Path) -> None:
    recs = [_record("c", "plain", 1, s, v) for s, v in enumerate([0.95, 0.96, 0.97])]
    recs += [_record("c", "musubi", 1, s, v) for s, v in enumerate([0.955, 0.96, 0.965])]
    recs += [_record("c", "musubi", 4, s, v) for s, v in enumerate([0.90, 0.91, 0.92])]
    recs += [_record("c", "musubi", 4, 3, 0.0, status="cut by the budget")]
    recs += [_record("d", side, n, s, v) for side, n in (("plain", 1), ("musubi", 1), ("musubi", 4))
             for s, v in enumerate([0.50, 0.52, 0.54])]
    models = {"c": {"metric": "top1", "label": "clf", "floor": 0.9, "global_batch": 64},
              "d": {"metric": "top1", "label": "det", "floor": 0.9, "global_batch": 16}}
    rows = report.summarise(recs, models, [1, 4])
    by = {(r["model"], r["side"], r["nproc"]): r for r in rows}
    plain = by[("c", "plain", 1)]
    assert plain["reaches_floor"] and plain["mean"] == pytest.approx(0.96)
    assert (plain["min"], plain["max"]) == (0.95, 0.97)
    assert by[("c", "musubi", 1)]["verdict"] == "PASS"
    assert by[("c", "musubi", 4)]["verdict"] == "FAIL" and by[("c", "musubi", 4)]["not_ok"] == [
        "seed 3: cut by the budget"]
    assert by[("c", "musubi", 4)]["paired_delta"][0] == pytest.approx(-0.05)
    assert report.model_verdicts(rows) == {"c": "FAIL", "d": "PASS (the plain loop is below its floor 0.9)"}
    table = report.markdown(rows, "GPUs")
    assert "**clf** (top1): **FAIL**" in table and "**det** (top1): **PASS (the plain loop" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("| Musubi 4 GPUs | 0.900"))
    assert "0.910 ± 0.010 | [0.900, 0.920] | -0.050 | no | no | FAIL" in line
    assert "seed 3: cut by the budget" in line
    steps, mean, lo, hi = report.mean_curve([r for r in recs if r["model"] == "c" and r["side"] == "plain"])
    assert steps == [10, 20] and lo[0] <= mean[0] <= hi[0]
    steps, mean, _, _ = report.mean_curve([r for r in recs if r["model"] == "c" and r["side"] == "plain"],
                                          "evals", "top1")
    assert steps == [10, 20] and mean == pytest.approx([0.48, 0.96])
    report.plot(recs, models, [1, 4], tmp_path / "q.png", "t", "GPUs")
    assert (tmp_path / "q.png").stat().st_size > 1000


def test_plan_shares_devices_and_refuses_what_does_not_fit() -> None:
    runs = quality.plan_runs(["classifier"], [0], [1, 2])
    assert [r.name for r in runs] == ["classifier-plain-s0", "classifier-musubi1-s0", "classifier-musubi2-s0"]
    est = dict.fromkeys(runs, 10.0)
    ordered = quality.order_runs(runs, est)
    assert ordered[0].nproc == 2
    # one at a time on 2 devices: the wide run, then the two narrow ones side by side
    assert quality.simulate(ordered, est, devices=2, per_device=1)[0] == pytest.approx(20.0)
    # two a device: all three at once, slowed by sharing
    assert quality.simulate(ordered, est, 2, 2)[0] == pytest.approx(10.0 * (1 + plan.SHARE_SLOWDOWN))
    assert quality.choose_per_device(ordered, est, 2, budget_s=15.0, max_per=4)[0] == 2
    assert quality.choose_per_device(ordered, est, 2, budget_s=5.0, max_per=4)[0] is None
    # a later seed never jumps ahead of a 4-GPU run still waiting for a slot on every GPU
    wide, later = quality.Run("detr", "musubi", 2, 0), quality.Run("detr", "plain", 1, 1)
    assert quality.first_fit([wide, later], [1, 0], per_device=1, devices=2) is None
    assert quality.first_fit([wide, later], [0, 0], per_device=1, devices=2) == wide
    # start-up takes a slot but not the GPU: two runs of 10 s, all of it start-up, share a device unslowed
    assert quality.simulate(ordered[1:], est, 1, 2, fixed=dict.fromkeys(runs, 10.0))[0] == pytest.approx(10.0)
    # half of it: the GPU halves overlap, each at 1 / (1 + SHARE_SLOWDOWN)
    half = quality.simulate(ordered[1:], est, 1, 2, fixed=dict.fromkeys(runs, 5.0))[0]
    assert half == pytest.approx(5.0 + 5.0 * (1 + plan.SHARE_SLOWDOWN))
    with pytest.raises(SystemExit, match="does not fit"):
        quality.main(["--device", "cpu", "--models", "detr", "--budget-s", "10", "--dry-run"])


def test_a_runs_estimate_counts_its_validations_and_its_ranks_share_of_the_batch() -> None:
    det = quality.RECIPES["cnn_detector"]
    params = quality.DATA_SCALES["full"]
    per_epoch = params.train_scenes // det.global_batch
    assert quality.evaluations(replace(det, epochs=5, eval_every=2), 5 * per_epoch, params) == 3  # 2, 4, end
    assert quality.evaluations(replace(det, epochs=5, eval_every=1), 5 * per_epoch, params) == 5
    assert quality.evaluations(replace(det, epochs=5, eval_every=None), 5 * per_epoch, params) == 1
    assert quality.evaluations(replace(det, epochs=5, eval_every=1), 3, params) == 1  # --max-steps 3
    one, two = plan.step_s(det, 1), plan.step_s(det, 2)
    assert one == det.gpu_step_s and two == pytest.approx(det.gpu_step_s * (1 - det.gpu_image_share / 2))
    clf = quality.RECIPES["classifier"]
    assert plan.step_s(clf, 2) == plan.step_s(clf, 1)  # launch-bound: a smaller batch is no faster
    run = quality.Run("cnn_detector", "musubi", 1, 0)
    steps = quality.steps_of(det, params, None)
    est = quality.estimate_s(run, det, steps, "cuda", {}, params)
    assert est == pytest.approx(det.gpu_fixed_s["musubi"] + steps * one
                                + quality.evaluations(det, steps, params) * det.gpu_eval_s)
    assert quality.fixed_s(run, det, "cuda", est) == det.gpu_fixed_s["musubi"]


def test_the_default_plan_fits_its_budget_on_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    """The lead's device command: every model, 3 seeds, plain + Musubi on 1 and 2 GPUs, planned for 2 GPUs."""
    assert quality.main(["--device", "cuda", "--gpus", "2", "--nprocs", "1,2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 27 runs" in out and "running " in out
    assert "whole command" in out


@pytest.mark.parametrize("key", ["classifier", "cnn_detector", "detr"])
@pytest.mark.parametrize("nproc", [1, 4])
def test_musubi_job_trains_at_the_recipes_lr_and_global_batch(key: str, nproc: int, tmp_path: Path) -> None:
    recipe = quality.RECIPES[key]
    run = quality.Run(key, "musubi", nproc, 2)
    job = yaml.safe_load(yaml.safe_dump(quality.musubi_job(recipe, run, tmp_path, "bf16", 2, None)))
    spec = JobSpec.model_validate(job)
    plan = plan_batch(spec, nproc)
    assert plan.lr == recipe.lr and plan.global_batch == recipe.global_batch
    assert plan.per_rank == recipe.global_batch // nproc and spec.train.lr_rule == "none"
    assert spec.train.seed == 2 and spec.train.schedule == "cosine" and spec.data.augment is None
    assert spec.train.warmup_steps == recipe.warmup_steps and spec.train.grad_clip == recipe.grad_clip
    # the plain loop's options carry the same settings
    argv = quality.plain_argv(recipe, quality.Run(key, "plain", 1, 2), tmp_path, "cuda", "bf16", 2, None,
                              tmp_path / "p.json")
    opts = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert float(opts["--lr"]) == recipe.lr and int(opts["--batch-size"]) == recipe.global_batch
    assert int(opts["--lr-warmup-steps"]) == recipe.warmup_steps and opts["--seed"] == "2"
    assert json.loads(opts["--model-args"]) == dict(spec.model_args)
    assert int(opts["--eval-every"]) == spec.train.eval_every == (recipe.eval_every or recipe.epochs)


@pytest.fixture(scope="module")
def two_calls(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The whole bench on the classifier, 2 steps, one seed, in two CPU calls that share their work folder: call 1
    runs the plain loop only (--runs), call 2 (--finish) what is left, Musubi on 1 and 2 gloo ranks, and writes its
    own report and the merged one. Each run once: the rehearsal and the merge read the same three runs (five runs
    before, two of them the same plain loop and Musubi on one rank again, for the same assertions)."""
    pytest.importorskip("sklearn")
    tmp = tmp_path_factory.mktemp("quality")
    out = tmp / "out"
    common = ["--device", "cpu", "--work", str(tmp / "work"), "--out-dir", str(out)]
    code_1 = quality.main([*common, "--nprocs", "1,2", "--seeds", "0", "--max-steps", "2", "--data-scale", "smoke",
                           "--models", "classifier", "--runs", "classifier-plain-s0"])
    (first,) = out.glob("quality-*.json")
    code_2 = quality.main([*common, "--finish", str(first)])
    return {"tmp": tmp, "out": out, "common": common, "first": first, "codes": (code_1, code_2)}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cpu_rehearsal_trains_both_sides_alike(two_calls: dict) -> None:
    """The whole bench on the classifier, 2 steps: plain loop, Musubi on 1 and 2 gloo ranks, one seed."""
    out, first = two_calls["out"], two_calls["first"]
    assert two_calls["codes"] == (1, 1)  # one seed: no verdict, so no PASS
    (merged_file,) = out.glob("quality-*-cpu-*-merged.json")
    (second,) = set(out.glob("quality-*-cpu-*.json")) - {first, merged_file}
    merged = json.loads(merged_file.read_text())
    recs = {r["name"]: r for r in merged["records"]}
    plain, one, two = (recs[f"classifier-{side}-s0"] for side in ("plain", "musubi1", "musubi2"))
    assert [r["status"] for r in (plain, one, two)] == ["ok"] * 3 and {r["steps"] for r in (plain, one, two)} == {2}
    for r in (one, two):
        assert r["lr_check"] == {"lr_as_written": True, "global_batch_equal": True, "lr_curve_max_rel_diff": 0.0}
        # the metric curve: validations at the same steps on both sides (--max-steps 2 ends the first epoch)
        assert [e["step"] for e in r["evals"]] == [e["step"] for e in plain["evals"]] == [2]
    # One rank trains the plain loop's weights step for step: the same losses, the same validation.
    assert one["log"][-1]["loss"] == pytest.approx(plain["log"][-1]["loss"], rel=1e-4)
    assert one["final"]["top1"] == pytest.approx(plain["final"]["top1"], abs=0.01)
    # the call that ran both Musubi runs reports them too (the LR as written; its curve is the merge's, beside the
    # plain run of the other call)
    call_2 = json.loads(second.read_text())
    for r in call_2["records"]:
        assert r["status"] == "ok" and r["lr_check"]["lr_as_written"] and r["lr_check"]["global_batch_equal"]
    rows = {(r["side"], r["nproc"]): r for r in merged["rows"]}
    assert rows[("musubi", 2)]["verdict"] == "too few seeds"
    assert {p.suffix for p in out.iterdir()} == {".json", ".md", ".png"}


def test_the_plain_loop_validates_every_n_epochs_and_at_the_end(tmp_path: Path) -> None:
    """Three epochs, --eval-every 2: validations after epochs 2 and 3, the last one the final metric."""
    from bench import plain_quality_loop as plain

    images, labels = fake_digits(24, seed=4)
    split = {"train": np.arange(16), "val": np.arange(16, 24)}
    data.write_classification(tmp_path, images, labels % 2, split, 16)
    out = tmp_path / "run.json"
    plain.main(plain.get_args_parser().parse_args([
        "--task", "classification", "--model", "resnet18", "--train", str(tmp_path / "train"), "--val",
        str(tmp_path / "val"), "--image-size", "16", "--epochs", "3", "--batch-size", "4", "--lr", "0.01",
        "--eval-every", "2", "--workers", "0", "--log-every", "2", "--device", "cpu", "--output", str(out)]))
    rec = json.loads(out.read_text())
    assert [(e["step"], e["epoch"]) for e in rec["evals"]] == [(8, 2), (12, 3)]
    assert rec["final"] == {"top1": rec["evals"][-1]["top1"]} and rec["steps"] == 12
    assert [p["step"] for p in rec["log"]] == [2, 4, 6, 8, 10, 12]


def test_musubis_validations_are_read_as_its_metric_curve(tmp_path: Path) -> None:
    lines = [{"step": 10, "kind": "train", "loss": 2.0, "lr": 0.1}, {"step": 50, "kind": "val", "map50": 0.2,
             "eval_s": 1.0, "time": 1.0}, {"step": 100, "kind": "train", "loss": 1.0, "lr": 0.0},
             {"step": 100, "kind": "val", "map50": 0.4, "eval_s": 1.0, "time": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = quality.read_musubi(tmp_path)
    assert [(e["step"], e["map50"]) for e in got["evals"]] == [(50, 0.2), (100, 0.4)]
    assert got["final"]["map50"] == 0.4 and "step" not in got["final"]
    assert [p["step"] for p in got["log"]] == [10, 100]


def test_epochs_override_changes_this_runs_recipe_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert quality.main(["--device", "cuda", "--gpus", "2", "--nprocs", "1,2", "--models", "detr", "--epochs",
                         "detr=8", "--budget-s", "2000", "--dry-run"]) == 0
    per_epoch = quality.DATA_SCALES["full"].train_scenes // quality.RECIPES["detr"].global_batch
    assert f"detr: rtdetr_r18, {8 * per_epoch} steps x 16, 4 validations" in capsys.readouterr().out  # every 2
    assert quality.RECIPES["detr"].epochs == 6  # the module's recipes are left as they are
    for bad in ("detr=0", "nope=3", "detr"):
        with pytest.raises(SystemExit):
            quality.parse_args(["--epochs", bad])


# -- the plan's time: calibration from an earlier call, and the recipes' own figures (2x H200 result files) --
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
FOUR_A_GPU = RESULTS / "quality-2026-11-28-2xH200-2c8e561-wip.json"  # 27 runs, 4 epochs, 4 a GPU
TWO_A_GPU = RESULTS / "quality-2026-11-28-2xH200-6c906c8.json"  # detectors, 8 epochs, 2 a GPU, cut at 542 s


def _errors(result: dict, predicted: dict) -> dict[str, float]:
    return {r["name"]: (predicted[r["name"]][1] - predicted[r["name"]][0]) / r["wall_s"] - 1
            for r in result["records"] if r["status"] == "ok"}


def test_calibrating_from_the_4_a_gpu_call_predicts_the_2_a_gpu_calls_runs_within_15_percent() -> None:
    """The morning's miss: calibrated from 200-step runs 4 a GPU, 400-step runs 2 a GPU were planned 1.8x too
    fast (the measured walls were reused whatever the steps, and deflated whole, start-up too, by the sharing
    at launch). Now each configuration's start-up, step and validation are measured apart and re-scaled."""
    calibration = plan.read_calibration(FOUR_A_GPU)
    target = json.loads(TWO_A_GPU.read_text())
    predicted = plan.replan(target, quality.trained_as(target["recipes"]), calibration)
    errors = _errors(target, predicted)
    assert len(errors) == 10 and max(map(abs, errors.values())) <= 0.15, errors
    # where the runs stood when the budget cut the call: the last finished run's end, predicted and replayed
    measured = plan.timeline(target)
    last = max((r["name"] for r in target["records"] if r["status"] == "ok"), key=lambda n: measured[n][1])
    assert predicted[last][1] == pytest.approx(measured[last][1], rel=0.15)
    # the whole call: 18 runs of ~2 minutes, 2 a GPU, do not fit 540 s (the plan said 442 s)
    assert max(end for _, end in predicted.values()) > 700


def test_the_recipes_own_figures_predict_both_gpu_calls() -> None:
    two = json.loads(TWO_A_GPU.read_text())
    errors = _errors(two, plan.replan(two, quality.trained_as(two["recipes"]), {}))
    assert max(map(abs, errors.values())) <= 0.15, errors
    four = json.loads(FOUR_A_GPU.read_text())
    predicted = plan.replan(four, quality.trained_as(four["recipes"]), {})
    # 4 a GPU the replayed order drifts (runs end in another order), so the makespan, not each run, is held
    assert max(e for _, e in predicted.values()) == pytest.approx(max(e for _, e in plan.timeline(four).values()),
                                                                  rel=0.10)


def test_the_timeline_replays_the_recorded_placement_and_refuses_another() -> None:
    four = json.loads(FOUR_A_GPU.read_text())
    spans = plan.timeline(four)
    assert len(spans) == 27 and min(s for s, _ in spans.values()) == 0.0
    assert all(spans[r["name"]][1] - spans[r["name"]][0] == pytest.approx(r["wall_s"]) for r in four["records"])
    four["records"][5]["devices"] = [1 - four["records"][5]["devices"][0]]
    with pytest.raises(ValueError, match="cannot calibrate"):
        plan.timeline(four)
    # a file that records its starts is read as it is
    recorded = {"records": [{"name": "a", "wall_s": 5.0, "start_s": 2.0}], "runs_per_device": 1}
    assert plan.timeline(recorded) == {"a": (2.0, 7.0)}


def _timed(model: str, side: str, seed: int, start: float, wall: float, train: float, steps: int) -> dict:
    return {"model": model, "side": side, "nproc": 1, "seed": seed, "status": "ok", "wall_s": wall,
            "start_s": start, "train_s": train, "steps": steps, "devices": [0], "sharing": 0, "eval_s": 0.0,
            "evals": [{"step": steps, "top1": 0.5, "eval_s": 0.0}],
            "name": quality.Run(model, side, 1, seed).name}


def test_calibration_deflates_only_the_gpu_part_by_the_sharing_it_met_and_scales_by_steps() -> None:
    recipe = {"gpu_eval_s": 0.0, "gpu_fixed_s": {"plain": 1.0, "musubi": 1.0}}
    # two runs on one GPU: 10 s of start-up each, then 100 s of GPU side by side the whole time
    result = {"records": [_timed("m", "plain", 0, 0.0, 110.0, 100.0, 200),
                          _timed("m", "musubi", 0, 0.0, 110.0, 100.0, 200)],
              "recipes": {"m": recipe}, "runs_per_device": 2}
    cost = plan.calibrate(result)["m/plain/1"]
    assert cost.fixed_s == pytest.approx(10.0)
    assert cost.step_s == pytest.approx(100.0 / (1 + plan.SHARE_SLOWDOWN) / 200)
    # twice the steps, alone: start-up once, the GPU part twice as long
    rec = quality.RECIPES["classifier"]
    est = plan.estimate_s(quality.Run("m", "plain", 1, 0), replace(rec, eval_every=None), 400, "cuda",
                          {"m/plain/1": cost}, quality.DATA_SCALES["full"])
    assert est == pytest.approx(10.0 + 2 * 100.0 / (1 + plan.SHARE_SLOWDOWN))
    assert plan.fixed_s(quality.Run("m", "plain", 1, 0), rec, "cuda", est, {"m/plain/1": cost}) == pytest.approx(10.0)
    # the same runs one after the other: nothing to deflate
    result["records"][1]["start_s"] = 110.0
    assert plan.calibrate(result)["m/musubi/1"].step_s == pytest.approx(100.0 / 200)


# -- finishing over several calls: --finish, --runs and merge --------------------------------------------
def _result(seeds: list[int], commit: str, card: str = "2x NVIDIA H200, driver 580.1", **over: object) -> dict:
    recipe = {"metric": "top1", "label": "clf", "floor": 0.9, "global_batch": 64, "lr": 0.1, "epochs": 15,
              "gpu_step_s": 0.02}
    recs = [_record("c", side, n, s, v) for s in seeds for side, n, v in (("plain", 1, 0.95 + s / 100),
                                                                            ("musubi", 1, 0.955 + s / 100))]
    for r in recs:
        r["name"] = quality.Run(r["model"], r["side"], r["nproc"], r["seed"]).name
        r["lr"], r["global_batch"] = 0.1, 64
        r["log"] = [{"step": 10, "loss": 0.5, "lr": 0.1}]
    result = {"bench": "quality", "commit": commit, "card": card, "versions": "v", "command": f"call {commit}",
              "device": "cuda", "nprocs": [1], "seeds": seeds, "runs_per_device": 2, "wall_s": 100.0,
              "max_steps": None, "data": {"params": {"seed": 0, "train_scenes": 800}}, "recipes": {"c": recipe},
              "records": recs}
    result.update(over)
    return result


def test_merge_judges_the_seeds_of_several_calls_together(tmp_path: Path) -> None:
    a, b = _result([0, 1], "aaaaaaa"), _result([2], "bbbbbbb", card="1x NVIDIA H200, driver 590.2")
    a["records"][-1]["status"], a["records"][-1]["final"] = "cut by the budget", {}  # musubi seed 1: cut in A ...
    b["records"] += [{**a["records"][-1], "status": "ok", "final": {"top1": 0.965}}]  # ... finished in B
    b["recipes"]["c"]["gpu_step_s"] = 0.05  # a planning figure: not a difference
    merged, paths, text = quality.quality_merge.write([("quality-2026-11-28-2xH200-aaaaaaa.json", a),
                                                       ("quality-2026-11-29-1xH200-bbbbbbb.json", b)], tmp_path)
    assert [p.name for p in paths] == [f"quality-2026-11-29-2xH200-aaaaaaa+bbbbbbb-merged{s}"
                                       for s in (".json", ".md", ".png")]
    recs = {r["name"]: r for r in merged["records"]}
    assert sorted(recs) == sorted(f"c-{arm}-s{s}" for arm in ("plain", "musubi1") for s in (0, 1, 2))
    assert recs["c-musubi1-s1"]["status"] == "ok" and recs["c-musubi1-s1"]["call"].endswith("bbbbbbb.json")
    assert recs["c-musubi1-s2"]["lr_check"] == {"lr_as_written": True, "global_batch_equal": True,
                                                "lr_curve_max_rel_diff": 0.0}
    row = next(r for r in merged["rows"] if r["side"] == "musubi")
    assert row["verdict"] == "PASS" and merged["seeds"] == [0, 1, 2]
    assert "merged from 2 calls" in text and json.loads(paths[0].read_text())["verdicts"] == {"c": "PASS"}


@pytest.mark.parametrize(("change", "match"), [
    ({"device": "cpu"}, "device 'cpu'"),
    ({"card": "2x NVIDIA H100 80GB HBM3, driver 580.1"}, "card"),
    ({"max_steps": 3}, "max_steps 3"),
    ({"data": {"params": {"seed": 0, "train_scenes": 64}}}, r"data differ .*\(train_scenes\)"),
    ({"recipes": {"c": {"metric": "top1", "label": "clf", "floor": 0.9, "global_batch": 64, "lr": 0.2,
                        "epochs": 15}}}, "recipe 'c' differs .* in lr"),
])
def test_merge_refuses_files_that_did_not_train_alike(change: dict, match: str, tmp_path: Path) -> None:
    a, b = _result([0, 1], "aaaaaaa"), _result([2], "bbbbbbb", **change)
    with pytest.raises(quality.quality_merge.MergeRefused, match=match):
        quality.quality_merge.merge([("A.json", a), ("B.json", b)])
    for name, result in (("A.json", a), ("B.json", b)):
        (tmp_path / name).write_text(json.dumps(result))
    assert quality.main(["merge", str(tmp_path / "A.json"), str(tmp_path / "B.json"), "--out-dir",
                         str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()  # nothing written


def test_merge_refuses_a_run_finished_twice_and_a_single_file(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _result([0, 1], "aaaaaaa"), _result([1, 2], "bbbbbbb")
    with pytest.raises(quality.quality_merge.MergeRefused, match="c-plain-s1 finished in both A.json and B.json"):
        quality.quality_merge.merge([("A.json", a), ("B.json", b)])
    with pytest.raises(quality.quality_merge.MergeRefused, match="two result files"):
        quality.quality_merge.merge([("A.json", a)])
    # --finish of such files is refused before it runs anything
    (tmp_path / "A.json").write_text(json.dumps(a))
    (tmp_path / "B.json").write_text(json.dumps(b))
    with pytest.raises(SystemExit):
        quality.parse_args(["--finish", f"{tmp_path / 'A.json'},{tmp_path / 'B.json'}"])
    assert "--finish: c-plain-s1 finished in both" in capsys.readouterr().err


def test_finish_plans_what_the_cut_call_left_and_fits_one_device_call(capsys: pytest.CaptureFixture[str]) -> None:
    """The lead's next call: seed 1 of Musubi on 2 GPUs and seed 2 of every arm, 2 GPUs, within 540 s."""
    a = quality.parse_args(["--device", "cuda", "--finish", str(TWO_A_GPU)])
    left = sorted(r.name for r in quality.chosen_runs(a))
    assert left == sorted([f"{m}-musubi2-s1" for m in ("cnn_detector", "detr")]
                          + [f"{m}-{arm}-s2" for m in ("cnn_detector", "detr") for arm in ("plain", "musubi1", "musubi2")])
    assert a.recipes["detr"].epochs == a.recipes["cnn_detector"].epochs == 8 and a.data_scale == "full"
    assert quality.main(["--device", "cuda", "--gpus", "2", "--finish", str(TWO_A_GPU), "--calibrate", str(TWO_A_GPU),
                         "--budget-s", "540", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 8 runs" in out and "calibration: 6 configurations" in out
    whole = float(out.split("about ")[1].split(" s for the whole command")[0])
    assert whole <= 540 * 0.85  # room for the estimate's error (~10 % a run)
    a = quality.parse_args(["--device", "cuda", "--finish", str(TWO_A_GPU), "--runs", "detr-plain-s2"])
    assert [r.name for r in quality.chosen_runs(a)] == ["detr-plain-s2"]
    for bad in (["--runs", "detr-plain-s0"], ["--runs", "detr-plain-s9"]):
        with pytest.raises(SystemExit, match="--runs: detr-plain-s"):
            quality.chosen_runs(quality.parse_args(["--device", "cuda", "--finish", str(TWO_A_GPU), *bad]))
    with pytest.raises(SystemExit):
        quality.parse_args(["--finish", str(TWO_A_GPU), "--seeds", "2"])
    assert "--finish takes --seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        quality.parse_args(["--device", "cpu", "--finish", str(TWO_A_GPU)])
    assert "pass --device cuda" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_cpu_call_finished_by_a_second_merges_into_one_report(two_calls: dict) -> None:
    """Call 1 runs the plain loop only (--runs); call 2 (--finish) runs what is left, Musubi on 1 and 2 ranks, and
    writes its own report and the merged one; `merge` of the two files gives the same rows."""
    tmp, out, common, first = two_calls["tmp"], two_calls["out"], two_calls["common"], two_calls["first"]
    assert two_calls["codes"] == (1, 1)  # no verdict with one seed: no PASS, either call
    assert [r["name"] for r in json.loads(first.read_text())["records"]] == ["classifier-plain-s0"]
    # the second file: stem-2 when both calls ran at one commit (not overwriting the first)
    (second,) = set(out.glob("quality-*.json")) - {first} - set(out.glob("*-merged.json"))
    assert sorted(r["name"] for r in json.loads(second.read_text())["records"]) == ["classifier-musubi1-s0",
                                                                                   "classifier-musubi2-s0"]
    (merged_file,) = out.glob("quality-*-merged.json")
    merged = json.loads(merged_file.read_text())
    recs = {r["name"]: r for r in merged["records"]}
    assert sorted(recs) == ["classifier-musubi1-s0", "classifier-musubi2-s0", "classifier-plain-s0"]
    assert {r["status"] for r in recs.values()} == {"ok"} and {r["steps"] for r in recs.values()} == {2}
    # the LR curve is checked against the plain run of the other call
    assert recs["classifier-musubi1-s0"]["lr_check"]["lr_curve_max_rel_diff"] == 0.0
    assert recs["classifier-musubi1-s0"]["final"]["top1"] == pytest.approx(
        recs["classifier-plain-s0"]["final"]["top1"], abs=0.01)
    assert (merged_file.with_suffix(".md")).read_text().startswith("Quality parity") and merged_file.with_suffix(
        ".png").stat().st_size > 1000
    again = tmp / "again"
    assert quality.main(["merge", str(first), str(second), "--out-dir", str(again)]) == 1
    (twice,) = again.glob("*.json")
    assert json.loads(twice.read_text())["rows"] == merged["rows"]
    # nothing is left to finish: said, not run
    with pytest.raises(SystemExit, match="nothing to run"):
        quality.main([*common, "--finish", f"{first},{second}"])


def test_a_second_call_at_the_same_commit_does_not_overwrite_the_first(tmp_path: Path) -> None:
    assert quality.free_stem(tmp_path, "quality-x") == "quality-x"
    (tmp_path / "quality-x.json").write_text("{}")
    assert quality.free_stem(tmp_path, "quality-x") == "quality-x-2"
    (tmp_path / "quality-x-2.json").write_text("{}")
    assert quality.free_stem(tmp_path, "quality-x") == "quality-x-3"


def test_finish_refuses_other_cards_before_any_run() -> None:
    earlier = [("A.json", {"card": "2x NVIDIA H200, driver 580.159.04"})]
    quality.check_card(earlier, "1x NVIDIA H200, driver 590.1")  # the count and the driver may differ
    with pytest.raises(SystemExit, match="this machine has NVIDIA H100 80GB HBM3, A.json ran on NVIDIA H200"):
        quality.check_card(earlier, "2x NVIDIA H100 80GB HBM3, driver 580.159.04")
