"""After the jobs: the leaderboard, ONNX export of the top-k, registration and the deployment manifest."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from musubi.checkpoint.checkpoint import latest_checkpoint
from musubi.config.errors import ConfigError, one_line
from musubi.config.fleet import FleetSpec
from musubi.config.run_files import RUN_FILES
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
    newest = latest_checkpoint(job_dir / "checkpoints", checksums=True, warn=False)
    named = record.get("checkpoint") if isinstance(record, dict) else None
    return model.is_file() and newest is not None and isinstance(named, str) and \
        Path(named).resolve() == newest.path.resolve()


def ship(spec: FleetSpec, run_dir: Path, console: Console) -> Shipped:
    """Rank the fleet, export (unless done early) and register its top-k."""
    from musubi.evaluate import build_leaderboard, export_job
    from musubi.evaluate.commands import print_leaderboard
    from musubi.store.registry import promote, register, write_manifest

    lb = spec.leaderboard
    rows = build_leaderboard(run_dir, weights=(lb.quality_weight, lb.fps_weight), fps_target=lb.fps_target,
                             quality_floor=lb.quality_floor)
    ranked = [r for r in rows if r.get("rank") is not None]
    shipped, early = 0, []
    for row in ranked:  # the top-k that export cleanly: a parity failure passes to the next
        if shipped >= lb.export_top:
            break
        job_dir = run_dir / row["job"]
        if (job_dir / "export" / "registered.json").is_file():
            shipped += 1
            continue  # exported and registered by an earlier pass of this run (--resume)
        try:
            # A task job exported early, by its evaluation step, is registered as it is.
            reused = row.get("kind") != "external" and exported_current(job_dir)
            if row.get("kind") == "external":
                if not (job_dir / "model.onnx").is_file():
                    console.print(f"{row['job']}: external job wrote no model.onnx: nothing to register",
                                  highlight=False, markup=False)
                    continue
            elif not reused:
                export_job(job_dir)
            entry = register(job_dir)
            if lb.promote:
                promote(entry["name"], entry["version"], run_dir=run_dir)
            shipped += 1
            if reused:
                early.append(row["job"])
            done = "registered (exported early)" if reused else "exported and registered"
            console.print(f"{done} {entry['name']} v{entry['version']} (rank {row['rank']})"
                          + ("; promoted" if lb.promote else ""), highlight=False, markup=False)
        except Exception as e:  # noqa: BLE001 - one model that cannot be exported does not sink the fleet
            what = one_line(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {one_line(e)}"
            log.warning("export/registration of %s failed: %s", row["job"], what)
            console.print(f"export of {row['job']} failed ({what}); trying the next model", highlight=False,
                          markup=False)
    print_leaderboard(run_dir, console)  # first: a registry problem never hides the ranking
    try:
        data = write_manifest(run_dir / "manifest.json", run_dir=run_dir)
    except ConfigError as e:
        console.print(f"manifest: {one_line(e)}", highlight=False, markup=False)
        return Shipped(rows, early)
    from musubi.store.registry import warn_skipped

    warn_skipped(data, console)
    return Shipped(rows, early)
