"""After the jobs: the leaderboard, ONNX export of the top-k, registration and the deployment manifest."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console

from musubi.config.errors import ConfigError, one_line
from musubi.config.fleet import FleetSpec

log = logging.getLogger("musubi.fleet")


def ship(spec: FleetSpec, run_dir: Path, console: Console) -> list[dict]:
    """Rank the fleet, export and register its top-k; returns the leaderboard rows."""
    from musubi.evaluate import build_leaderboard, export_job
    from musubi.evaluate.commands import print_leaderboard
    from musubi.store.registry import promote, register, write_manifest

    lb = spec.leaderboard
    rows = build_leaderboard(run_dir, weights=(lb.quality_weight, lb.fps_weight), fps_target=lb.fps_target,
                             quality_floor=lb.quality_floor)
    ranked = [r for r in rows if r.get("rank") is not None]
    shipped = 0
    for row in ranked:  # the top-k that export cleanly: a parity failure passes to the next
        if shipped >= lb.export_top:
            break
        job_dir = run_dir / row["job"]
        if (job_dir / "export" / "registered.json").is_file():
            shipped += 1
            continue  # exported and registered by an earlier pass of this run (--resume)
        try:
            if row.get("kind") == "external":
                if not (job_dir / "model.onnx").is_file():
                    console.print(f"{row['job']}: external job wrote no model.onnx: nothing to register",
                                  highlight=False, markup=False)
                    continue
            else:
                export_job(job_dir)
            entry = register(job_dir)
            if lb.promote:
                promote(entry["name"], entry["version"], run_dir=run_dir)
            shipped += 1
            console.print(f"exported and registered {entry['name']} v{entry['version']} (rank {row['rank']})"
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
        return rows
    from musubi.store.registry import warn_skipped

    warn_skipped(data, console)
    return rows
