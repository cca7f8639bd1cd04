"""`musubi plan`: parse, call the planner (musubi.plan: pure math, no torch), print a table or JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from musubi.cli.output import PIPE_WIDTH, fail
from musubi.contract.exits import EXIT_FAILED
from musubi.plan.calibrate import load_calibrations
from musubi.plan.catalog import get_gpu
from musubi.plan.cluster import Cluster, fit_to_topology, make_cluster
from musubi.plan.complete import (
    FILL_MEMORY_TOLERANCE,
    complete_layout,
    faster_over_memory,
    fits_instead,
    range_by_fact,
    stack_range,
)
from musubi.plan.efficiency import DEFAULT_EFFICIENCY
from musubi.plan.errors import PlanError
from musubi.plan.layout import given_keys, parse_layout
from musubi.plan.predict import Prediction, predict
from musubi.plan.search import SearchResult, search
from musubi.plan.spec import ModelSpec, load_spec, preset, with_seq


def _resolve_spec(model: str | None, spec_path: Path | None, seq: int | None) -> ModelSpec:
    if (model is None) == (spec_path is None):
        raise PlanError("give exactly one of --model NAME or --spec MODEL.yaml")
    spec = preset(model) if model is not None else load_spec(spec_path)  # type: ignore[arg-type]
    return with_seq(spec, seq)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _comm(p: Prediction) -> str:
    parts = [f"{tier} {p.exposed_comm_s[tier]:.3g}/{p.comm_s[tier]:.3g}" for tier in p.comm_s if p.comm_s[tier] > 0]
    return ", ".join(parts) or "-"


def _terms(p: Prediction) -> list[tuple[str, str]]:
    """Where the step goes, term by term (exposed comm split per tier), largest first, with its share."""
    terms = {k.removesuffix("_s"): v for k, v in p.breakdown_s.items() if k != "exposed_comm_s"}
    terms.update({f"exposed comm ({tier})": s for tier, s in p.exposed_comm_s.items() if s > 0})
    ranked = sorted(((k, v) for k, v in terms.items() if v > 0), key=lambda kv: -kv[1])
    rows = [(f"  {k}" + ("  <- dominant" if i == 0 else ""), f"{v:.3g} s ({_pct(v / p.step_time_s)})")
            for i, (k, v) in enumerate(ranked)]
    return [("step time by term", "")] + rows


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _why(p: Prediction, micro: int) -> list[tuple[str, str]]:
    """The numbers behind the terms: GEMM efficiency at this micro-batch, data-parallel traffic against its window."""
    rows = [("why", "")]
    if p.seq > 1:
        rows.append((f"  GEMMs at micro-batch {micro} ({micro * p.seq:,} tokens)", f"{_pct(p.gemm_fraction_of_peak)} "
                     "of peak"))
    dpc = p.data_parallel
    if dpc is not None and dpc.bytes_per_gpu > 0:
        rows.append((f"  data-parallel traffic ({dpc.tier})",
                     f"{_num(dpc.bytes_per_gpu / 1e9)} GB per GPU at {dpc.gbps:.3g} GB/s = {dpc.busy_s:.3g} s"))
        tail = f", of which the last gradient bucket {dpc.tail_s:.3g} s" if dpc.tail_s > 0 else ""
        tail += f", the parameter all-gather after the step {dpc.after_step_s:.3g} s" if dpc.after_step_s > 0 else ""
        rows.append(("  compute it can hide under", f"{dpc.window_s:.3g} s (exposed {dpc.exposed_s:.3g} s{tail})"))
    return rows if len(rows) > 1 else []


def _print_validation(console: Console) -> None:
    from musubi.plan.validate import (
        FIT_CSV,
        GATHERED_CSV,
        HELDOUT_CSV,
        NEVERSEEN_CSV,
        check_table,
        range_coverage,
        table_text,
    )

    console.print(table_text("fit set (the constants were chosen on these rows): " + FIT_CSV.name,
                             check_table(FIT_CSV)), highlight=False, markup=False)
    from musubi.plan.fit import leave_one_source_out

    loso = leave_one_source_out()
    console.print(table_text("fit set, leave one source out (each source predicted by matmul and hbm refitted on the "
                             "other sources' rows; no constant depends on the other sets' rows): "
                             + "; ".join(f"without {src}: matmul {f.matmul:g}, hbm {f.hbm:g}" for src, f, _ in loso),
                             [c for _, _, checks in loso for c in checks], by="source"),
                  highlight=False, markup=False)
    console.print(table_text("held-out set (no fit reads it): " + HELDOUT_CSV.name, check_table(HELDOUT_CSV)),
                  highlight=False, markup=False)
    console.print(table_text("held-out set from the printed layouts only (what `musubi plan --layout` gets; the "
                             "planner fills micro, vpp, recompute): " + HELDOUT_CSV.name,
                             check_table(HELDOUT_CSV, published=True)), highlight=False, markup=False)
    inside, rows, outside = range_coverage(HELDOUT_CSV)
    console.print(f"  measured inside the printed range over unnamed stack facts: {inside} of {rows} rows"
                  + (f" (outside: {', '.join(outside)})" if outside else ""), highlight=False, markup=False)
    console.print(table_text("gathered set (FSDP/ZeRO-2 runs, no fit reads it): " + GATHERED_CSV.name,
                             check_table(GATHERED_CSV)), highlight=False, markup=False)
    console.print(table_text("never-seen set (split off before modelling, issue 48): " + NEVERSEEN_CSV.name,
                             check_table(NEVERSEEN_CSV)), highlight=False, markup=False)


def _print_one(console: Console, p: Prediction, cluster: Cluster, micro: int, quiet_fit: bool = False) -> None:
    table = Table(title=Text(f"{p.model} on {p.n_gpus} x {p.gpu}: {p.layout}"), show_header=False,
                  title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("step time", f"{p.step_time_s:.3f} s"),
        ("tokens / s" if p.seq > 1 else "samples / s", f"{p.tokens_per_s:,.0f}"),
        ("model TFLOP/s per GPU", f"{p.model_tflops_per_gpu:.1f}"),
        ("hardware TFLOP/s per GPU", f"{p.hardware_tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{_pct(p.mfu)} / {_pct(p.hfu)}"),
        ("memory per GPU", f"{p.memory_gib_per_gpu:.1f} of {cluster.gpu.memory_gib:g} GiB"),
        ("  weights / grads / optimizer", " / ".join(f"{p.memory_gib[k]:.1f}" for k in ("weights", "grads",
                                                                                            "optimizer"))),
        ("  activations / buffers / reserve", " / ".join(f"{p.memory_gib[k]:.1f}" for k in ("activations",
                                                                                               "buffers",
                                                                                               "reserve"))),
        ("micro-batches per step", str(p.micro_batches)),
        ("pipeline bubble", _pct(p.bubble_fraction)),
        ("straggler tax", _pct(p.straggler_tax)),
        ("comm exposed/busy s per tier", _comm(p)),
        *_terms(p),
        *_why(p, micro),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    if not p.fits and not quiet_fit:  # quiet_fit: the caller prints its own line (a fill within the model's error)
        console.print(f"[bold yellow]does not fit:[/] {p.memory_gib_per_gpu:.1f} GiB > "
                      f"{cluster.gpu.memory_gib:g} GiB per GPU", highlight=False)


def _print_search(console: Console, result: SearchResult, spec: ModelSpec, cluster: Cluster, batch: int) -> None:
    nodes = f"{cluster.nodes} node{'s' if cluster.nodes != 1 else ''}"
    table = Table(title=Text(f"{spec.name} on {cluster.n_gpus} x {cluster.gpu.name} ({nodes}), "
                             f"global batch {batch}"), title_justify="left")
    for col in ("#", "layout", "step s", "MFU", "TFLOP/s", "GiB", "bubble", "comm exposed/busy s"):
        table.add_column(col, justify="left" if col in ("layout", "comm exposed/busy s") else "right")
    for i, p in enumerate(result.candidates, 1):
        table.add_row(str(i), p.layout, f"{p.step_time_s:.3g}", _pct(p.mfu), f"{p.model_tflops_per_gpu:.0f}",
                      f"{p.memory_gib_per_gpu:.1f}", _pct(p.bubble_fraction), _comm(p))
    console.print(table)
    total = len(result.rejections)
    if total:
        console.print(f"rejected {total} layouts ({result.evaluated} priced):", highlight=False)
        for kind, count, example in result.rejection_summary():
            console.print(Text(f"  {kind} x{count}: {example}"), highlight=False, soft_wrap=True)


#: The stack range: fastest and slowest prediction, the facts it spans, and each fact varied alone
#: (complete.range_by_fact: fact -> fastest value, its step ratio, slowest value, its step ratio).
Spread = tuple[Prediction, Prediction, list[str], dict[str, tuple[str, float, str, float]]]


def _range_json(spread: Spread | None) -> dict[str, Any] | None:
    """The stack-assumption range as JSON: step time and MFU at both ends, the facts it spans, and each fact's
    own reach (step time relative to the point estimate at its fastest and slowest value), widest first."""
    if spread is None:
        return None
    fast, slow, unknown, by_fact = spread
    return {"spans": unknown, "step_time_s": [fast.step_time_s, slow.step_time_s], "mfu": [slow.mfu, fast.mfu],
            "model_tflops_per_gpu": [slow.model_tflops_per_gpu, fast.model_tflops_per_gpu],
            "by_fact": {k: {"fast": fv, "fast_step_ratio": fr, "slow": sv, "slow_step_ratio": sr}
                        for k, (fv, fr, sv, sr) in by_fact.items()}}


def _reach(by_fact: dict[str, tuple[str, float, str, float]]) -> str:
    """Each fact's own reach as text, widest first: `recompute (full +34 %)`, `overlap (all -11 %, none +4 %)`."""
    parts = []
    for key, (fast_value, fast, slow_value, slow) in by_fact.items():
        ends = [f"{value} {100 * (ratio - 1):+.0f} %" for value, ratio in ((fast_value, fast), (slow_value, slow))
                if abs(ratio - 1) >= 0.005]
        parts.append(f"{key} ({', '.join(ends) or 'under 1 %'})")
    return ", ".join(parts)


