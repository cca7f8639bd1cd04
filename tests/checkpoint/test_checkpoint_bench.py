"""bench/checkpoint.py, the saves probe: its variants' interleaved order, the median's interval and the verdicts,
the summary's pairing by round; one CPU launch that plans its rounds by the budget; the GIL probe."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.pythonpath import repo_on_path

_spec = importlib.util.spec_from_file_location("checkpoint_bench", REPO / "bench" / "checkpoint.py")
cb = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cb
_spec.loader.exec_module(cb)


def test_every_mode_meets_every_nice_and_each_round_shuffles_them_alike_on_every_call() -> None:
    v = cb.variants("process,thread", "0,10")
    assert [x[0] for x in v] == ["process/nice0", "process/nice10", "thread/nice0", "thread/nice10"]
    assert v[1] == ("process/nice10", "process", 10, None)  # DCP's copy-ahead unless copy-aheads are compared
    w = cb.variants("process", "10", "10,0")
    assert w == [("process/nice10/ahead10", "process", 10, 10_000_000), ("process/nice10/ahead0", "process", 10, 0)]
    assert cb.default_label(False, [x[0] for x in w]) == "process/nice10/ahead10"
    assert cb.default_label(True, [x[0] for x in v]) == "thread/nice10"
    labels = [x[0] for x in v]
    orders = [cb.round_order(labels, 0, r) for r in range(6)]
    assert all(sorted(o) == sorted(labels) for o in orders)
    assert orders == [cb.round_order(labels, 0, r) for r in range(6)]  # every rank computes the same order
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order: no variant always follows the same one
    assert len({o[0] for o in orders}) > 1


def test_the_medians_interval_is_the_widest_order_statistics_it_needs_and_says_its_coverage() -> None:
    assert cb.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0, 0.9375)  # 5 values: min..max, 94 %
    lo, hi, cov = cb.median_interval([float(x) for x in range(1, 10)])  # 9 values: x(2)..x(8) holds 96 %
    assert (lo, hi) == (2.0, 8.0) and cov == pytest.approx(1 - 2 * 10 / 512)
    lo, hi, cov = cb.median_interval([1.0, 2.0, 3.0])
    assert (lo, hi, cov) == (1.0, 3.0, 0.75)


def test_a_verdict_needs_the_whole_interval_on_one_side_and_five_rounds() -> None:
    assert cb.verdict([0.96, 0.97, 0.99, 0.98, 1.01], 0.95, True) == "meets"
    assert cb.verdict([0.80, 0.90, 0.93, 0.85, 0.94], 0.95, True) == "misses"
    assert cb.verdict([0.90, 0.97, 0.99, 0.98, 1.01], 0.95, True).startswith("not settled (the median's interval")
    assert cb.verdict([0.99, 0.99, 0.99], 0.95, True) == "not settled (3 round(s), 5 needed)"
    assert cb.verdict([0.02, 0.03, 0.01, 0.02, 0.04], 0.05, False) == "meets"  # blocked: lower is better
    assert cb.verdict([0.02, 0.03, 0.01, 0.02, 0.06], 0.05, False).startswith("not settled")


def _save(variant: str, r: int, thr: float, blocked: float = 0.05) -> dict:
    return {"variant": variant, "round": r, "throughput": thr, "blocked_s": blocked, "durable_s": 4.0,
            "worst_step_ms": 40.0, "gc": {"collections": [3, 1, 1 if thr < 0.9 else 0], "max_ms": 2.0}}


def test_each_variant_is_paired_with_nice_zero_and_with_the_first_copy_ahead() -> None:
    labels = [x[0] for x in cb.variants("process,thread", "0,10", "10,0")]
    assert cb.paired_base("thread/nice10/ahead0", labels, "nice") == "thread/nice0/ahead0"
    assert cb.paired_base("thread/nice10/ahead0", labels, "ahead") == "thread/nice10/ahead10"
    assert cb.paired_base("thread/nice0/ahead10", labels, "nice") is None  # the base itself
    assert cb.paired_base("process/nice10", ["process/nice10"], "nice") is None  # nice 0 not measured


def test_the_summary_pairs_each_nice_with_nice_zero_by_round() -> None:
    labels = ["process/nice0", "process/nice10"]
    # the machine drifts between rounds (all variants move together); nice 10 is 3 points faster in each round
    drift = [0.80, 0.95, 0.88, 1.00, 0.84]
    saves = [s for r, d in enumerate(drift) for s in (_save(labels[0], r, d), _save(labels[1], r, d + 0.03))]
    out = cb.summarise(saves, sync_save_s=2.0, labels=labels)
    row = out["variants"]["process/nice10"]
    assert row["rounds"] == 5 and row["throughput"]["median"] == pytest.approx(0.91)
    assert row["throughput"]["verdict"].startswith("not settled")  # the drift spans the target
    assert row["blocked_vs_sync"]["median"] == pytest.approx(0.025) and row["blocked_vs_sync"]["verdict"] == "meets"
    pair = out["paired"]["process/nice10 - process/nice0"]
    assert pair["median_points"] == pytest.approx(3.0) and pair["interval_points"] == [3.0, 3.0]
    assert pair["reads"] == "nice 10 faster during the save"  # paired by round, the drift cancels
    assert out["variants"]["process/nice0"]["gc_in_saves"]["gen2"] == 3  # the rounds below 0.9


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One CPU launch of the saves probe: 2 ranks, tiny GPT, 4 variants; a budget spent before the rounds start,
    so the rounds stop at --min-rounds though --rounds allows more."""
    out = tmp_path_factory.mktemp("ckpt-bench") / "checkpoint.json"
    env = dict(os.environ, PYTHONPATH=repo_on_path(REPO), MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(REPO / "bench" / "checkpoint.py"), "--cpu", "--tiny", "--nproc", "2",
                          "--no-recovery", "--rounds", "4", "--min-rounds", "2", "--budget-s", "16",
                          "--base-steps", "4", "--steps", "4", "--sync-repeats", "1", "--json-out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return {"json": json.loads(out.read_text()), "stdout": res.stdout,
            "rounds": json.loads(out.with_name("checkpoint.rounds.json").read_text())}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_launch_measures_every_variant_in_shuffled_rounds_within_its_budget(launch: dict) -> None:
    r = launch["json"]
    saves = r["saves"]
    labels = ["process/nice0", "process/nice10", "thread/nice0", "thread/nice10"]
    assert saves["rounds"] == 2  # the budget (16 s, 1 s after the teardown's share) was gone: --min-rounds only
    assert saves["settled_heap"] and saves["gc_frozen"] > 0  # as musubi train's heap
    full = saves["full_collection_ms"]
    assert full["tracked_objects"] > 10_000 and full["settled"] < full["unsettled"]  # settling is what makes it cheap
    assert [s["variant"] for s in saves["saves"]] == cb.round_order(labels, 0, 0) + cb.round_order(labels, 0, 1)
    for s in saves["saves"]:
        assert s["blocked_s"] > 0 and s["base_step_s"] > 0 and set(s["gc"]) >= {"collections", "max_ms", "threads"}
        assert s["throughput"] is None or s["throughput"] > 0
    summ = r["summary"]["variants"]
    assert list(summ) == labels and all(v["rounds"] == 2 for v in summ.values())
    assert all(v["throughput"]["verdict"] == "not settled (2 round(s), 5 needed)"
               for v in summ.values() if v["throughput"]["median"] is not None)
    assert r["default_variant"] == "thread/nice10"  # CPU ranks: async_mode auto is thread
    # the ranks' own file, rewritten after every round (a cut-short call keeps its rounds), ends complete
    assert launch["rounds"]["rounds"] == 2 and "partial" not in launch["rounds"]
    out = launch["stdout"]
    assert "2 round(s) of 4 variants" in out and "default (thread/nice10, async_mode auto)" in out


