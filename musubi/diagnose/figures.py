"""The report's plots, drawn with matplotlib and returned as inline SVG text.

Text is drawn as paths (matplotlib's default `svg.fonttype`), and no plot carries
a user-controlled string (job names, paths): only rank numbers, section names,
units and metric names of plain letters and digits (others are numbered), so an
SVG can be inlined in the page as is.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.diagnose.timeline import JobTelemetry
from musubi.telemetry.sections import SECTIONS
from musubi.telemetry.step_record import local_work_ms, sections_ms, wall_ms
from musubi.telemetry.straggler import WARMUP

COLORS = {"data": "#e45756", "h2d": "#ff9da6", "forward": "#4c78a8", "backward": "#72b7b2",
          "grad_comm": "#f58518", "optimizer": "#54a24b", "log": "#bab0ac", "checkpoint": "#b279a2",
          "eval": "#9d755d", "uncovered": "#eeeeee"}


def available() -> bool:
    """Whether matplotlib can be imported (the `report` extra); without it the page has no plots."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _plots(fn: Callable[..., str | None]) -> Callable[..., str | None]:
    """A figure function that draws nothing (None) when matplotlib is not installed."""

    @functools.wraps(fn)
    def draw(*args: Any, **kwargs: Any) -> str | None:
        return fn(*args, **kwargs) if available() else None

    return draw


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("musubi report draws with matplotlib, which is not installed: "
                          "pip install 'musubi-train[report]' (or use --json)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _plt().close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: inlined in HTML
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _t0(tele: JobTelemetry) -> float:
    ts = [r["t"] for recs in tele.steps.values() for r in recs[:1]]
    ts += [s["t"] for ss in tele.samples.values() for s in ss[:1]]
    return min(ts) if ts else 0.0


@_plots
def utilisation(tele: JobTelemetry) -> str | None:
    """GPU utilisation and SM activity over time, one line per rank's GPU (CPU runs: process CPU %)."""
    if not tele.samples:
        return None
    plt = _plt()
    t0 = _t0(tele)
    gpu = any("util" in s for ss in tele.samples.values() for s in ss)
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for rank, ss in sorted(tele.samples.items()):
        t = [s["t"] - t0 for s in ss]
        if gpu:
            ax.plot(t, [s.get("util", float("nan")) for s in ss], lw=1.2, label=f"rank {rank} GPU util")
            if any("sm_active" in s for s in ss):
                ax.plot(t, [s.get("sm_active", float("nan")) for s in ss], lw=1, ls="--",
                        label=f"rank {rank} SM active")
        else:
            ax.plot(t, [s.get("proc_cpu", float("nan")) for s in ss], lw=1.2, label=f"rank {rank} process CPU")
            ax.plot(t, [s.get("workers_cpu", float("nan")) for s in ss], lw=1, ls=":",
                    label=f"rank {rank} loader workers CPU")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("%")
    ax.set_title("GPU utilisation per GPU" if gpu else "CPU load per rank (no GPU)")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    ax.grid(alpha=0.3)
    return _svg(fig)


@_plots
def breakdown(analysis: dict[str, Any]) -> str | None:
    """Mean step time per rank, stacked by section."""
    b = analysis.get("breakdown") or {}
    if not b:
        return None
    plt = _plt()
    ranks = sorted(b, key=int)
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(ranks)))
    for i, r in enumerate(ranks):
        left = 0.0
        secs = b[r]["sections_ms"]
        for s in (*SECTIONS, "uncovered"):
            v = secs.get(s, 0.0) if s != "uncovered" else max(0.0, b[r]["uncovered_ms"])
            if v <= 0:
                continue
            ax.barh(i, v, left=left, color=COLORS[s], label=s if i == 0 else None, edgecolor="white", lw=0.5)
            left += v
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("mean ms per step")
    ax.set_title("Step-time breakdown per rank")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    ax.legend(seen.values(), seen.keys(), fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return _svg(fig)


@_plots
def heartbeat(tele: JobTelemetry) -> str | None:
    """Step wall time (slowest rank) per step: a periodic stall shows as regular spikes."""
    aligned = tele.aligned()
    if not aligned:
        return None
    plt = _plt()
    steps = [k for k, _ in aligned]
    walls = [max(wall_ms(r) for r in recs.values()) for _, recs in aligned]
    fig, ax = plt.subplots(figsize=(9, 2.8))
    ax.plot(steps, walls, lw=1, color="#4c78a8", label="step time (slowest rank)")
    for name, color in (("checkpoint", COLORS["checkpoint"]), ("eval", COLORS["eval"]), ("data", COLORS["data"])):
        xs = [(k, w) for (k, recs), w in zip(aligned, walls, strict=True)
              if max(sections_ms(r).get(name, 0.0) for r in recs.values()) > 0.25 * w]
        if xs:
            ax.scatter([x for x, _ in xs], [w for _, w in xs], s=14, color=color, zorder=3,
                       label=f"{name} > 25 % of the step")
    if steps[0] <= WARMUP < steps[-1]:  # log scale keeps both in view; the band says which steps are warm-up
        ax.axvspan(steps[0] - 0.5, WARMUP + 0.5, color="grey", alpha=0.15, lw=0, label=f"warm-up (steps <= {WARMUP})")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("ms")
    ax.set_title("Stall heartbeat")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3, which="both")
    return _svg(fig)


