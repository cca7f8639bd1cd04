"""Layouts as papers print them: the planner fills the knobs they leave out and gives a range for the stack.

The held-out runs' `published_layout` column holds only what each paper printed; the rest of the
row (micro-batch, interleaving, attention kernel, overlap) was assumed by whoever wrote the row.
These tests pin what `musubi plan --layout` does with the printed layout alone.
"""

from __future__ import annotations

import json

from musubi.plan import get_gpu, make_cluster, predict
from musubi.plan.complete import complete_layout, faster_over_memory, stack_range
from musubi.plan.layout import given_keys, parse_layout
from musubi.plan.spec import preset
from musubi.plan.validate import GATHERED_CSV, HELDOUT_CSV, NEVERSEEN_CSV, check_table, load_rows, summary
from tests.plan.test_command import run

GPT3 = preset("gpt3-175b")


def _filled(text: str, gpus: int, batch: int = 1536, gpu: str = "A100-80GB"):  # type: ignore[no-untyped-def]
    cluster = make_cluster(get_gpu(gpu), gpus)
    layout, chosen = complete_layout(GPT3, cluster, parse_layout(text), given_keys(text), batch)
    return layout, chosen, predict(GPT3, cluster, layout, batch)


def test_given_keys_are_what_the_text_names() -> None:
    assert given_keys("tp=8,pp=16,overlap=dp,pp,zero=1") == {"tp", "pp", "overlap", "zero"}


def test_a_named_knob_is_never_changed() -> None:
    layout, chosen, _ = _filled("dp=384,zero=3,recompute=full,micro=1", 384)
    assert layout.micro == 1 and layout.recompute == "full" and chosen == {}


def test_zero3_without_micro_gets_the_largest_micro_batch_that_fits_and_falls_with_scale() -> None:
    """ZeRO-3 regathers weights every micro-batch: without gradient accumulation it moves the least.

    The printed layout (Narayanan 2021 Table 2 as an outside scorer passed it) has no micro-batch;
    at micro 1 the prediction was flat (~40 TFLOP/s at every scale); filled, it falls with scale.
    """
    rates = []
    for gpus, micro in ((384, 4), (768, 2), (1536, 1)):
        layout, chosen, p = _filled(f"dp={gpus},zero=3,recompute=full", gpus)
        assert chosen == {"micro": str(micro)} and layout.micro == micro and p.fits
        rates.append(p.hardware_tflops_per_gpu)
    assert rates[0] > 1.5 * rates[1] > 1.5 * rates[2]


def test_filled_choice_is_the_fastest_that_fits() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 384)
    _, _, best = _filled("dp=384,zero=3,recompute=full", 384)
    for micro in (1, 2, 4):
        p = predict(GPT3, cluster, parse_layout(f"dp=384,zero=3,recompute=full,micro={micro}"), 1536)
        assert not p.fits or p.step_time_s >= best.step_time_s


def test_stack_range_brackets_the_default_and_closes_when_named() -> None:
    cluster = make_cluster(get_gpu("A100-80GB"), 3072)
    text = "tp=8,pp=8,vpp=6,micro=1,recompute=selective"
    layout = parse_layout(text)
    default = predict(GPT3, cluster, layout, 6144)
    fast, slow, unknown = stack_range(GPT3, cluster, layout, given_keys(text), 6144)  # type: ignore[misc]
    assert unknown == ["attention", "overlap", "sp"]  # recompute is named; sp is open at tp 8
    assert fast.step_time_s <= default.step_time_s < slow.step_time_s
    assert stack_range(GPT3, cluster, layout, given_keys(text + ",attention=flash,overlap=dp,sp=yes"), 6144) is None


