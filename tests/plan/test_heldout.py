"""The planner on published runs it was not fitted on, and the regimes those runs exercise.

The held-out table (musubi/plan/data/validation/heldout_runs.csv) is never read by the fit
(musubi/plan/fit.py); the test below fails if it is. Rows marked `known_off` state in the data
file why the planner cannot match them; they are printed and counted in "all", but the bound
applies to the rest.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from musubi.plan import DEFAULT_EFFICIENCY, Layout, get_gpu, make_cluster, predict, preset
from musubi.plan.comm import place_group
from musubi.plan.fit import fit_constants, fit_rows, leave_one_source_out
from musubi.plan.spec import with_seq
from musubi.plan.validate import (
    FIT_CSV,
    GATHERED_CSV,
    HELDOUT_CSV,
    NEVERSEEN_CSV,
    check_table,
    dominant_term,
    load_rows,
    predict_published,
    predict_row,
    row_cluster,
    row_layout,
    row_spec,
    summary,
    table_text,
)

SHARED_FIT = Path(__file__).resolve().parents[3] / "shared" / "validation" / "published_runs.csv"
HELDOUT_MEAN, REGIME_MEAN, FIT_MEAN = 0.10, 0.20, 0.05


def test_fit_never_opens_the_heldout_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file the fit opens is recorded: the fit set is among them, the held-out table is not."""
    opened: list[Path] = []
    real_open, real_path_open = builtins.open, Path.open

    def spy_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(Path(file).resolve()) if isinstance(file, (str, Path)) else None
        return real_open(file, *args, **kwargs)

    def spy_path_open(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(self.resolve())
        return real_path_open(self, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(Path, "open", spy_path_open)
    fit_constants()
    assert FIT_CSV.resolve() in opened
    assert HELDOUT_CSV.resolve() not in opened
    assert GATHERED_CSV.resolve() not in opened and NEVERSEEN_CSV.resolve() not in opened
    assert "HELDOUT_CSV" not in (Path(__file__).parents[2] / "musubi" / "plan" / "fit.py").read_text()


def test_defaults_are_the_fit_on_the_fit_set() -> None:
    """efficiency.py's matmul and hbm are exactly what fit.py chooses on the fit set."""
    fit = fit_constants()
    assert (fit.matmul, fit.hbm) == (DEFAULT_EFFICIENCY.matmul, DEFAULT_EFFICIENCY.hbm)
    assert fit.mean_error <= FIT_MEAN


@pytest.mark.skipif(not SHARED_FIT.is_file(), reason=f"{SHARED_FIT} not present")
def test_packaged_fit_set_is_the_shared_validation_set() -> None:
    assert FIT_CSV.read_bytes() == SHARED_FIT.read_bytes()


def test_heldout_rows_name_their_source_and_assumptions() -> None:
    for row in load_rows(HELDOUT_CSV):
        assert row["source"] and row["url"].startswith("https://") and row["table"], row["name"]
        assert row["regime"] in ("fsdp", "3d", "3d-scale", "16k"), row["name"]
        degrees = int(row["tp"]) * int(row["pp"]) * int(row["cp"]) * int(row["dp"])
        assert degrees == int(row["n_gpus"]), row["name"]


def test_heldout_error_within_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """Mean |error| <= 10 % over the held-out rows not marked known-off, and <= 20 % in each regime."""
    checks = check_table(HELDOUT_CSV)
    report = table_text("held-out", checks)
    with capsys.disabled():
        print("\n" + report)
    stats = summary(checks)
    assert stats.get("all but known-off", stats["all"])[1] <= HELDOUT_MEAN, report
    for regime in {c.regime for c in checks}:
        errs = [abs(c.error) for c in checks if c.regime == regime and not c.known_off]
        if errs:
            assert sum(errs) / len(errs) <= REGIME_MEAN, (regime, report)
    # the known-off rows are the optimistic side of a real slowdown, not noise around the truth
    assert all(c.error > 0 for c in checks if c.known_off)


def test_fsdp_at_fixed_global_batch_loses_per_gpu_throughput_as_gpus_grow() -> None:
    """ZeRO-3 with the global batch fixed: the micro-batch shrinks, gathers stop hiding, TFLOP/s per GPU falls."""
    spec = with_seq(preset("llama3-70b"), 2048)
    rates, exposed = [], []
    for n in (32, 64, 128, 256):
        p = predict(spec, make_cluster(get_gpu("H100-SXM"), n),
                    Layout(tp=1, pp=1, zero=3, recompute="full", micro=256 // n), 256)
        rates.append(p.model_tflops_per_gpu)
        exposed.append(p.exposed_comm_s["network"] / p.step_time_s)
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.9 * rates[0], rates
    assert exposed == sorted(exposed) and exposed[-1] > 0.05, exposed


def test_sharded_traffic_crosses_nodes_at_one_nic_and_the_all_reduce_at_the_nodes() -> None:
    """ZeRO-3 gathers across nodes get one GPU's NIC; the bucketed all-reduce gets the node's NICs (fit set)."""
    cluster = make_cluster(get_gpu("A100-80GB"), 64)
    dp = place_group(cluster, DEFAULT_EFFICIENCY, 1, 64)
    nic = get_gpu("A100-80GB").nic_gbps * 1e9 * DEFAULT_EFFICIENCY.network
    assert dp.tier == "network" and dp.busbw == 8 * nic
    assert dp.one_nic().busbw == nic
    inside = place_group(cluster, DEFAULT_EFFICIENCY, 1, 8)
    assert inside.one_nic() == inside  # NVLink traffic is not capped


def test_zero3_at_fixed_batch_stops_speeding_up_when_traffic_outgrows_compute() -> None:
    """GPT-3 175B ZeRO-3, batch 1536: per-parameter traffic per step is the same at any GPU count, so once it
    exceeds the compute it could hide under, the step stops shrinking and the exposed share grows."""
    spec = with_seq(preset("gpt3-175b"), 2048)
    steps, shares = [], []
    for n, micro in ((384, 4), (768, 2), (1536, 1)):
        p = predict(spec, make_cluster(get_gpu("A100-80GB"), n),
                    Layout(tp=1, pp=1, zero=3, recompute="full", micro=micro, attention="unfused"), 1536)
        assert p.data_parallel is not None
        steps.append(p.step_time_s)
        shares.append(p.data_parallel.exposed_s / p.step_time_s)
    assert steps[2] > 0.8 * steps[1], steps  # doubling GPUs buys (almost) nothing
    assert shares == sorted(shares) and shares[-1] > 0.5, shares


def test_gemm_efficiency_falls_with_the_micro_batch() -> None:
    """Fewer tokens per GEMM: the weight traffic stays, the FLOPs shrink, the fraction of peak falls."""
    spec = with_seq(preset("gpt-1.7b"), 512)
    fractions = [predict(spec, make_cluster(get_gpu("A100-80GB"), 8), Layout(tp=8, pp=1, micro=b), 64)
                 .gemm_fraction_of_peak for b in (8, 2, 1)]
    assert fractions == sorted(fractions, reverse=True) and fractions[-1] < 0.9 * fractions[0], fractions


def test_3d_mfu_declines_from_3k_to_12k_gpus_at_fixed_batch() -> None:
    """MegaScale's Megatron-LM baseline, batch 6,144: predicted MFU falls with GPUs, as measured (48.7 -> 41.2 %)."""
    checks = {c.name: c for c in check_table(HELDOUT_CSV)}
    mfu = [checks[f"ms-175b-{n}"].predicted for n in (3072, 6144, 8192, 12288)]
    assert mfu == sorted(mfu, reverse=True), mfu
    measured_drop = 1 - 0.412 / 0.487
    assert 1 - mfu[-1] / mfu[0] >= 0.5 * measured_drop, mfu


def test_breakdown_names_the_dominant_term() -> None:
    """A comm-bound layout says so: ZeRO-3 over slow links is dominated by exposed network time."""
    spec = with_seq(preset("llama3-70b"), 2048)
    slow = make_cluster(get_gpu("L40S"), 64)
    p = predict(spec, slow, Layout(tp=1, pp=1, zero=3, recompute="full", micro=1), 64)
    assert dominant_term(p) == "exposed_comm"
    fast = predict(spec, make_cluster(get_gpu("H100-SXM"), 64), Layout(tp=8, pp=1, zero=1, recompute="full"), 512)
    assert dominant_term(fast) == "compute"


def test_table_text_counts_regimes() -> None:
    text = table_text("held-out", check_table(HELDOUT_CSV))
    for regime in ("fsdp", "3d", "3d-scale", "16k", "all "):
        assert regime in text


def test_leave_one_source_out_refits_without_the_source() -> None:
    """Each fit-set source is predicted by constants refitted on the other source alone (the refit is that
    source's own fit, and differs from the full fit for at least one source), the source's rows are all
    predicted, and no row of another set is read."""
    out = leave_one_source_out()
    rows = load_rows(FIT_CSV)
    assert [src for src, _, _ in out] == sorted({r["source"] for r in rows})
    assert sum(len(checks) for _, _, checks in out) == len(rows)
    full = fit_constants()
    for source, refit, checks in out:
        assert all(c.source == source for c in checks)
        assert refit == fit_rows([r for r in rows if r["source"] != source]), source
        errs = [abs(c.error) for c in checks]
        assert sum(errs) / len(errs) <= 0.08, (source, errs)  # a paper it did not see: 2.9 % and 3.2 % (2026-11-28)
    # at least one source moves the constants when it is left out (since the collective curve of 2026-11-28,
    # leaving Korthikanti's rows out no longer does: the other source picks the same pair)
    assert any((refit.matmul, refit.hbm) != (full.matmul, full.hbm) for _, refit, _ in out)
    text = table_text("loso", [c for _, _, checks in out for c in checks], by="source")
    assert "Korthikanti2022-Table5" in text and "Narayanan2021-Table1" in text


def test_bloom_row_is_its_published_layout_on_its_network() -> None:
    """BLOOM 176B (bigscience tr11-176B-ml): TP 4 x PP 12 x DP 8 on 384 A100 80GB, micro 2, 149.77 TFLOP/s;
    Jean Zay's 4x 100 Gb/s Omni-Path per node is 6.25 GB/s a GPU (the row's nic_gbps), a quarter of a DGX's."""
    row = next(r for r in load_rows(HELDOUT_CSV) if r["name"] == "bloom-176b-384")
    assert row_cluster(row).gpu.nic_gbps == 6.25 and get_gpu("A100-80GB").nic_gbps == 25
    p = predict_row(row)
    assert p.fits and p.micro_batches == 2048 // (8 * 2)
    dgx = predict(row_spec(row), make_cluster(get_gpu("A100-80GB"), 384), row_layout(row), 2048,
                  memory_precision="mixed-fp32-grads")
    assert dgx.step_time_s < p.step_time_s  # the slower network costs exposed time (no overlap in DeepSpeed's pipe)


def test_printed_layouts_that_ran_fit_in_memory() -> None:
    """A published choice the memory model used to block: GPT-530B ZeRO-3 at micro-batch 4 on 640 A100 80GB
    (Narayanan 2021 Table 2); the fill now keeps it."""
    row = next(r for r in load_rows(HELDOUT_CSV) if r["name"] == "z3-530b-640")
    p = predict_row(row)
    assert p.fits, p.memory_gib_per_gpu
    assert predict_published(row).layout == p.layout.replace(",attention=unfused", "")


def test_tied_embedding_gradients_are_all_reduced_between_first_and_last_stage() -> None:
    """A tied embedding has a copy on the first and the last pipeline stage; after the backward their gradients
    are all-reduced over those two ranks (Megatron-LM finalize_model_grads' embedding group; DeepSpeed's tied
    modules), outside any overlap. BLOOM: 250880 x 14336 / tp 4 fp32 gradients over Jean Zay's network."""
    from dataclasses import replace as dc_replace

    from musubi.plan.comm import all_reduce_s

    row = next(r for r in load_rows(HELDOUT_CSV) if r["name"] == "bloom-176b-384")
    spec, lay, cluster = row_spec(row), row_layout(row), row_cluster(row)
    tied = predict(spec, cluster, lay, 2048, memory_precision="mixed-fp32-grads")
    untied = predict(dc_replace(spec, tied_embeddings=False), cluster, lay, 2048, memory_precision="mixed-fp32-grads")
    link = place_group(cluster, DEFAULT_EFFICIENCY, 4 * 8 * 11, 2)
    expected = all_reduce_s(4 * 250880 * 14336 / 4, link)
    assert link.tier == "network" and expected > 0.5
    assert tied.step_time_s - untied.step_time_s == pytest.approx(expected * (1 + tied.straggler_tax), rel=1e-6)