def steady_top(values: list[float]) -> float | None:
    """Upper y limit for steady steps: 1.5x their 99th percentile, so one stray step cannot flatten the rest."""
    if not values:
        return None
    xs = sorted(values)
    return 1.5 * xs[math.ceil(0.99 * len(xs)) - 1] or None  # nearest-rank percentile


def draw_local_work(tele: JobTelemetry) -> Any:
    """The figure of `local_work`: warm-up steps (<= WARMUP: allocator, cudnn autotuning, bucket rebuild) on
    a narrow panel of their own scale, the steady steps beside them on theirs; None with fewer than 2 ranks."""
    if len(tele.steps) < 2:
        return None
    plt = _plt()
    series = {rank: [(r["step"], local_work_ms(r)) for r in recs] for rank, recs in sorted(tele.steps.items())}
    warm = any(k <= WARMUP for pts in series.values() for k, _ in pts)
    steady = any(k > WARMUP for pts in series.values() for k, _ in pts)
    if warm and steady:
        fig, (wax, ax) = plt.subplots(1, 2, figsize=(9, 2.8), gridspec_kw={"width_ratios": [1, 6]})
    else:
        fig, ax = plt.subplots(figsize=(9, 2.8))
        wax = None
    for rank, pts in series.items():
        if wax is not None:
            w = [(k, v) for k, v in pts if k <= WARMUP]
            wax.plot([k for k, _ in w], [v for _, v in w], lw=1, marker=".", label=f"rank {rank}")
            pts = [(k, v) for k, v in pts if k > WARMUP]
        ax.plot([k for k, _ in pts], [v for _, v in pts], lw=1, label=f"rank {rank}")
    shown = [v for pts in series.values() for k, v in pts if k > WARMUP or wax is None]
    top = steady_top(shown)
    if top:
        ax.set_ylim(0, top)
        over = sum(v > top for v in shown)
        if over:  # said, not hidden: the rare steady step past the scale
            ax.text(0.01, 0.97, f"{over} point(s) above {top:.0f} ms not shown", transform=ax.transAxes,
                    fontsize=7, va="top", color="grey")
    if wax is not None:
        wax.set_title("warm-up", fontsize=8)
        wax.set_ylabel("ms")
        wax.set_xlabel("step")
        wax.grid(alpha=0.3)
        ax.set_title(f"Work before the gradient sync, per rank (steps after {WARMUP}; own scale)")
    else:
        ax.set_ylabel("ms")
        ax.set_title("Work before the gradient sync, per rank")
    ax.set_xlabel("optimizer step")
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    ax.grid(alpha=0.3)
    return fig


@_plots
def local_work(tele: JobTelemetry) -> str | None:
    """Each rank's own work before the gradient sync, per step (where a straggler shows), steady steps on
    their own scale (the first step's seconds of autotuning would otherwise hide every later one)."""
    fig = draw_local_work(tele)
    return None if fig is None else _svg(fig)


