"""Leaderboard math: hand-computed scores, ties, missing metrics, FPS target, fleet states, history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.contract.errors import ConfigError
from musubi.evaluate.leaderboard import build_leaderboard
from musubi.evaluate.registry import leaderboard_history
from musubi.evaluate.score import ScoreRule, composite, fps_norm
from musubi.store.rundir import write_json
from tests.evaluate.runs import external_job, task_job


def by_job(rows: list[dict]) -> dict[str, dict]:
    return {r["job"]: r for r in rows}


def test_default_score_hand_computed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "a", metrics={"map50": 0.5}, fps=100.0)
    task_job(run, "b", metrics={"map50": 0.8}, fps=50.0)
    task_job(run, "c", task="classification", metrics={"top1": 0.9, "val_loss": 2.0}, fps=25.0)
    rows = build_leaderboard(run)
    r = by_job(rows)
    # One table per metric, each normalised by its own best fps. mAP50 (best fps 100): a = .7*.5 + .3*1 = .65,
    # b = .7*.8 + .3*.5 = .71; top-1 (alone, best fps 25): c = .7*.9 + .3*1 = .93.
    assert r["a"]["score"] == pytest.approx(0.65)
    assert r["b"]["score"] == pytest.approx(0.71)
    assert r["c"]["score"] == pytest.approx(0.93)
    assert [(x["job"], x["table"], x["rank"]) for x in rows] == [("b", "map50", 1), ("a", "map50", 2),
                                                                 ("c", "top1", 1)]
    assert r["c"]["metric"] == "top1" and r["a"]["metric"] == "map50"
    assert r["b"]["fps_norm"] == pytest.approx(0.5)
    board = json.loads((run / "leaderboard.json").read_text())
    assert board["formula"] == "score = 0.7 x quality + 0.3 x fps_norm"
    assert [(t["metric"], t["ranked"], t["fps_normalisation"]) for t in board["tables"]] == [
        ("map50", 2, "fps_norm = fps / 100 (best fps of the ranked jobs: a)"),
        ("top1", 1, "fps_norm = fps / 25 (best fps of the ranked jobs: c)")]
    assert board["fps_normalisation"].startswith("per table: map50: fps_norm = fps / 100")
    assert board["tables"][0]["fps_protocol"] == "torch-cpu on cpu, CPU threads not stated"
    assert board["quality_floor"]["share"] == 0.5
    assert board["quality_metrics"]["lm"] == "val_acc"
    assert [x["job"] for x in board["rows"]] == ["b", "a", "c"]


def test_ties_share_a_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "x", metrics={"map50": 0.5}, fps=100.0)  # .35 + .3 = .65
    task_job(run, "y", metrics={"map50": 0.5 / 0.7}, fps=50.0)  # .5 + .15 = .65 (float noise aside)
    task_job(run, "w", metrics={"map50": 0.5}, fps=100.0)  # the same as x exactly
    task_job(run, "z", metrics={"map50": 0.4}, fps=10.0)  # above the floor (0.5 x 0.714): ranked
    rows = build_leaderboard(run)
    # Ties: higher quality first, then by name; equal scores share the rank, the next rank skips.
    assert [(x["job"], x["rank"]) for x in rows] == [("y", 1), ("w", 1), ("x", 1), ("z", 4)]


def test_speed_alone_never_wins(tmp_path: Path) -> None:
    """A zero-quality model and one below the floor are listed, unranked, and do not set the FPS base."""
    run = tmp_path / "run"
    task_job(run, "zero", metrics={"map50": 0.0}, fps=1000.0)  # the case: fastest, mAP50 0
    task_job(run, "weak", metrics={"map50": 0.2}, fps=500.0)  # 0.2 < 0.5 x 0.6
    task_job(run, "good", metrics={"map50": 0.6}, fps=20.0)
    task_job(run, "ok", metrics={"map50": 0.3}, fps=40.0)  # exactly at the floor: ranked
    # Its own metric's best, but under the absolute floor (top1 0.1 when the number of classes is unknown).
    task_job(run, "cls", task="classification", metrics={"top1": 0.05}, fps=900.0)
    rows = build_leaderboard(run)
    assert [(r["job"], r["rank"]) for r in rows] == [
        ("good", 1), ("ok", 2), ("weak", None), ("zero", None), ("cls", None)]
    r = by_job(rows)
    # FPS normalised among the ranked jobs of the table only: ok's 40 is the base, not zero's 1000.
    assert r["ok"]["fps_norm"] == 1.0 and r["good"]["fps_norm"] == pytest.approx(0.5)
    assert r["cls"]["reason"].startswith("below the absolute floor: top1 0.05 < 0.1 (default with the number of "
                                         "classes unknown")
    assert r["zero"]["below_floor"] and r["zero"]["score"] is None and "map50 is 0" in r["zero"]["reason"]
    assert r["weak"]["reason"] == "below the quality floor: map50 0.2 < 0.5 x 0.6 (best, good)"
    # Whatever the weights and the floor, quality 0 is never ranked.
    for weights, floor in (((0.0, 1.0), 0.0), ((0.1, 0.9), 0.0)):
        rows = build_leaderboard(run, weights=weights, quality_floor=floor, history=False)
        assert rows[0]["job"] != "zero" and by_job(rows)["zero"]["rank"] is None
    only_zero = tmp_path / "zero-run"
    task_job(only_zero, "zero", metrics={"map50": 0.0}, fps=1000.0)
    rows = build_leaderboard(only_zero, history=False)
    assert rows[0]["rank"] is None
    board = json.loads((only_zero / "leaderboard.json").read_text())
    assert board["fps_normalisation"] == "fps_norm = fps / best fps of the ranked jobs (no job was ranked)"
    with pytest.raises(ConfigError, match="quality floor"):
        ScoreRule(quality_floor=1.5)


def test_fps_target_caps_at_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "fast", metrics={"map50": 0.4}, fps=120.0)
    task_job(run, "slow", metrics={"map50": 0.6}, fps=30.0)
    rows = by_job(build_leaderboard(run, fps_target=60.0))
    assert rows["fast"]["fps_norm"] == 1.0  # min(1, 120/60)
    assert rows["slow"]["fps_norm"] == pytest.approx(0.5)
    assert rows["fast"]["score"] == pytest.approx(0.7 * 0.4 + 0.3)
    assert rows["slow"]["score"] == pytest.approx(0.7 * 0.6 + 0.15)
    board = json.loads((run / "leaderboard.json").read_text())
    assert board["fps_normalisation"] == "fps_norm = min(1, fps / 60) (configured target fps)"
    assert board["fps_base"] == 60.0


def test_custom_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "a", metrics={"map50": 0.5}, fps=100.0)
    task_job(run, "b", metrics={"map50": 0.9}, fps=10.0)
    rows = by_job(build_leaderboard(run, weights=(0.2, 0.8)))
    assert rows["a"]["score"] == pytest.approx(0.2 * 0.5 + 0.8)
    assert rows["b"]["score"] == pytest.approx(0.2 * 0.9 + 0.8 * 0.1)
    assert rows["a"]["rank"] == 1


def test_unscorable_jobs_listed_last_with_reason(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "good", metrics={"map50": 0.3}, fps=20.0)
    task_job(run, "no-eval", status="running")
    task_job(run, "no-gt", metrics={"map50": -1.0}, fps=20.0)
    task_job(run, "loss-only", task="pkg.mod:make", metrics={"val_loss": 3.2}, fps=20.0, primary="val_loss")
    task_job(run, "no-fps", metrics={"map50": 0.9})
    task_job(run, "crashed", metrics={"map50": 0.99}, fps=99.0, status="failed")
    external_job(run, "ext", {"metrics": {"map50": 0.5}, "fps_missing": "the external program reported no fps"})
    rows = build_leaderboard(run)
    assert rows[0]["job"] == "good" and rows[0]["rank"] == 1
    rest = by_job(rows[1:])
    assert all(r["rank"] is None and r["score"] is None for r in rest.values())
    assert [r["job"] for r in rows[1:]] == sorted(rest)  # unranked: by name
    assert rest["no-eval"]["reason"] == "no eval.json (status running)"
    assert "no ground truth" in rest["no-gt"]["reason"]
    assert "not a fraction in [0, 1]" in rest["loss-only"]["reason"]
    assert rest["no-fps"]["reason"].startswith("no FPS measured")
    assert rest["crashed"]["reason"] == "failed"
    assert rest["ext"]["reason"] == "the external program reported no fps" and rest["ext"]["kind"] == "external"
    # The best FPS is taken among ranked jobs only: the crashed job's 99 fps does not count.
    assert rows[0]["fps_norm"] == 1.0


def test_fps_weight_zero_ranks_without_fps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "no-fps", metrics={"map50": 0.9})
    task_job(run, "with-fps", metrics={"map50": 0.5}, fps=10.0)
    rows = build_leaderboard(run, weights=(1.0, 0.0))
    assert [(r["job"], r["rank"], r["score"]) for r in rows] == [("no-fps", 1, 0.9), ("with-fps", 2, 0.5)]
    board = json.loads((run / "leaderboard.json").read_text())
    assert board["fps_normalisation"] == "fps not scored (weight 0)"


def test_fleet_json_is_authoritative(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "a", metrics={"map50": 0.5}, fps=10.0)
    task_job(run, "a.attempt1", metrics={"map50": 0.9}, fps=10.0)  # a failed attempt moved aside
    external_job(run, "ext", None)
    write_json(run / "fleet.json", {"fleet": "f", "jobs": {
        "a": {"state": "done", "causes": []}, "ext": {"state": "failed", "causes": ["exit 3", "exit 4"]}}})
    rows = build_leaderboard(run)
    assert [r["job"] for r in rows] == ["a", "ext"]
    assert rows[1]["reason"] == "failed: exit 4"


def test_attempt_folders_skipped_without_fleet_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "a", metrics={"map50": 0.5}, fps=10.0)
    task_job(run, "a.attempt1", metrics={"map50": 0.9}, fps=10.0)
    (run / "not-a-job").mkdir()
    assert [r["job"] for r in build_leaderboard(run)] == ["a"]


def test_mixed_runtimes_warned(tmp_path: Path) -> None:
    run = tmp_path / "run"
    task_job(run, "a", metrics={"map50": 0.5}, fps=10.0)
    external_job(run, "b", {"metrics": {"map50": 0.4}, "fps": {"fps": 30.0, "runtime": "tensorrt"}})
    build_leaderboard(run)
    board = json.loads((run / "leaderboard.json").read_text())
    assert "different runtimes" in board["warning"] and "tensorrt" in board["warning"]


def test_history_is_kept_in_the_store(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    task_job(run, "a", metrics={"map50": 0.5}, fps=10.0)
    build_leaderboard(run)
    task_job(run, "a", metrics={"map50": 0.6}, fps=10.0)
    build_leaderboard(run)
    hist = leaderboard_history("a", run_dir=run)
    assert [h["score"] for h in hist] == pytest.approx([0.35 + 0.3, 0.42 + 0.3])
    assert (tmp_path / "runs" / "musubi.db").is_file()


@pytest.mark.parametrize("weights, fragment", [
    ((-0.1, 0.5), "quality weight"),
    ((0.0, 0.0), "both 0"),
    ((0.5, float("nan")), "fps weight"),
])
def test_bad_weights_refused(weights: tuple[float, float], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ScoreRule(*weights)


def test_bad_target_and_missing_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fps target"):
        ScoreRule(fps_target=0.0)
    with pytest.raises(ConfigError, match="no such run directory"):
        build_leaderboard(tmp_path / "nope")


def test_score_helpers() -> None:
    rule = ScoreRule()
    assert composite(rule, 0.5, fps_norm(rule, 50.0, 100.0)) == pytest.approx(0.5)
    target = ScoreRule(fps_target=30.0)
    assert fps_norm(target, 90.0, 30.0) == 1.0


def test_cli_shows_the_fleets_own_weights_and_writes_only_when_asked(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from musubi.cli import app

    run = tmp_path / "runs" / "r1"
    task_job(run, "accurate", metrics={"map50": 0.812345}, fps=10.0)
    task_job(run, "fast", metrics={"map50": 0.6}, fps=100.0)
    write_json(run / "run.json", {"config": {"name": "f", "leaderboard": {
        "quality_weight": 1.0, "fps_weight": 0.0, "fps_target": None, "export_top": 1}}})
    (run / "leaderboard.json").unlink(missing_ok=True)
    cli = CliRunner()
    # no board yet: ranked by the fleet's weights, shown, nothing written
    res = cli.invoke(app, ["leaderboard", str(run)])
    assert res.exit_code == 0, res.output
    assert "score = 1 x quality + 0 x fps_norm" in res.output
    assert "0.8123" in res.output and "…" not in res.output  # not cut to 80 columns under a pipe
    assert not (run / "leaderboard.json").exists() and leaderboard_history("accurate", run_dir=run) == []
    # other weights are only shown; --write records them (file and history)
    res = cli.invoke(app, ["leaderboard", str(run), "--weights", "0.7,0.3", "--json"])
    assert json.loads(res.output)["rows"][0]["job"] == "fast" and not (run / "leaderboard.json").exists()
    res = cli.invoke(app, ["leaderboard", str(run), "--write"])
    assert res.exit_code == 0, res.output
    written = (run / "leaderboard.json").read_text()
    assert json.loads(written)["rows"][0]["job"] == "accurate"
    assert len(leaderboard_history("accurate", run_dir=run)) == 1
    # viewing the written board changes neither the file nor the history
    res = cli.invoke(app, ["leaderboard", str(run)])
    assert res.exit_code == 0 and "accurate" in res.output
    assert (run / "leaderboard.json").read_text() == written
    assert len(leaderboard_history("accurate", run_dir=run)) == 1
    res = cli.invoke(app, ["leaderboard", str(run), "--history", "--json"])
    assert [(h["job"], h["rank"]) for h in json.loads(res.output)] == [("accurate", 1), ("fast", 2)]


def test_absolute_floor_ranks_no_model_that_does_not_do_the_job(tmp_path: Path) -> None:
    """The issue's fleet: every detector near mAP50 0, the fastest (0.00028) ranked first and shipped on speed.
    Now none is ranked, each says why; a classifier is judged against chance for its classes."""
    run = tmp_path / "run"
    task_job(run, "fast-blind", metrics={"map50": 0.00028}, fps=1000.0)
    task_job(run, "slow-blind", metrics={"map50": 0.0002}, fps=10.0)
    for name, top1 in (("at-chance", 0.15), ("learned", 0.25)):
        d = task_job(run, name, task="classification", metrics={"top1": top1}, fps=50.0)
        record = json.loads((d / "eval.json").read_text())
        write_json(d / "eval.json", {**record, "classes": [f"c{i}" for i in range(10)]})
    rows = by_job(build_leaderboard(run))
    assert rows["fast-blind"]["rank"] is None and rows["slow-blind"]["rank"] is None
    assert rows["fast-blind"]["reason"] == ("below the absolute floor: map50 0.00028 < 0.05 (default; "
                                            "leaderboard.min_quality sets it): not ranked, whatever its speed")
    # 10 classes: chance 0.1, floor 0.1 + 0.1 x 0.9 = 0.19.
    assert rows["at-chance"]["rank"] is None and "top1 0.15 < 0.19 (chance 0.1 (1/10 classes)" in \
        rows["at-chance"]["reason"]
    assert rows["learned"]["rank"] == 1
    board = json.loads((run / "leaderboard.json").read_text())
    assert [(t["metric"], t["jobs"], t["ranked"]) for t in board["tables"]] == [("map50", 2, 0), ("top1", 2, 1)]
    assert "map50 >= 0.05" in board["quality_floor"]["rule"] and board["quality_floor"]["min_quality"]["map50"] == 0.05
    # A floor of the user's: raised for mAP50, lowered to let the blind models in (then the relative one rules).
    rows = by_job(build_leaderboard(run, min_quality={"map50": 0.0001}, history=False))
    assert rows["fast-blind"]["rank"] == 1 and rows["slow-blind"]["rank"] == 2
    rows = by_job(build_leaderboard(run, min_quality={"top1": 0.3}, history=False))
    assert rows["learned"]["rank"] is None and "(leaderboard.min_quality)" in rows["learned"]["reason"]
    with pytest.raises(ConfigError, match="min_quality map50 2"):
        ScoreRule(min_quality={"map50": 2})


def test_unlike_fps_protocols_warned_per_table(tmp_path: Path) -> None:
    """CPU FPS timed at different thread counts (or on different devices) is stated and warned."""
    run = tmp_path / "run"
    for name, threads in (("one", 1), ("four", 4)):
        d = task_job(run, name, metrics={"map50": 0.5}, fps=10.0)
        record = json.loads((d / "eval.json").read_text())
        write_json(d / "eval.json", {**record, "fps": {**record["fps"], "threads": threads}})
    build_leaderboard(run)
    board = json.loads((run / "leaderboard.json").read_text())
    assert board["tables"][0]["fps_protocol"] is None
    assert "torch-cpu on cpu, 1 CPU thread | torch-cpu on cpu, 4 CPU threads" in board["warning"]
    d = task_job(run, "four", metrics={"map50": 0.5}, fps=10.0)
    record = json.loads((d / "eval.json").read_text())
    write_json(d / "eval.json", {**record, "fps": {**record["fps"], "threads": 1}})
    build_leaderboard(run)
    board = json.loads((run / "leaderboard.json").read_text())
    assert board["tables"][0]["fps_protocol"] == "torch-cpu on cpu, 1 CPU thread" and "warning" not in board
