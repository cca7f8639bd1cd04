"""The model registry in `musubi.db`: versions of exported models, promotion, the deployment manifest.

A registered model is an ONNX file (a task job's JOB/export/model.onnx, or an
external job's JOB/model.onnx) with its sha256, metrics, dataset version, the
machine it was trained on and the run it came from. Versions count up per name;
promoting a version demotes the name's others (one deployable version a name).
Every registration and promotion is also written to JOB/export/registered.json,
so `rebuild_registry` can restore the table from the run directories.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from musubi.config.job import check_safe_name
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES
from musubi.data.job_version import dataset_version
from musubi.store.db import db_path
from musubi.store.rundir import read_json, write_json

#: Where the registry lives when neither a database nor a run directory is named (runs/<time>-<name> sit beside it).
DEFAULT_DB = Path("runs") / "musubi.db"
MANIFEST_FORMAT = "musubi-manifest/1"
MARKER = Path(RUN_FILES.export) / RUN_FILES.registered

SCHEMA = """
CREATE TABLE IF NOT EXISTS registry (
    name TEXT NOT NULL,            -- model name (default: the job name)
    version INTEGER NOT NULL,      -- 1, 2, ... per name
    job_dir TEXT NOT NULL,         -- absolute path of the job directory
    run_dir TEXT NOT NULL,
    files TEXT NOT NULL,           -- JSON [{"role", "path", "sha256", "bytes"}]
    metrics TEXT NOT NULL,         -- JSON of eval.json's metrics
    primary_metric TEXT,
    dataset_hash TEXT,             -- synthetic-<sha> / data-<sha>-<opts> (content hash), or NULL when unknown
    env TEXT NOT NULL,             -- JSON of RUN/env.json
    input TEXT NOT NULL,           -- JSON: graph inputs/outputs and what the input means
    fps TEXT,                      -- JSON of eval.json's fps (protocol, device, runtime), by_runtime
    promoted INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS leaderboard_history (
    run_dir TEXT NOT NULL,
    job TEXT NOT NULL,
    rank INTEGER,                  -- NULL: not ranked (see detail.reason)
    score REAL,
    detail TEXT NOT NULL,          -- JSON of the leaderboard row
    created REAL NOT NULL
);
"""
_JSON_COLUMNS = ("files", "metrics", "env", "input", "fps")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_db(db: Path | None = None, run_dir: Path | None = None) -> Path:
    """The database, by the one rule: `db`, else the one beside `run_dir`, else runs/musubi.db.

    A registry is `musubi.db` in the folder that holds the run directories: a command that names a run
    (register, the fleet's own registration) uses the one beside it; a command that names none uses
    runs/musubi.db under the working directory unless `--db` names another.
    """
    if db is not None:
        return Path(db)
    if run_dir is not None:
        return db_path(Path(run_dir))
    return DEFAULT_DB


def existing_db(db: Path | None) -> Path:
    """The registry of a command that reads one (list, promote, demote, manifest): a named `db` must exist."""
    if db is not None and not Path(db).is_file():
        raise ConfigError(f"--db {db}: no such registry database; give the musubi.db beside your run directories "
                          f"(default {DEFAULT_DB}), or restore it with `musubi registry rebuild RUNS_ROOT --db {db}`")
    return resolve_db(db)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = sqlite3.connect(str(path), timeout=30)
        con.executescript(SCHEMA)
    except sqlite3.Error as e:
        raise ConfigError(f"{path}: cannot open the registry database ({e}); rebuild it with "
                          "`musubi registry rebuild`") from None
    return con


def _row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    row = {d[0]: v for d, v in zip(cursor.description, values, strict=True)}
    for key in _JSON_COLUMNS:
        row[key] = json.loads(row[key]) if row.get(key) is not None else None
    row["promoted"] = bool(row["promoted"])
    return row


def _read_optional_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError):
        raise ConfigError(f"{path}: not readable JSON; fix or remove it") from None
    return data if isinstance(data, dict) else {}


def _model_file(job_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The deployable ONNX file of a job and its export record (empty for an external job's file)."""
    exported = job_dir / RUN_FILES.export / RUN_FILES.onnx
    if exported.is_file():
        record = _read_optional_json(job_dir / RUN_FILES.export / RUN_FILES.export_record)
        parity = record.get("parity") or {}
        if record and not parity.get("ok", False):
            raise ConfigError(f"{job_dir / RUN_FILES.export / RUN_FILES.export_record}: parity check failed "
                              f"({parity.get('problem', 'outputs differ beyond tolerance')}); not registering it")
        return exported, record
    external = job_dir / RUN_FILES.onnx
    if external.is_file():
        return external, {}
    raise ConfigError(f"{job_dir}: no export/model.onnx (nor model.onnx); run `musubi export {job_dir}` first")


def _input_spec(model_file: Path, export: dict[str, Any], evaluation: dict[str, Any]) -> dict[str, Any]:
    """Graph inputs/outputs and the input's meaning (export.json, else the ONNX graph and eval.json)."""
    if export:
        return {"inputs": export.get("inputs", []), "outputs": export.get("outputs", []),
                "info": export.get("input_info", {}), "opset": export.get("opset")}
    spec: dict[str, Any] = {"inputs": [], "outputs": [], "info": evaluation.get("input") or {}}
    try:
        import onnx

        graph = onnx.load(str(model_file), load_external_data=False).graph
        for key, values in (("inputs", graph.input), ("outputs", graph.output)):
            spec[key] = [{"name": v.name,
                          "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                          "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name}
                         for v in values]
    except Exception:  # onnx missing or an unreadable graph: the manifest says what it knows
        pass
    return spec


def _fps_summary(evaluation: dict[str, Any]) -> dict[str, Any] | None:
    """eval.json's headline FPS (protocol and device kept), with the other runtimes' figures under by_runtime."""
    fps = evaluation.get("fps")
    if not isinstance(fps, dict):
        return {"fps": fps} if isinstance(fps, (int, float)) and not isinstance(fps, bool) else None
    others = evaluation.get("fps_all") if isinstance(evaluation.get("fps_all"), dict) else {}
    by_runtime = {rt: {k: v.get(k) for k in ("fps", "median_ms", "device_name", "unit")}
                  for rt, v in others.items() if isinstance(v, dict) and rt != fps.get("runtime")}
    return {**fps, "by_runtime": by_runtime} if by_runtime else dict(fps)


def register(job_dir: Path, name: str | None = None, db: Path | None = None) -> dict[str, Any]:
    """Register a job's ONNX model as the next version of `name` (default: the job's name); returns the entry.

    Registering the same file of the same job again returns the existing entry.
    """
    job_dir = Path(job_dir).resolve()
    run_dir = job_dir.parent
    path = resolve_db(db, run_dir)
    model_file, export = _model_file(job_dir)
    evaluation = _read_optional_json(job_dir / RUN_FILES.eval)
    job_record = _read_optional_json(job_dir / RUN_FILES.job)
    config = job_record.get("config") if isinstance(job_record.get("config"), dict) else {}
    name = name or str(config.get("name") or job_dir.name)
    try:  # a registered name ends up in deployment manifests and file names downstream
        check_safe_name(name)
    except ValueError as e:
        raise ConfigError(f"model name {name!r}: {e}; choose another --name") from None
    sha = file_sha256(model_file)
    files = [{"role": "model", "path": str(model_file), "sha256": sha, "bytes": model_file.stat().st_size}]
    if export:
        record = job_dir / RUN_FILES.export / RUN_FILES.export_record
        files.append({"role": "export-record", "path": str(record), "sha256": file_sha256(record),
                      "bytes": record.stat().st_size})
    env = _read_optional_json(run_dir / RUN_FILES.env)
    # The version recorded when the run started is what it trained on; hash now only for older runs.
    dataset = (env.get("datasets") or {}).get(str(config.get("name") or job_dir.name))
    if dataset is None and config:
        dataset = dataset_version(config, store=path)
    elif dataset is None:
        dataset = evaluation.get("dataset_hash")
    input_spec = _input_spec(model_file, export, evaluation)
    trained = evaluation.get("precision") if isinstance(evaluation.get("precision"), dict) else {}
    recipe = export.get("recipe") if isinstance(export.get("recipe"), dict) else None
    classes = export.get("classes") or evaluation.get("classes")
    # Class names and the inference recipe (preprocessing; a sliced job's tile, overlap and merge) ship with the
    # model: the manifest is all an edge consumer reads.
    input_spec.update(task=config.get("task") or "external", model=config.get("model"),
                      precision=trained.get("final"), classes=classes if isinstance(classes, list) else None,
                      recipe=recipe)
    with _connect(path) as con:
        con.execute("BEGIN IMMEDIATE")  # version numbers: one writer at a time
        cur = con.execute("SELECT * FROM registry WHERE name = ? AND job_dir = ?", (name, str(job_dir)))
        for values in cur.fetchall():
            entry = _row(cur, values)
            if entry["files"][0]["sha256"] == sha:
                return entry
        version = con.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM registry WHERE name = ?",
                              (name,)).fetchone()[0]
        created = time.time()
        con.execute(
            "INSERT INTO registry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
            (name, version, str(job_dir), str(run_dir), json.dumps(files), json.dumps(evaluation.get("metrics") or {}),
             evaluation.get("primary_metric"), dataset, json.dumps(env), json.dumps(input_spec),
             json.dumps(_fps_summary(evaluation)), created),
        )
    _write_marker(job_dir, name, version, created, promoted=False)
    return get_model(name, version, db=path)


def _write_marker(job_dir: Path, name: str, version: int, created: float, promoted: bool) -> None:
    """JOB/export/registered.json: what `rebuild_registry` restores the row from."""
    write_json(job_dir / MARKER, {"name": name, "version": version, "created": created, "promoted": promoted})


def get_model(name: str, version: int, db: Path | None = None, run_dir: Path | None = None) -> dict[str, Any]:
    """One registry entry (ConfigError naming what exists when there is no such version)."""
    path = resolve_db(db, run_dir)
    with _connect(path) as con:
        cur = con.execute("SELECT * FROM registry WHERE name = ? AND version = ?", (name, int(version)))
        values = cur.fetchone()
        if values is None:
            known = [v for (v,) in con.execute("SELECT version FROM registry WHERE name = ? ORDER BY version",
                                              (name,))]
            hint = f"versions of {name!r}: {', '.join(map(str, known))}" if known else \
                "no model of that name; see `musubi registry list`"
            raise ConfigError(f"{path}: no model {name!r} version {version} ({hint})")
        return _row(cur, values)


def list_models(db: Path | None = None, run_dir: Path | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """Registry entries (all, or one name's), by name then version."""
    path = resolve_db(db, run_dir)
    if not path.exists():
        return []
    with _connect(path) as con:
        if name is None:
            cur = con.execute("SELECT * FROM registry ORDER BY name, version")
        else:
            cur = con.execute("SELECT * FROM registry WHERE name = ? ORDER BY version", (name,))
        return [_row(cur, values) for values in cur.fetchall()]


def _check_files(entry: dict[str, Any]) -> None:
    """ConfigError unless every file of an entry is on disk with its registered sha256."""
    for f in entry["files"]:
        p = Path(f["path"])
        if not p.is_file():
            raise ConfigError(f"{p}: registered file of {entry['name']} v{entry['version']} is missing")
        if file_sha256(p) != f["sha256"]:
            raise ConfigError(f"{p}: changed since {entry['name']} v{entry['version']} was registered "
                              "(sha256 differs); export and register it again")


def promote(name: str, version: int, db: Path | None = None, run_dir: Path | None = None) -> dict[str, Any]:
    """Mark one version deployable (its files verified) and demote the name's other versions."""
    path = resolve_db(db, run_dir)
    entry = get_model(name, version, db=path)
    _check_files(entry)
    with _connect(path) as con:
        others = con.execute("SELECT version, job_dir, created FROM registry WHERE name = ? AND promoted = 1",
                             (name,)).fetchall()
        con.execute("UPDATE registry SET promoted = (version = ?) WHERE name = ?", (int(version), name))
    for v, job_dir, created in others:
        if v != int(version) and Path(job_dir).is_dir():
            _write_marker(Path(job_dir), name, v, created, promoted=False)
    _write_marker(Path(entry["job_dir"]), name, int(version), entry["created"], promoted=True)
    return get_model(name, version, db=path)


def manifest(db: Path | None = None, run_dir: Path | None = None, base: Path | None = None) -> dict[str, Any]:
    """The deployment manifest: promoted models, their files (sha256), input spec and measured FPS."""
    path = resolve_db(db, run_dir)
    models, skipped = [], []
    for e in list_models(db=path):
        if not e["promoted"]:
            continue
        try:
            _check_files(e)
        except ConfigError as err:  # a deleted old run must not break every later manifest
            skipped.append(f"{e['name']} v{e['version']} left out: {err}; `musubi registry demote "
                           f"{e['name']}:{e['version']}` drops it for good, or restore the file")
            continue
        files = []
        for f in e["files"]:
            item = dict(f)
            if base is not None:
                item["relpath"] = os.path.relpath(f["path"], base)
            files.append(item)
        env = e["env"] or {}
        recipe = e["input"].get("recipe") or {}
        models.append({
            "name": e["name"],
            "version": e["version"],
            "rank": _leaderboard_rank(Path(e["run_dir"]), Path(e["job_dir"]).name),
            "task": e["input"].get("task"),
            "model": e["input"].get("model"),
            "classes": e["input"].get("classes"),
            "files": files,
            "recipe": recipe or None,
            # A sliced job: the tile, overlap and merge its whole-frame figures were measured with (None: whole images).
            "slice": recipe.get("slice"),
            "measured": recipe.get("measured"),
            "input": {k: e["input"].get(k) for k in ("inputs", "outputs", "info", "opset")},
            "fps": e["fps"],
            "metrics": e["metrics"],
            "primary_metric": e["primary_metric"],
            "trained_precision": e["input"].get("precision"),
            "dataset_hash": e["dataset_hash"],
            "trained_on": {"host": env.get("host"), "gpus": [g.get("name") for g in env.get("gpus", [])],
                           "torch": env.get("torch"), "cuda": env.get("cuda")},
            "job_dir": e["job_dir"],
            "registered": dt.datetime.fromtimestamp(e["created"], dt.timezone.utc).isoformat(),
        })
    return {"format": MANIFEST_FORMAT, "created": dt.datetime.now(dt.timezone.utc).isoformat(),
            "registry": str(path), "models": models, "skipped": skipped}


def _leaderboard_rank(run_dir: Path, job: str) -> int | None:
    """The job's rank in its run's leaderboard.json (None when unranked or the file is gone)."""
    try:
        board = _read_optional_json(run_dir / RUN_FILES.leaderboard)
    except ConfigError:  # a damaged leaderboard never breaks a manifest
        return None
    for row in board.get("rows") or []:
        if isinstance(row, dict) and row.get("job") == job and isinstance(row.get("rank"), int):
            return int(row["rank"])
    return None


def demote(name: str, version: int | None = None, db: Path | None = None,
           run_dir: Path | None = None) -> list[int]:
    """Take one version (or, without `version`, every promoted version) of `name` out of deployment.

    Works whether or not the files still exist (a deleted run's model is demoted the same way);
    returns the versions demoted.
    """
    path = resolve_db(db, run_dir)
    if version is not None:
        get_model(name, version, db=path)  # ConfigError naming the versions that exist
    with _connect(path) as con:
        sql = "SELECT version, job_dir, created FROM registry WHERE name = ? AND promoted = 1"
        rows = con.execute(sql + (" AND version = ?" if version is not None else ""),
                           (name, int(version)) if version is not None else (name,)).fetchall()
        if not rows:
            known = [v for (v,) in con.execute("SELECT version FROM registry WHERE name = ? AND promoted = 1",
                                              (name,))]
            what = f"{name} v{version}" if version is not None else repr(name)
            hint = f"promoted: v{known[0]}" if known else "no version of it is promoted"
            if not con.execute("SELECT 1 FROM registry WHERE name = ?", (name,)).fetchone():
                hint = "no model of that name; see `musubi registry list`"
            raise ConfigError(f"{path}: {what} is not promoted ({hint})")
        for v, _, _ in rows:
            con.execute("UPDATE registry SET promoted = 0 WHERE name = ? AND version = ?", (name, v))
    for v, job_dir, created in rows:
        if Path(job_dir).is_dir():
            _write_marker(Path(job_dir), name, v, created, promoted=False)
    return [v for v, _, _ in rows]


def write_manifest(path: Path, db: Path | None = None, run_dir: Path | None = None) -> dict[str, Any]:
    """Write the deployment manifest JSON to `path` (file paths also given relative to it); return it."""
    path = Path(path)
    data = manifest(db=db, run_dir=run_dir, base=path.resolve().parent)
    write_json(path, data)
    return data


def record_leaderboard(run_dir: Path, rows: list[dict[str, Any]], db: Path | None = None) -> None:
    """Append a leaderboard to the history table (the store keeps every ranking ever made)."""
    path = resolve_db(db, run_dir)
    now = time.time()
    with _connect(path) as con:
        con.executemany(
            "INSERT INTO leaderboard_history VALUES (?, ?, ?, ?, ?, ?)",
            [(str(Path(run_dir).resolve()), r["job"], r.get("rank"), r.get("score"), json.dumps(r, default=str), now)
             for r in rows],
        )


def leaderboard_history(job: str | None = None, db: Path | None = None,
                        run_dir: Path | None = None) -> list[dict[str, Any]]:
    """Past leaderboard rows (all, or one job's), oldest first."""
    path = resolve_db(db, run_dir)
    if not path.exists():
        return []
    with _connect(path) as con:
        sql = "SELECT run_dir, job, rank, score, created FROM leaderboard_history"
        cur = con.execute(sql + (" WHERE job = ?" if job else "") + " ORDER BY created, rowid",
                          (job,) if job else ())
        return [dict(zip(("run_dir", "job", "rank", "score", "created"), v, strict=True)) for v in cur.fetchall()]


def rebuild_registry(runs_root: Path, db: Path | None = None) -> int:
    """Restore registry rows from every RUN/JOB/export/registered.json under `runs_root`; returns the count.

    Each job keeps the marker of its newest registration, so that is the version restored.
    """
    path = Path(db) if db is not None else Path(runs_root) / "musubi.db"
    restored = 0
    for marker in sorted(Path(runs_root).glob(f"*/*/{MARKER.as_posix()}")):
        job_dir = marker.parent.parent
        try:
            info = read_json(marker)
            name, version = str(info["name"]), int(info["version"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged marker: that version stays out of the rebuilt table
        with _connect(path) as con:
            con.execute("DELETE FROM registry WHERE name = ? AND version = ?", (name, version))
        entry = _insert_from_marker(job_dir, name, version, float(info.get("created", time.time())),
                                    bool(info.get("promoted")), path)
        restored += entry
    return restored


def _insert_from_marker(job_dir: Path, name: str, version: int, created: float, promoted: bool, db: Path) -> int:
    """Re-register a job under its recorded name/version/promotion; 0 if its files are gone."""
    try:
        entry = register(job_dir, name=name, db=db)
    except ConfigError:
        return 0
    with _connect(db) as con:
        con.execute("UPDATE registry SET version = ?, created = ?, promoted = ? WHERE name = ? AND version = ?",
                    (version, created, int(promoted), name, entry["version"]))
    _write_marker(job_dir, name, version, created, promoted)
    return 1


def warn_skipped(data: dict[str, Any], console: Console | None = None) -> None:
    """One line per promoted model a manifest left out (its files are gone or changed)."""
    console = console or Console(stderr=True, soft_wrap=True)
    for line in data.get("skipped") or []:
        console.print(Text("warning: ", style="yellow") + Text(line), highlight=False, soft_wrap=True)