def _json_search(result: SearchResult) -> dict[str, Any]:
    return {
        "candidates": [p.as_dict() for p in result.candidates],
        "evaluated": result.evaluated,
        "rejected": {"count": len(result.rejections),
                     "by_kind": [{"kind": k, "count": n, "example": ex} for k, n, ex in result.rejection_summary()]},
    }


def _inputs(model: str | None, spec: Path | None, gpu: str | None, gpus: int | None, nodes: int | None,
            seq: int | None, global_batch: int | None, topology: Path | None,
            calibrate: list[Path] | None,
            nic_gbps: float | None = None,
            fabric: str = "ib") -> tuple[ModelSpec, Cluster, int, Any, dict[str, Any] | None]:
    """The planner's inputs from the options: model, cluster (catalog GPU, or fitted to a measured node), global
    batch, efficiency constants (calibrated or default) and the calibration's report; PlanError naming a bad one."""
    if gpu is None or gpus is None:
        raise PlanError("give --gpu TYPE and --gpus N (e.g. --gpu H100-SXM --gpus 64)")
    model_spec = _resolve_spec(model, spec, seq)
    catalog_gpu = get_gpu(gpu)
    if topology is not None:
        from musubi.contract.errors import ConfigError
        from musubi.topology.read import load_topology

        try:
            catalog_gpu = fit_to_topology(catalog_gpu, load_topology(topology))
        except ConfigError as e:
            raise PlanError(str(e)) from None
    if nic_gbps is not None:  # the cluster's own network (e.g. 4x 100 Gb/s per 8 GPUs = 6.25), not the catalog build
        if nic_gbps <= 0:
            raise PlanError(f"--nic-gbps {nic_gbps:g}: must be > 0 (GB/s per GPU per direction)")
        catalog_gpu = dataclasses.replace(catalog_gpu, nic_gbps=nic_gbps)
    cluster = make_cluster(catalog_gpu, gpus, nodes, fabric)
    batch = global_batch if global_batch is not None else model_spec.global_batch
    if not batch:
        raise PlanError(f"{model_spec.name} has no default batch; give --global-batch SEQUENCES")
    eff, report = (load_calibrations(calibrate) if calibrate else (DEFAULT_EFFICIENCY, None))
    if report is not None and report["gpu"] != cluster.gpu.name:
        raise PlanError(f"--calibrate file was measured on {report['gpu']}, but --gpu is {cluster.gpu.name}")
    return model_spec, cluster, batch, eff, report