def test_cli_json_reports_what_it_filled_and_the_range() -> None:
    code, out = run("--model", "gpt3-175b", "--gpu", "A100-80GB", "--gpus", "384", "--global-batch", "1536",
                    "--layout", "dp=384,zero=3,recompute=full", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["filled"] == {"micro": "4"}  and "micro=4" in data["layout"]
    low, high = data["range"]["mfu"]
    # zero=3: how its gathers cross nodes (gather=nic|node) is a stack fact too (tests/plan/test_gather.py).
    assert low < data["mfu"] < high and data["range"]["spans"] == ["attention", "overlap", "gather", "grads"]


def test_heldout_from_printed_layouts_within_bound() -> None:
    """The outside scorer's way (printed layout only): all regimes in one bound, no run worse than 45 %."""
    checks = check_table(HELDOUT_CSV, published=True)
    assert len(checks) == len(load_rows(HELDOUT_CSV))
    n, mean, worst = summary(checks)["all"]
    assert mean < 0.25 and worst < 0.45, (mean, worst)


def test_gathered_and_never_seen_sets_name_their_sources() -> None:
    for path in (GATHERED_CSV, NEVERSEEN_CSV):
        rows = load_rows(path)
        assert rows and all(r["source"] and r["url"].startswith("https://") and r["table"] for r in rows)
    assert NEVERSEEN_CSV.read_text().startswith("# NEVER-SEEN SET")
    names = {r["name"] for r in load_rows(GATHERED_CSV)}
    assert not names & {r["name"] for r in load_rows(NEVERSEEN_CSV)}


def test_the_fill_says_what_memory_made_it_give_up() -> None:
    """Llama 3 405B at 8,192 H100s as printed (TP 8 x PP 16, ZeRO-1): the fastest filling (4 virtual stages, no
    recompute) is predicted over 80 GB, so the fill recomputes one layer of each 2-layer chunk (block recompute)
    to keep 4 virtual stages, and names the faster one with its memory; where the fastest filling fits there is
    nothing to name."""
    llama = preset("llama3-405b")
    cluster = make_cluster(get_gpu("H100-SXM"), 8192)
    text = "tp=8,pp=16,dp=64,zero=1"
    chosen, _ = complete_layout(llama, cluster, parse_layout(text), given_keys(text), 2048)
    over = faster_over_memory(llama, cluster, parse_layout(text), given_keys(text), 2048)
    assert (chosen.vpp, chosen.recompute, chosen.recompute_layers) == (4, "full", 1)
    assert over is not None and "vpp=4" in over.layout and "recompute=none" in over.layout
    assert not over.fits and over.memory_gib_per_gpu > 79.6
    assert over.step_time_s < predict(llama, cluster, chosen, 2048).step_time_s
    small = make_cluster(get_gpu("H200"), 8)  # 140 GB: recompute none fits
    one = "zero=1,micro=1"  # only recompute is open, and none (the fastest) fits
    assert faster_over_memory(preset("llama3-8b"), small, parse_layout(one), given_keys(one), 64) is None
    code, out = run("--model", "llama3-405b", "--gpu", "H100-SXM", "--gpus", "8192", "--global-batch", "2048",
                    "--layout", text, "--json")
    assert code == 0 and json.loads(out)["faster_over_memory"]["layout"] == over.layout


# --- ZeRO-1 as a fill, and the fill's memory tolerance (issue 48, session 22) ---

LLAMA70 = preset("llama3-70b")
NEMO_70B = "tp=4,pp=4,cp=2,dp=2,vpp=5,micro=1"  # dgxc-benchmarking Llama 3.1 70B, 64 H100: TP/PP/CP/VP/MBS only


def _nemo70(text: str):  # type: ignore[no-untyped-def]
    from musubi.plan.spec import with_seq

    spec = with_seq(LLAMA70, 8192)
    cluster = make_cluster(get_gpu("H100-SXM"), 64)
    layout, chosen = complete_layout(spec, cluster, parse_layout(text), given_keys(text), 128)
    return spec, cluster, layout, chosen


def test_an_unnamed_zero_is_filled_with_the_sharded_optimizer_when_it_frees_what_recompute_would() -> None:
    """NVIDIA's tables print TP/PP/CP/VP/MBS, not the distributed optimizer NeMo turns on by default.

    Without it the 70B layout needs full recompute to fit 80 GB (the fill chose it: -28 % against the
    published 1,113 tokens/s per GPU); with the optimizer state sharded over dp x cp = 4 ranks
    (ZeRO-1: 12 bytes/param / 4) it fits without recompute, which is what those runs did.
    """
    spec, cluster, layout, chosen = _nemo70(NEMO_70B)
    assert chosen == {"recompute": "none", "zero": "1"}
    plain = predict(spec, cluster, parse_layout(NEMO_70B + ",zero=0,recompute=none"), 128)
    sharded = predict(spec, cluster, layout, 128)
    assert not plain.fits and sharded.fits
    # ZeRO paper sec. 7.1: the optimizer state shrinks 12 (d-1)/d bytes a parameter, nothing else does
    assert plain.memory_gib["optimizer"] / sharded.memory_gib["optimizer"] == 4
    assert plain.memory_gib["weights"] == sharded.memory_gib["weights"]
    # ... and a reduce-scatter + all-gather moves what the all-reduce moved: the fill is free in traffic
    assert plain.data_parallel is not None and sharded.data_parallel is not None
    assert plain.data_parallel.bytes_per_gpu == sharded.data_parallel.bytes_per_gpu


def test_a_named_zero_is_kept_and_zero_is_not_open_without_replicas() -> None:
    _, _, layout, chosen = _nemo70(NEMO_70B + ",zero=0")
    assert layout.zero == 0 and "zero" not in chosen and chosen["recompute"] == "full"
    # tp x pp = all 64 GPUs: one replica (dp x cp = 1), nothing to shard the optimizer over
    _, _, layout, chosen = _nemo70("tp=8,pp=8,vpp=5,micro=1")
    assert layout.dp == 1 and "zero" not in chosen


def test_the_fill_takes_a_filling_within_the_memory_models_error_and_not_beyond() -> None:
    """Nemotron-4 340B on 128 H100 (TP 8, PP 8, VP 12, MBS 1, dp 2): NVIDIA ran it at the same rate per GPU
    as on 512 and 2,048 GPUs, so without recompute; the model puts that at 81.4 GiB of 79.6 (2 % over, inside
    its 8 % error) and, refusing it, took full recompute (-25 %). 10 % over is refused."""
    from musubi.plan.complete import FILL_MEMORY_TOLERANCE, fits_for_fill
    from musubi.plan.spec import TransformerSpec

    spec = TransformerSpec(name="nemotron4-340b", layers=96, hidden=18432, heads=96, kv_heads=8, ffn_hidden=73728,
                           vocab=256000, seq=4096, mlp="gelu", norm="layernorm")
    cluster = make_cluster(get_gpu("H100-SXM"), 128)
    text = "tp=8,pp=8,dp=2,vpp=12,micro=1"
    layout, chosen = complete_layout(spec, cluster, parse_layout(text), given_keys(text), 32)
    p = predict(spec, cluster, layout, 32)
    assert chosen == {"recompute": "none", "zero": "1"}
    assert cluster.gpu.memory_gib < p.memory_gib_per_gpu <= cluster.gpu.memory_gib * (1 + FILL_MEMORY_TOLERANCE)
    assert not p.fits and fits_for_fill(p, cluster)  # the prediction still says it is over; the fill takes it
    over = predict(spec, cluster, parse_layout(text + ",zero=0,recompute=none"), 32)
    assert over.memory_gib_per_gpu > cluster.gpu.memory_gib * 1.1 and not fits_for_fill(over, cluster)


def _nemotron340() -> tuple[object, object]:
    from musubi.plan.spec import TransformerSpec

    spec = TransformerSpec(name="nemotron4-340b", layers=96, hidden=18432, heads=96, kv_heads=8, ffn_hidden=73728,
                           vocab=256000, seq=4096, mlp="gelu", norm="layernorm")
    return spec, make_cluster(get_gpu("H100-SXM"), 128)


def test_a_fill_over_memory_says_so_in_one_line_and_in_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The lead's review of the tolerance: a filled layout predicted over the GPU's memory says by how much, that it
    may not fit, and which filling fits outright (text and --json)."""
    spec_file = tmp_path / "n.yaml"
    spec_file.write_text("layers: 96\nhidden: 18432\nheads: 96\nkv_heads: 8\nffn_hidden: 73728\nvocab: 256000\n"
                         "seq: 4096\nmlp: gelu\nnorm: layernorm\n")
    args = ("--spec", str(spec_file), "--gpu", "H100-SXM", "--gpus", "128", "--global-batch", "32",
            "--layout", "tp=8,pp=8,dp=2,vpp=12,micro=1")
    code, out = run(*args)
    lines = [ln for ln in out.splitlines() if ln.startswith("may not fit:")]
    assert code == 0 and len(lines) == 1 and "does not fit" not in out
    assert "over by 2.3 %" in lines[0] and "recompute=full" in lines[0] and "fits at step" in lines[0]
    code, out = run(*args, "--json")
    margin = json.loads(out)["memory_margin"]
    assert margin["may_not_fit"] and 0 < margin["over_by"] <= margin["within_model_error"] == 0.08
    assert margin["fits_instead"]["memory_gib_per_gpu"] <= 79.6
    # a layout that fits outright carries no margin; a fully named one over memory keeps the plain line
    code, out = run(*args[:-1], "tp=8,pp=8,dp=2,vpp=12,micro=1,zero=1,recompute=full", "--json")
    assert json.loads(out)["memory_margin"] is None
    code, out = run(*args[:-1], "tp=8,pp=8,dp=2,vpp=12,micro=1,zero=0,recompute=none")
    assert "does not fit:" in out and "may not fit" not in out


def test_the_search_still_recommends_only_layouts_predicted_to_fit() -> None:
    from musubi.plan.search import search

    spec, cluster = _nemotron340()
    found = search(spec, cluster, 32, top=50)  # type: ignore[arg-type]
    assert found.candidates and all(p.fits for p in found.candidates)
    assert all(p.memory_gib_per_gpu <= cluster.gpu.memory_gib for p in found.candidates)  # type: ignore[attr-defined]