@_plots
def memory(tele: JobTelemetry) -> str | None:
    """GPU memory used over time per GPU (NVML); CPU runs: each rank's resident memory."""
    if not tele.samples:
        return None
    plt = _plt()
    t0 = _t0(tele)
    gpu = any("mem_used_gib" in s for ss in tele.samples.values() for s in ss)
    key = "mem_used_gib" if gpu else "rss_gib"
    fig, ax = plt.subplots(figsize=(9, 2.8))
    for rank, ss in sorted(tele.samples.items()):
        ax.plot([s["t"] - t0 for s in ss], [s.get(key, float("nan")) for s in ss], lw=1.2, label=f"rank {rank}")
        if gpu:
            total = next((s["mem_total_gib"] for s in ss if s.get("mem_total_gib")), None)
            if total:
                ax.axhline(total, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("GiB")
    ax.set_title("GPU memory used per GPU (dotted: capacity)" if gpu else "Resident memory per rank (no GPU)")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    ax.grid(alpha=0.3)
    return _svg(fig)


#: A metric name shown as is on a plot; any other is drawn as "metric N" (see the module docstring).
_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.@-]{0,31}")
_VAL_COLORS = ("#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#9d755d")  # never the train loss's blue


def loss_part_names(records: list[dict[str, Any]]) -> list[str]:
    """The loss parts in the training records of metrics.jsonl (loss_<name>, as the log line writes them)."""
    return list(dict.fromkeys(k for r in records if r.get("kind") == "train" for k, v in r.items()
                              if k.startswith("loss_") and isinstance(v, (int, float)) and not isinstance(v, bool)))


def draw_curves(records: list[dict[str, Any]]) -> Any:
    """The figure of `curves`: training loss (left), its named parts when the task logs them (middle, e.g. a
    detector's box, class and objectness terms), validation metrics (right); None with nothing to draw."""
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train"
             and isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))]
    val = [r for r in records if r.get("kind") == "val" and isinstance(r.get("step"), int)]
    names = [k for k in dict.fromkeys(k for r in val for k, v in r.items() if isinstance(v, (int, float))
                                      and not isinstance(v, bool)) if k not in ("step", "time", "eval_s", "epoch")]
    parts = loss_part_names(records)
    if not train and not names:
        return None
    plt = _plt()
    if parts:
        fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3))
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
        middle = None
    if train:
        left.plot([k for k, _ in train], [v for _, v in train], lw=1.2, marker=".", color="#4c78a8",
                  label="train loss (rank 0)")
    for i, name in enumerate(names):
        xs = [(r["step"], float(r[name])) for r in val if isinstance(r.get(name), (int, float))]
        shown = name if _PLAIN_NAME.fullmatch(name) else f"metric {i + 1}"
        # Losses beside the training loss; accuracies and mAPs (0..1) on their own axes.
        ax = left if "loss" in name.lower() else right
        ax.plot([k for k, _ in xs], [v for _, v in xs], lw=1.2, marker="o", ms=3, label=f"val {shown}",
                color=_VAL_COLORS[i % len(_VAL_COLORS)])
    part_values: list[float] = []
    if middle is not None:
        for i, name in enumerate(parts):
            xs = [(r["step"], float(r[name])) for r in records if r.get("kind") == "train"
                  and isinstance(r.get("step"), int) and isinstance(r.get(name), (int, float))]
            part_values += [v for _, v in xs]
            shown = name if _PLAIN_NAME.fullmatch(name) else f"part {i + 1}"
            middle.plot([k for k, _ in xs], [v for _, v in xs], lw=1.2, marker=".", label=shown)
        middle.set_title("Loss parts (train, all ranks)")
        if part_values and min(part_values) > 0 and max(part_values) / min(part_values) > 50:
            middle.set_yscale("log")  # an objectness term 100x below the class term would lie flat on 0
    left.set_title("Loss")
    right.set_title("Validation metrics")
    if not right.lines:  # a run that never validated: say so rather than draw empty axes
        right.text(0.5, 0.5, "no validation metric in this run", ha="center", va="center",
                   transform=right.transAxes, color="#666666")
        right.set_xticks([])
        right.set_yticks([])
    for ax in (left, middle, right):
        if ax is None:
            continue
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    losses = [v for _, v in train] + [float(r[n]) for r in val for n in names if "loss" in n.lower()
                                      and isinstance(r.get(n), (int, float))]
    if losses and min(losses) > 0 and max(losses) / min(losses) > 50:
        left.set_yscale("log")  # a first validation loss 100x the last would flatten the curve
    return fig


@_plots
def curves(records: list[dict[str, Any]]) -> str | None:
    """Training loss per step, its named parts where logged, and every validation metric per step, from
    metrics.jsonl."""
    fig = draw_curves(records)
    return None if fig is None else _svg(fig)