def _show_layout(console: Console, as_json: bool, one: Prediction, cluster: Cluster, micro: int,
                 filled: dict[str, Any], spread: Spread | None,
                 report: dict[str, Any] | None, over: Prediction | None = None,
                 instead: Prediction | None = None) -> None:
    """One layout's prediction: the table, the range over what --layout left unsaid, the knobs the planner chose,
    the faster filling the memory model rejected (`over`), and, when the fill took a filling predicted over the
    GPU's memory (within the model's error), the fastest that fits outright (`instead`)."""
    def brief(p: Prediction | None) -> dict[str, Any] | None:
        return None if p is None else {"layout": p.layout, "step_time_s": p.step_time_s, "mfu": p.mfu,
                                       "memory_gib_per_gpu": p.memory_gib_per_gpu}

    margin = None
    if filled and not one.fits:
        margin = {"over_by": one.memory_gib_per_gpu / cluster.gpu.memory_gib - 1,
                  "within_model_error": FILL_MEMORY_TOLERANCE, "may_not_fit": True, "fits_instead": brief(instead)}
    if as_json:
        print(json.dumps({**one.as_dict(), "filled": filled, "range": _range_json(spread),
                          "faster_over_memory": brief(over), "memory_margin": margin, "calibration": report},
                         indent=1))
        return
    _print_one(console, one, cluster, micro, quiet_fit=margin is not None)
    if margin is not None:
        alt = (f"{instead.layout} fits at step {instead.step_time_s:.3g} s, MFU {_pct(instead.mfu)}"
               if instead is not None else "no filling fits outright")
        console.print(f"[bold yellow]may not fit:[/] memory {one.memory_gib_per_gpu:.1f} GiB of "
                      f"{cluster.gpu.memory_gib:g}: over by {_pct(margin['over_by'])}, within the memory model's "
                      f"{FILL_MEMORY_TOLERANCE:.0%} error; {alt}", highlight=False)
    if spread is not None:
        fast, slow, unknown, by_fact = spread
        console.print(f"range over what --layout does not say ({', '.join(unknown)}): MFU "
                      f"{_pct(slow.mfu)} to {_pct(fast.mfu)}, step {fast.step_time_s:.3g} to "
                      f"{slow.step_time_s:.3g} s (name them in --layout to pin them)", highlight=False)
        console.print(f"  each alone, step against this estimate: {_reach(by_fact)}", highlight=False)
    if filled:
        console.print("chosen by the planner (not in --layout; fastest that fits, within the memory model's "
                      f"{FILL_MEMORY_TOLERANCE:.0%} error): "
                      + ", ".join(f"{k}={v}" for k, v in filled.items()), highlight=False)
    if over is not None:
        console.print(f"faster if it fits: {over.layout}: MFU {_pct(over.mfu)}, step {over.step_time_s:.3g} s, but "
                      f"{over.memory_gib_per_gpu:.1f} GiB predicted of {cluster.gpu.memory_gib:g} (name its knobs "
                      "in --layout to take it)", highlight=False)


