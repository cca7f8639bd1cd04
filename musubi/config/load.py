"""YAML loading, `--set key=value` overrides, and errors that name the field and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from musubi.config.errors import ConfigError
from musubi.config.job import JobSpec

if TYPE_CHECKING:
    from musubi.config.fleet import FleetSpec

#: A job file larger than this is refused before parsing (hostile or mistaken input).
MAX_CONFIG_BYTES = 1 << 20


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping safely (no Python object tags), bounded in size."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file; give the path of a job YAML (see examples/)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; a job file is a few KiB")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}:{where} not valid YAML ({getattr(e, 'problem', e)}); fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the job file as UTF-8") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys (name:, task:, model:, ...)")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.batch=32` -> (['train', 'batch'], 32); the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set train.batch=32")
    key, _, raw = text.partition("=")
    parts = [k for k in key.strip().split(".") if k]
    if not parts:
        raise ConfigError(f"--set {text!r}: empty key; e.g. --set train.lr=0.1")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides to a nested mapping (in place) and return it."""
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for k in parts[:-1]:
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {text!r}: {k} is not a section; set a leaf key such as {k}=...")
            node = nxt
        node[parts[-1]] = value
    return data


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names a model accepts at a location (for 'did you mean')."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return []
        ann = cur.model_fields[part].annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        cur = args[0] if args else ann
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _field_path(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of an error location that names fields (drops pydantic's union-branch tags)."""
    kept: list[Any] = []
    cur: Any = model
    for part in loc:
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            kept.append(part)
            if part not in cur.model_fields:
                break  # an unknown key: keep it, it is the subject of the error
            ann = cur.model_fields[part].annotation
            subs = [a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)]
            cur = subs[0] if subs else ann
        else:
            if getattr(cur, "__origin__", None) is dict:
                kept.append(part)  # a key inside a mapping field (model_args)
            break  # the rest are union-branch tags
    return tuple(kept)


def format_validation_error(err: ValidationError, model: type[BaseModel], source: str) -> str:
    """Turn pydantic's report into one line: the field, what is wrong, the fix."""
    errors = err.errors()
    e = errors[0]
    loc = _field_path(model, tuple(e["loc"]))
    field = ".".join(str(x) for x in loc) or "(top level)"
    kind = e["type"]
    # A union (e.g. `int | "auto"`) reports one error per branch: merge them.
    branches = [x for x in errors if _field_path(model, tuple(x["loc"])) == loc]
    if kind == "extra_forbidden":
        known = _fields_at(model, loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean '{guess[0]}'?" if guess else f"known keys: {', '.join(known)}"
        msg = f"unknown key {field}; {hint}"
    elif kind == "missing":
        msg = f"{field} is required; add it to the job file"
    else:
        texts = []
        for x in branches:
            t = x["msg"].removeprefix("Value error, ")
            if t not in texts:
                texts.append(t)
        got = repr(e.get("input"))
        # A whole-file (model-level) problem would echo the whole file: the message names what is wrong.
        msg = f"{field}: {' or '.join(texts)}" + (f" (got {got})" if len(got) <= 200 else "")
    more = len(errors) - len(branches)
    if more:
        msg += f" (+{more} more problem{'s' if more > 1 else ''})"
    return f"{source}: {msg}"


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Read, override and validate a job file; raise ConfigError with one line on any problem."""
    data = apply_overrides(read_yaml(path), list(overrides or []))
    return job_from_dict(data, source=str(path))


def job_from_dict(data: dict[str, Any], source: str = "job") -> JobSpec:
    """Validate an already-parsed job mapping."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, JobSpec, source)) from None


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file; each job's errors name the job and the field."""
    from musubi.config.fleet import PLACEMENT_KEYS, CommandJob, FleetSpec, TaskJob, deep_merge

    data = read_yaml(path)
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ConfigError(f"{path}: jobs: must be a non-empty list of jobs (task jobs or command jobs)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: defaults: must be a mapping merged under every task job")
    jobs: list[Any] = []
    for i, raw in enumerate(raw_jobs):
        label = f"{path}: jobs[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{label}: must be a mapping (name:, task:/command:, ...)")
        label += f" ({raw.get('name', 'no name')})"
        if "command" in raw:
            if isinstance(raw["command"], str):
                raise ConfigError(f"{label}: command must be an argv list, never a shell string: "
                                  f"[{', '.join(repr(p) for p in raw['command'].split())}]")
            try:
                jobs.append(CommandJob.model_validate(raw))
            except ValidationError as err:
                raise ConfigError(format_validation_error(err, CommandJob, label)) from None
            continue
        placement = {k: v for k, v in raw.items() if k in PLACEMENT_KEYS}
        body = deep_merge(defaults, {k: v for k, v in raw.items() if k not in PLACEMENT_KEYS})
        try:
            spec = JobSpec.model_validate(body)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, JobSpec, label)) from None
        try:
            jobs.append(TaskJob(spec=spec, **placement))
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, TaskJob, label)) from None
    try:
        return FleetSpec.model_validate({**data, "jobs": jobs})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, FleetSpec, str(path))) from None
