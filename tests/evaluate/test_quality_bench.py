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
    assert quality.simulate(ordered, est, 2, 2)[0] == pytest.approx(10.0 * (1 + quality.SHARE_SLOWDOWN))
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
    assert half == pytest.approx(5.0 + 5.0 * (1 + quality.SHARE_SLOWDOWN))
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
    one, two = quality.step_s(det, 1), quality.step_s(det, 2)
    assert one == det.gpu_step_s and two == pytest.approx(det.gpu_step_s * (1 - det.gpu_image_share / 2))
    clf = quality.RECIPES["classifier"]
    assert quality.step_s(clf, 2) == quality.step_s(clf, 1)  # launch-bound: a smaller batch is no faster
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


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cpu_rehearsal_trains_both_sides_alike(tmp_path: Path) -> None:
    """The whole bench on the classifier, 2 steps: plain loop, Musubi on 1 and 2 gloo ranks, one seed."""
    pytest.importorskip("sklearn")
    out = tmp_path / "out"
    code = quality.main(["--device", "cpu", "--nprocs", "1,2", "--seeds", "0", "--max-steps", "2", "--data-scale",
                         "smoke", "--models", "classifier", "--work", str(tmp_path / "work"), "--out-dir", str(out)])
    assert code == 1  # one seed: no verdict, so no PASS
    (result_file,) = out.glob("quality-*-cpu-*.json")
    result = json.loads(result_file.read_text())
    recs = {r["name"]: r for r in result["records"]}
    plain, one, two = (recs[f"classifier-{side}-s0"] for side in ("plain", "musubi1", "musubi2"))
    assert [r["status"] for r in (plain, one, two)] == ["ok"] * 3 and {r["steps"] for r in (plain, one, two)} == {2}
    for r in (one, two):
        assert r["lr_check"] == {"lr_as_written": True, "global_batch_equal": True, "lr_curve_max_rel_diff": 0.0}
        # the metric curve: validations at the same steps on both sides (--max-steps 2 ends the first epoch)
        assert [e["step"] for e in r["evals"]] == [e["step"] for e in plain["evals"]] == [2]
    # One rank trains the plain loop's weights step for step: the same losses, the same validation.
    assert one["log"][-1]["loss"] == pytest.approx(plain["log"][-1]["loss"], rel=1e-4)
    assert one["final"]["top1"] == pytest.approx(plain["final"]["top1"], abs=0.01)
    rows = {(r["side"], r["nproc"]): r for r in result["rows"]}
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