def _evaluate_layout(model_spec: ModelSpec, cluster: Cluster, layout: str, batch: int, eff: Any,
                     precision: str) -> tuple[Any, dict[str, str], Prediction, Any, Prediction | None,
                                              Prediction | None]:
    """One `--layout`: the filled layout, what was filled, its prediction, the stack range, the faster filling
    over memory, and the filling that fits outright when the fill took one within the memory model's error."""
    # knobs the layout leaves out (micro, vpp, recompute, zero) are set to the fastest that fit (complete.py)
    given, parsed = given_keys(layout), parse_layout(layout)
    one_layout, filled = complete_layout(model_spec, cluster, parsed, given, batch, eff, precision)
    one = predict(model_spec, cluster, one_layout, batch, eff, precision)
    ends = stack_range(model_spec, cluster, one_layout, given, batch, eff, precision)
    spread = None if ends is None else (*ends, range_by_fact(model_spec, cluster, one_layout, given, batch, eff,
                                                             precision))
    over = faster_over_memory(model_spec, cluster, parsed, given, batch, eff, precision)
    instead = fits_instead(model_spec, cluster, parsed, given, batch, eff, precision) if filled else None
    return one_layout, filled, one, spread, over, instead


def plan_command(
    model: str | None = typer.Option(None, "--model", help="Preset model name (llama3-8b, llama3-405b, ...)."),
    spec: Path | None = typer.Option(None, "--spec", help="Model spec YAML (layers, hidden, heads, ...)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type from the catalog (H100-SXM, A100-80GB, ...)."),
    gpus: int | None = typer.Option(None, "--gpus", help="Number of GPUs."),
    nodes: int | None = typer.Option(None, "--nodes", help="Number of nodes (default: catalog node size)."),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", help="Network GB/s per GPU per direction (NICs per "
                                          "node x line rate / GPUs per node; default: the catalog's build)."),
    fabric: str = typer.Option("ib", "--fabric", help="Inter-node fabric class: ib (non-blocking fat tree, flat "
                               "bus bandwidth), roce-ecmp or efa (bus bandwidth falls with nodes: published "
                               "nccl-tests; musubi/plan/fabric.py)."),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length in tokens (default: the spec's)."),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Sequences (samples) per step."),
    layout: str | None = typer.Option(None, "--layout", help="Evaluate one layout: tp=8,pp=16,dp=64,cp=1,"
                                      "ep=1,vpp=1,zero=1,recompute=selective,micro=1 (dp may be left out)."),
    top: int = typer.Option(5, "--top", help="Layouts to show when searching."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    calibrate: list[Path] | None = typer.Option(None, "--calibrate", help="A Musubi run directory (RUN or RUN/JOB with "
                                          "plan.json), or measured figures as JSON, that replace the efficiency "
                                          "constants; repeat for a DDP and an FSDP run; see "
                                          "musubi/plan/calibrate.py."),
    precision: str = typer.Option("bf16", "--precision", help="Compute precision of the peak (bf16, fp8, ...)."),
    topology: Path | None = typer.Option(None, "--topology", help="A measured node (`nvidia-smi topo -m` text or "
                                         "env.json): GPUs per node, NVLink domain and speed come from it."),
    validate: bool = typer.Option(False, "--validate", help="Print the planner's errors on published runs: the fit "
                                  "set and the held-out set, per regime; needs no other option."),
) -> None:
    """Predict memory, step time and MFU of parallel layouts; search and rank them without --layout."""
    if validate:
        _print_validation(Console(width=200))
        return
    try:
        if top < 1:
            raise PlanError(f"--top {top}: must be >= 1")
        model_spec, cluster, batch, eff, report = _inputs(model, spec, gpu, gpus, nodes, seq, global_batch,
                                                          topology, calibrate, nic_gbps, fabric)
        if layout is not None:
            one_layout, filled, one, spread, over, instead = _evaluate_layout(model_spec, cluster, layout, batch,
                                                                              eff, precision)
        else:
            found = search(model_spec, cluster, batch, eff, precision, top=top)
    except PlanError as e:
        fail(str(e))
        return
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the layout column to 80 characters
        console = Console(width=PIPE_WIDTH)
    if layout is not None:
        _show_layout(console, as_json, one, cluster, one_layout.micro, filled, spread, report, over, instead)
        return
    if as_json:
        print(json.dumps({"model": model_spec.name, "gpu": cluster.gpu.name, "gpus": cluster.n_gpus,
                          "global_batch": batch, **_json_search(found), "calibration": report}, indent=1))
    else:
        _print_search(console, found, model_spec, cluster, batch)
    if not found.candidates:
        fail("no layout fits; see the rejections above (more GPUs, a smaller micro-batch or recompute=full)", EXIT_FAILED)
