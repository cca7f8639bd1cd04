"""`musubi leaderboard`, `export`, `evaluate` and the `registry` group: parse, call musubi.evaluate, print.

Every string that came from a run directory or an external program is printed
as plain text (rich markup off, table cells as Text), so a job or metric named
`[red]x` or `<b>` shows as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from musubi.cli.output import fail, out_console
from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_FAILED
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.leaderboard_view import cell, print_leaderboard
from musubi.evaluate.registry import warn_skipped

registry_app = typer.Typer(add_completion=False, no_args_is_help=True,
                           help="The model registry: list, register, promote, demote, manifest, rebuild.")

_DB_HELP = "Registry database, an existing one (default runs/musubi.db: the one beside the default run directories)."


_CKPT_HELP = ("Which committed checkpoint: best (the best validation primary metric, or checkpoint.best_metric, "
              "recorded at save time), last (the newest, the default) or a step number.")


def _say_registry(path: Path, note: str = "") -> None:
    """The registry a command used, on stderr (stdout stays clean for --json)."""
    Console(stderr=True, soft_wrap=True).print(Text(f"registry: {path}{note}"), highlight=False)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=1, default=str))


def _weights(text: str) -> tuple[float, float]:
    try:
        q, f = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--weights {text!r}: give two numbers, quality and fps, e.g. 0.7,0.3") from None
    return q, f


def fleet_rule(run_dir: Path) -> tuple[tuple[float, float], float | None, float | None, dict[str, float]] | None:
    """The fleet's own leaderboard weights, FPS target, quality floor and absolute floors by metric (RUN/run.json;
    the floor None and the absolute ones {} when the run predates them), or None for a run without them."""
    from musubi.store.rundir import read_json

    try:
        lb = read_json(Path(run_dir) / RUN_FILES.run)["config"]["leaderboard"]
        floor = lb.get("quality_floor")
        return ((float(lb["quality_weight"]), float(lb["fps_weight"])), lb.get("fps_target"),
                float(floor) if floor is not None else None,
                {str(k): float(v) for k, v in (lb.get("min_quality") or {}).items()})
    except (OSError, ValueError, KeyError, TypeError, RecursionError, AttributeError):
        return None


def _min_quality(items: list[str]) -> dict[str, float]:
    """--min-quality METRIC=VALUE options as a dict (ConfigError naming a malformed one)."""
    out = {}
    for item in items:
        metric, _, value = item.partition("=")
        try:
            out[metric.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--min-quality {item!r}: give METRIC=VALUE, e.g. map50=0.1") from None
        if not metric.strip():
            raise ConfigError(f"--min-quality {item!r}: give METRIC=VALUE, e.g. map50=0.1")
    return out


def leaderboard_command(
    run_dir: Path = typer.Argument(..., help="Run directory (RUN/ with one folder per job)."),
    as_json: bool = typer.Option(False, "--json", help="Print leaderboard.json instead of a table."),
    weights: str | None = typer.Option(None, "--weights", help="Quality and FPS weights: score = wq x quality + "
                                       "wf x fps_norm (default: the fleet's own, from RUN/run.json; else 0.7,0.3)."),
    fps_target: float | None = typer.Option(None, "--fps-target", help="Normalise FPS by this target "
                                            "(min(1, fps/target)) instead of the fleet's best."),
    quality_floor: float | None = typer.Option(None, "--quality-floor", help="Rank only jobs whose quality is "
                                               "above 0 and at least this share of the best (same metric); "
                                               "default: the fleet's own, else 0.5."),
    min_quality: list[str] = typer.Option([], "--min-quality", help="Absolute floor of a metric, METRIC=VALUE "
                                          "(repeatable), e.g. map50=0.1: below it a job is not ranked. Default: "
                                          "the fleet's own, else map50 0.05, map 0.02, top1/top5 a tenth of the way "
                                          "from chance to 1."),
    write: bool = typer.Option(False, "--write", help="Write the ranking to RUN/leaderboard.json and the "
                               "store's history (without it the command only shows)."),
    history: bool = typer.Option(False, "--history", help="Show every ranking of this run the store kept "
                                 "(musubi.db beside RUN), oldest first."),
) -> None:
    """Show a run's ranking (by the fleet's own weights unless --weights); --write records it in
    RUN/leaderboard.json and the history (the next fleet's first job is read from that file)."""
    from musubi.evaluate.leaderboard import (
        LEADERBOARD_FILE,
        build_leaderboard,
        collect_jobs,
        rank_jobs,
        read_leaderboard,
    )
    from musubi.evaluate.score import DEFAULT_QUALITY_FLOOR, ScoreRule

    if history:
        _print_history(run_dir, as_json)
        return
    try:
        own = fleet_rule(run_dir)
        chosen = _weights(weights) if weights is not None else (own[0] if own else (0.7, 0.3))
        target = fps_target if fps_target is not None else (own[1] if own and weights is None else None)
        floor = quality_floor if quality_floor is not None else (
            own[2] if own and own[2] is not None else DEFAULT_QUALITY_FLOOR)
        absolute = {**(own[3] if own else {}), **_min_quality(min_quality)}
        rule = ScoreRule(chosen[0], chosen[1], target, floor, absolute)  # checked before anything is written
        if write:
            build_leaderboard(run_dir, weights=chosen, fps_target=target, quality_floor=floor, min_quality=absolute)
            board = read_leaderboard(run_dir)
        elif weights is None and fps_target is None and quality_floor is None and not min_quality and \
                (Path(run_dir) / LEADERBOARD_FILE).is_file():
            board = read_leaderboard(run_dir)  # the board the fleet wrote: shown as it is
        else:
            if not Path(run_dir).is_dir():
                raise ConfigError(f"{run_dir}: no such run directory")
            rows, header = rank_jobs(collect_jobs(run_dir), rule)
            board = {**header, "rows": rows}
    except ConfigError as e:
        fail(str(e))
        return
    if as_json:
        _print_json(board)
        return
    print_leaderboard(run_dir, board=board)


def _print_history(run_dir: Path, as_json: bool) -> None:
    import datetime as dt

    from musubi.evaluate.registry import leaderboard_history, resolve_db

    if not Path(run_dir).is_dir():
        fail(f"{run_dir}: no such run directory")
    here = str(Path(run_dir).resolve())
    if not as_json:
        _say_registry(resolve_db(run_dir=run_dir))
    rows = [h for h in leaderboard_history(run_dir=run_dir) if h["run_dir"] == here]
    if as_json:
        _print_json(rows)
        return
    if not rows:
        Console().print(Text(f"no leaderboard of {run_dir} in the store (written by `musubi run` or --write)"))
        return
    table = Table(title=Text(f"leaderboard history of {run_dir}"), title_justify="left")
    for col in ("written (UTC)", "rank", "job", "score"):
        table.add_column(col, justify="right" if col in ("rank", "score") else "left", overflow="fold")
    for h in rows:
        when = dt.datetime.fromtimestamp(h["created"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(*(Text(c) for c in (when, cell(h["rank"]), h["job"], cell(h["score"]))))
    out_console().print(table)


# -- export and evaluate --------------------------------------------------------
def export_command(
    job_dir: Path = typer.Argument(..., help="Job directory (RUN/JOB) with a committed checkpoint."),
    format_: str = typer.Option("onnx", "--format", help="onnx (checked against torch with ONNX Runtime) or pt "
                                "(plain state_dict: torch.load(weights_only=True) into the model weights.json names)."),
    opset: int = typer.Option(17, "--opset", help="ONNX opset."),
    exporter: str = typer.Option("auto", "--exporter", help="auto, torchscript (dynamo=False) or dynamo."),
    checkpoint: str = typer.Option("last", "--checkpoint", help=_CKPT_HELP),
) -> None:
    """Export a job's model to JOB/export/model.onnx, checked against torch with ONNX Runtime; exit 1 if they differ."""
    from musubi.evaluate.onnx_export import ParityError, export_job

    if format_ not in ("onnx", "pt"):
        fail(f"--format {format_!r}: use onnx or pt")
    if format_ == "pt":
        _export_pt(job_dir, checkpoint)
        return
    try:
        record = export_job(job_dir, opset=opset, exporter=exporter, checkpoint=checkpoint)
    except ParityError as e:
        fail(str(e), EXIT_FAILED)
        return
    except ConfigError as e:
        fail(str(e))
        return
    parity = record["parity"]
    figures = ", ".join(f"{k} {cell(parity[k], 3)}" for k in
                        ("max_abs_diff", "argmax_agreement", "exact", "explained", "max_box_diff_px",
                         "max_score_diff") if k in parity)
    if parity.get("kinds"):  # detection differences a decision boundary explains: counted, listed in export.json
        figures += ", explained: " + ", ".join(f"{v} {k}" for k, v in parity["kinds"].items())
    maps = parity.get("map")
    if maps:
        figures += f", sample mAP50 torch {cell(maps['torch']['map50'])} / onnx {cell(maps['onnx']['map50'])}"
    Console().print(Text(f"{job_dir / RUN_FILES.export / record['file']}  step {record['step']}, opset {record['opset']} "
                         f"({record['exporter']}), "
                         f"sha256 {record['sha256'][:16]}..., parity ok on {parity.get('inputs')} input(s): "
                         f"{figures}"), highlight=False)


def _export_pt(job_dir: Path, checkpoint: str = "last") -> None:
    """`--format pt`: JOB/export/model.pt and the line that says how to load it."""
    from musubi.evaluate.weights_export import export_weights

    try:
        record = export_weights(job_dir, checkpoint)
    except ConfigError as e:
        fail(str(e))
        return
    build = record.get("build", f"the job's {record['model']} model")
    Console().print(Text(f"{job_dir / RUN_FILES.export / record['file']}  {record['tensors']} tensors, step {record['step']}, "
                         f"sha256 {record['sha256'][:16]}...; load: model = {build}; {record['load']}"),
                    highlight=False, soft_wrap=True)


def evaluate_command(
    job_dir: Path = typer.Argument(..., help="Job directory (RUN/JOB), a Musubi task job or an external job."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: a GPU if visible)."),
    export: bool = typer.Option(False, "--export", help="Also export to ONNX and time ONNX Runtime."),
    runs: int | None = typer.Option(None, "--runs", help="Timed runs (default 100 on a GPU, 10 on the CPU)."),
    warmup: int | None = typer.Option(None, "--warmup", help="Untimed warm-up runs (default 10 GPU, 3 CPU)."),
    predictions: Path | None = typer.Option(
        None, "--predictions", help="Instead of FPS: write the model's predictions on the validation file as COCO "
                                    "results JSON (image_id, category_id, bbox xywh, score) to this file."),
    checkpoint: str = typer.Option("last", "--checkpoint", help=_CKPT_HELP),
) -> None:
    """Measure a job's FPS by the documented protocol and update its eval.json (or write --predictions)."""
    from musubi.evaluate.job_eval import evaluate_job

    if predictions is not None:
        from musubi.evaluate.predictions import write_predictions

        try:
            done = write_predictions(job_dir, predictions, device, checkpoint)
        except ConfigError as e:
            fail(str(e))
            return
        Console().print(Text(f"{done['detections']} detections on {done['images']} images -> {done['file']} "
                             f"(COCO results; ground truth: {done['annotations']})"), highlight=False)
        return
    try:
        record = evaluate_job(job_dir, device=device, export=export, fps_runs=runs, fps_warmup=warmup,
                              checkpoint=checkpoint)
    except ConfigError as e:
        fail(str(e))
        return
    fps = record.get("fps") or {}
    line = (f"{job_dir.name}: {fps.get('fps', 0):.1f} fps ({fps.get('runtime')}, {fps.get('device_name')}, "
            f"median {fps.get('median_ms', 0):.2f} ms of {fps.get('runs')})" if fps else
            f"{job_dir.name}: no fps ({record.get('fps_missing')})")
    Console().print(Text(line), highlight=False)


# -- registry -------------------------------------------------------------------
def registry_table(entries: list[dict[str, Any]]) -> Table:
    """A rich table of registry entries (plain Text cells)."""
    table = Table()
    for col in ("name", "version", "promoted", "model", "metric", "fps", "dataset", "sha256", "job"):
        table.add_column(col, overflow="fold")  # a long cell wraps, never ends in `…`
    for e in entries:
        metric = e.get("primary_metric")
        value = (e.get("metrics") or {}).get(metric) if metric else None
        fps = (e.get("fps") or {}).get("fps")
        model = e["files"][0] if e.get("files") else {}
        table.add_row(*(Text(str(c)) for c in (
            e["name"], e["version"], "yes" if e["promoted"] else "", e["input"].get("model") or e["input"].get("task"),
            f"{metric} {cell(value)}" if metric else "-", cell(fps), e.get("dataset_hash") or "-",
            (model.get("sha256") or "")[:12], e["job_dir"])))
    return table


@registry_app.command("list")
def registry_list(
    db: Path | None = typer.Option(None, "--db", help=_DB_HELP),
    name: str | None = typer.Option(None, "--name", help="Only this model's versions."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List registered models and versions (promoted ones marked)."""
    from musubi.evaluate.registry import existing_db, list_models

    try:
        path = existing_db(db)
        if not as_json:  # --json: the output is the document alone (a test runner merges the streams)
            _say_registry(path, "" if path.exists() else " (none yet: `musubi registry register RUN/JOB` creates it)")
        entries = list_models(db=path, name=name)
    except ConfigError as e:
        fail(str(e))
        return
    if as_json:
        _print_json(entries)
    elif not entries:
        Console().print(Text("no registered models" + (f" named {name!r}" if name else "")))
    else:
        out_console().print(registry_table(entries))  # a pipe gets whole cells, not 80 columns


@registry_app.command("register")
def registry_register(
    job_dir: Path = typer.Argument(..., help="Job directory with export/model.onnx (or an external model.onnx)."),
    name: str | None = typer.Option(None, "--name", help="Model name (default: the job name)."),
    db: Path | None = typer.Option(None, "--db", help="Registry database (default: musubi.db beside the run)."),
) -> None:
    """Register a job's exported model as the next version of its name."""
    from musubi.evaluate.registry import DEFAULT_DB, register, resolve_db

    try:
        entry = register(job_dir, name=name, db=db)
    except ConfigError as e:
        fail(str(e))
        return
    path = resolve_db(db, Path(job_dir).resolve().parent)
    other = path.resolve() != DEFAULT_DB.resolve()
    _say_registry(path, f" (the other registry commands read {DEFAULT_DB}: give them --db {path})" if other else "")
    Console().print(Text(f"registered {entry['name']} v{entry['version']} ({entry['files'][0]['sha256'][:12]})"))


@registry_app.command("promote")
def registry_promote(
    name: str = typer.Argument(..., help="Model name."),
    version: int = typer.Argument(..., help="Version to promote (the name's others are demoted)."),
    db: Path | None = typer.Option(None, "--db", help=_DB_HELP),
    manifest: Path | None = typer.Option(None, "--manifest", help="Deployment manifest to rewrite "
                                         "(default: manifest.json beside the database)."),
) -> None:
    """Promote a model version for deployment and rewrite the deployment manifest."""
    from musubi.evaluate.registry import existing_db, promote, write_manifest

    try:
        path = existing_db(db)
        _say_registry(path)
        promote(name, version, db=path)
        out = manifest or path.parent / "manifest.json"
        data = write_manifest(out, db=path)
    except ConfigError as e:
        fail(str(e))
        return
    Console().print(Text(f"promoted {name} v{version}; {out} lists {len(data['models'])} model(s)"))


@registry_app.command("manifest")
def registry_manifest(
    db: Path | None = typer.Option(None, "--db", help=_DB_HELP),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output (default: manifest.json beside the database)."),
) -> None:
    """Write the deployment manifest: promoted models, files with sha256, input spec, measured FPS."""
    from musubi.evaluate.registry import existing_db, write_manifest

    try:
        path = existing_db(db)
        _say_registry(path)
        target = out or path.parent / "manifest.json"
        data = write_manifest(target, db=path)
    except ConfigError as e:
        fail(str(e))
        return
    warn_skipped(data)
    Console().print(Text(f"{target}: {len(data['models'])} promoted model(s)"))


@registry_app.command("demote")
def registry_demote(
    model: str = typer.Argument(..., help="NAME (every promoted version) or NAME:VERSION."),
    db: Path | None = typer.Option(None, "--db", help=_DB_HELP),
    manifest: Path | None = typer.Option(None, "--manifest", help="Deployment manifest to rewrite "
                                         "(default: manifest.json beside the database)."),
) -> None:
    """Take a model version out of deployment (also one whose run was deleted) and rewrite the manifest."""
    from musubi.evaluate.registry import demote, existing_db, write_manifest

    name, _, ver = model.partition(":")
    try:
        if ver and not ver.isdigit():
            raise ConfigError(f"{model!r}: give NAME or NAME:VERSION (a version number), e.g. {name}:2")
        path = existing_db(db)
        _say_registry(path)
        versions = demote(name, int(ver) if ver else None, db=path)
        out = manifest or path.parent / "manifest.json"
        data = write_manifest(out, db=path)
    except ConfigError as e:
        fail(str(e))
        return
    warn_skipped(data)
    Console().print(Text(f"demoted {name} v{', v'.join(map(str, versions))}; {out} lists "
                         f"{len(data['models'])} model(s)"))


@registry_app.command("rebuild")
def registry_rebuild(
    runs_root: Path = typer.Argument(Path("runs"), help="Folder holding the run directories."),
    db: Path | None = typer.Option(None, "--db", help="Database to rebuild (default RUNS_ROOT/musubi.db)."),
) -> None:
    """Restore the registry from the run directories (each job's export/registered.json)."""
    from musubi.evaluate.registry import rebuild_registry

    try:
        count = rebuild_registry(runs_root, db=db)
    except ConfigError as e:
        fail(str(e))
        return
    _say_registry(Path(db) if db is not None else Path(runs_root) / "musubi.db")
    Console().print(Text(f"restored {count} registry entr{'y' if count == 1 else 'ies'}"))
