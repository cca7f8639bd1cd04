"""Calibration fits matmul efficiency, bus bandwidth and one step scale from measured figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.plan import PlanError, get_gpu, make_cluster, parse_layout, predict, preset
from musubi.plan.calibrate import calibrate, load_calibration


def test_fractions_of_the_catalog_peaks() -> None:
    eff, report = calibrate({"gpu": "A100-80GB", "matmul_tflops": 234.0, "hbm_gbps": 1631.2,
                             "allreduce_busbw_gbps": {"nvlink": 225.0, "network": 21.0}})
    assert eff.matmul == pytest.approx(0.75) and eff.hbm == pytest.approx(0.8)
    assert eff.nvlink == pytest.approx(0.75) and eff.network == pytest.approx(0.84)
    assert report["gpu"] == "A100-80GB" and "step_scale" not in report


def test_step_time_sets_one_scale_that_reproduces_the_measured_step() -> None:
    data = {"gpu": "H100-SXM", "matmul_tflops": 700.0, "step_time_s": 2.0, "model": "llama3-8b",
            "layout": "zero=3,micro=1", "gpus": 8, "global_batch": 16}
    eff, report = calibrate(data)
    p = predict(preset("llama3-8b"), make_cluster(get_gpu("H100-SXM"), 8), parse_layout("zero=3,micro=1"), 16,
                eff)
    assert p.step_time_s == pytest.approx(2.0, rel=1e-9)
    assert report["step_scale"] == eff.step_scale


@pytest.mark.parametrize(("data", "needle"), [
    ({"matmul_tflops": 1.0}, "missing field 'gpu'"),
    ({"gpu": "H100-SXM", "matmul_tflop": 1.0}, "unknown field 'matmul_tflop'"),
    ({"gpu": "H100-SXM", "matmul_tflops": 2000.0}, "of the catalog peak"),
    ({"gpu": "H100-SXM", "matmul_tflops": -1}, "positive number"),
    ({"gpu": "L40S", "allreduce_busbw_gbps": {"nvlink": 100}}, "has no nvlink link"),
    ({"gpu": "H100-SXM", "allreduce_busbw_gbps": {"ib": 10}}, "unknown tier"),
    ({"gpu": "H100-SXM", "step_time_s": 1.0}, "needs 'model'"),
])
def test_errors(data: dict, needle: str) -> None:
    with pytest.raises(PlanError) as e:
        calibrate(data)
    assert needle in str(e.value)


def test_load_calibration_file(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"gpu": "H200", "allreduce_busbw_gbps": {"nvlink": 360}}))
    eff, _ = load_calibration(path)
    assert eff.nvlink == pytest.approx(0.8)
    path.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_calibration(path)