def test_bad_options_are_refused_in_one_line() -> None:
    for args, words in ((["--modes", "proc"], "async modes are process and thread"),
                        (["--writer-nice", "ten"], "--writer-nice 'ten': give numbers"),
                        (["--writer-copy-ahead-mb", "10,x"], "--writer-copy-ahead-mb '10,x': give numbers"),
                        (["--rounds", "2", "--min-rounds", "3"], "--min-rounds <= --rounds")):
        res = subprocess.run([sys.executable, str(REPO / "bench" / "checkpoint.py"), *args], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode != 0 and words in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_gil_probe_runs_steps_beside_saves_from_a_thread(tmp_path: Path) -> None:
    out = tmp_path / "gil.json"
    res = subprocess.run([sys.executable, str(REPO / "bench" / "checkpoint.py"), "--gil-probe", "--probe-mb", "20",
                          "--probe-ops", "50", "--probe-wait-ms", "2", "--rounds", "1", "--min-rounds", "1",
                          "--base-steps", "3", "--json-out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    probe = json.loads(out.read_text())
    assert sorted(probe["rows"]) == ["nice0/switch0.5ms", "nice0/switch5ms", "nice10/switch0.5ms", "nice10/switch5ms"]
    assert len(probe["saves"]) == 4 and all(s["save_s"] > 0 for s in probe["saves"])
    assert "GIL probe nice10/switch5ms" in res.stdout
