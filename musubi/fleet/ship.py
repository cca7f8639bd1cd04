"""After the jobs: the leaderboard, ONNX export of the top-k, registration and the deployment manifest."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from musubi.checkpoint.committed import latest_checkpoint  # the torch-free marker reader
from musubi.config.fleet import FleetSpec
from musubi.contract.errors import ConfigError, one_line
from musubi.contract.run_files import RUN_FILES
from musubi.evaluate.leaderboard import external_model, nothing_to_ship
from musubi.store.rundir import read_json

log = logging.getLogger("musubi.fleet")


@dataclass
class Shipped:
    """What ship() did: the leaderboard rows and the top-k jobs whose export was done early (not redone)."""

    rows: list[dict]
    early: list[str] = field(default_factory=list)


def exported_current(job_dir: Path) -> bool:
    """True when the job's evaluation step exported (and parity-checked) its model from the job's newest
    committed checkpoint, during the fleet: shipping registers it without exporting again.

    eval.json's "export" names the graph and its export record (whose "checkpoint" says what was exported);
    the newest checkpoint is found as the export finds it (load_job_model: checksums verified), without torch.
    """
    try:
        export = read_json(job_dir / RUN_FILES.eval).get("export") or {}
        model, record = job_dir / export["file"], read_json(job_dir / export["record"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none, an error, or unreadable
        return False
    newest = latest_checkpoint(job_dir / RUN_FILES.checkpoints, checksums=True, warn=False)
    named = record.get("checkpoint") if isinstance(record, dict) else None
    return model.is_file() and newest is not None and isinstance(named, str) and \
        Path(named).resolve() == newest.path.resolve()


def ship(spec: FleetSpec, run_dir: Path, console: Console) -> Shipped:
    """Rank the fleet, export (unless done early) and register the top-k of each leaderboard table, and say
    per table who won and what was shipped."""
    from musubi.evaluate import build_leaderboard

    lb = spec.leaderboard
    rows = build_leaderboard(run_dir, weights=(lb.quality_weight, lb.fps_weight), fps_target=lb.fps_target,
                             quality_floor=lb.quality_floor, min_quality=lb.min_quality)
    tables: dict[str, list[dict]] = {}
    for row in rows:  # ranked rows, best first, one list per quality metric (leaderboard table)
        if row.get("rank") is not None:
            tables.setdefault(str(row.get("table") or row.get("metric")), []).append(row)
    early: list[str] = []
    verdicts = [_ship_table(metric, ranked, spec, run_dir, console, early) for metric, ranked in tables.items()]
    _print_board_and_manifest(run_dir, console)
    for line in verdicts:  # last: who won and what left the fleet is what a reader looks for
        console.print(line, highlight=False, markup=False)
    return Shipped(rows, early)


def _ship_table(metric: str, ranked: list[dict], spec: FleetSpec, run_dir: Path, console: Console,
                early: list[str]) -> str:
    """Ship the top-k of one table (a model that cannot be exported passes to the next); the verdict line."""
    from musubi.evaluate import export_job
    from musubi.evaluate.registry import promote, register

    lb = spec.leaderboard
    shipped: list[str] = []
    skipped: list[str] = []
    for row in ranked:  # the top-k that export cleanly: a parity failure passes to the next
        if len(shipped) >= lb.export_top:
            break
        job, job_dir, where = row["job"], run_dir / row["job"], f"rank {row['rank']} of {metric}"
        if (job_dir / RUN_FILES.export / RUN_FILES.registered).is_file():
            shipped.append(f"{job} ({where}, registered earlier)")
            continue  # exported and registered by an earlier pass of this run (--resume)
        if nothing_to_ship(job_dir, row.get("kind")):
            skipped.append(f"{job} (external, wrote no model.onnx)")
            console.print(f"{job} ({where}): an external job that wrote no model.onnx: Musubi has no model of it "
                          "to export or register", highlight=False, markup=False)
            continue
        try:
            # A task job exported early, by its evaluation step, is registered as it is.
            external = row.get("kind") == "external"
            reused = not external and exported_current(job_dir)
            if not external and not reused:
                export_job(job_dir)
            entry = register(job_dir)
            if lb.promote:
                promote(entry["name"], entry["version"], run_dir=run_dir)
            if reused:
                early.append(job)
            done = (f"registered {external_model(job_dir)} (external job)" if external else
                    "registered (exported early)" if reused else "exported and registered")
            shipped.append(f"{entry['name']} v{entry['version']} ({where})")
            console.print(f"{job}: {done} as {entry['name']} v{entry['version']} ({where})"
                          + ("; promoted" if lb.promote else ""), highlight=False, markup=False)
        except Exception as e:  # noqa: BLE001 - one model that cannot be exported does not sink the fleet
            what = one_line(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {one_line(e)}"
            log.warning("export/registration of %s failed: %s", job, what)
            skipped.append(f"{job} (export failed)")
            console.print(f"export of {job} failed ({what}); trying the next model", highlight=False,
                          markup=False)
    top = ranked[0]
    winner = f"{metric}: the best is {top['job']} ({top.get('kind') or 'task'} job, score {top['score']:.4f})"
    if not shipped:
        why = ("no built-in model to export (the ranked jobs are external and wrote no model.onnx)"
               if skipped and all("wrote no model.onnx" in s for s in skipped) else "nothing could be exported")
        return f"{winner}; nothing shipped: {why}" + (f" [{'; '.join(skipped)}]" if skipped else "")
    return f"{winner}; shipped: {', '.join(shipped)}" + (f"; not shipped: {', '.join(skipped)}" if skipped else "")


def _print_board_and_manifest(run_dir: Path, console: Console) -> None:
    """The leaderboard tables, then the deployment manifest written (a registry problem never hides the ranking)."""
    from musubi.evaluate.leaderboard_view import print_leaderboard
    from musubi.evaluate.registry import write_manifest

    print_leaderboard(run_dir, console)
    try:
        data = write_manifest(run_dir / "manifest.json", run_dir=run_dir)
    except ConfigError as e:
        console.print(f"manifest: {one_line(e)}", highlight=False, markup=False)
        return
    from musubi.evaluate.registry import warn_skipped

    warn_skipped(data, console)
