"""YAML loading, `--set key=value` overrides, and errors that name the field and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError, one_line

if TYPE_CHECKING:
    from musubi.config.fleet import FleetSpec

#: PyYAML's safe loader, in C when libyaml is present (10x faster, same tags: no Python objects).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: A job file larger than this is refused before parsing (hostile or mistaken input).
MAX_CONFIG_BYTES = 1 << 20
#: Bounds of a parsed document: nesting depth, and values counted with YAML aliases expanded
#: (a "billion laughs" file is a few hundred bytes that expand to billions of values).
MAX_DEPTH = 32
MAX_NODES = 200_000
#: Characters of a bad value quoted in an error line.
_QUOTE_CHARS = 80


def check_document(data: Any, source: str) -> None:
    """Refuse a parsed document nested deeper than MAX_DEPTH or holding more than MAX_NODES values."""
    budget = MAX_NODES
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ConfigError(f"{source}: more than {MAX_NODES} values (YAML aliases expanded); "
                              "a job or fleet file holds a few hundred")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels; flatten the file")
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise ConfigError(f"{source}: a key is a {type(k).__name__}; keys must be plain names")
                stack.append((v, depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)


def _quote(value: Any) -> str:
    """A bad value for an error line: repr, one line, at most _QUOTE_CHARS characters."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = _QUOTE_CHARS
    r.maxlevel, r.maxlist, r.maxdict = 2, 4, 4
    text = " ".join(r.repr(value).split())
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping safely (no Python object tags), bounded in size."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file; give the path of a job YAML (see examples/)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; a job file is a few KiB")
    try:
        # The safe loader (libyaml's when available): plain data only, no Python object tags.
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = one_line(getattr(e, "problem", None) or e, 160)  # ReaderError spans lines
        raise ConfigError(f"{p}:{where} not valid YAML ({problem}); fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the job file as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to parse; flatten the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys (name:, task:, model:, ...)")
    check_document(data, str(p))
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
        msg = f"{field}: {' or '.join(texts)} (got {_quote(e.get('input'))})"
    more = len(errors) - len(branches)
    if more:
        msg += f" (+{more} more problem{'s' if more > 1 else ''})"
    return f"{source}: {msg}"


def blame(err: ValidationError, model: type[BaseModel], overrides: list[str], path: str) -> str:
    """Who wrote the bad field: the last `--set` whose key is the error's field (or holds it), else the file."""
    loc = _field_path(model, tuple(err.errors()[0]["loc"]))
    for text in reversed(overrides):
        parts = tuple(parse_override(text)[0])
        n = min(len(parts), len(loc))
        if n and parts[:n] == tuple(str(x) for x in loc[:n]):
            return f"--set {text}"
    return path


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Read, override and validate a job file; raise ConfigError with one line on any problem."""
    overrides = list(overrides or [])
    data = apply_overrides(read_yaml(path), overrides)
    check_document(data, str(path))
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, JobSpec, blame(err, JobSpec, overrides, str(path)))) from None


def job_from_dict(data: dict[str, Any], source: str = "job") -> JobSpec:
    """Validate an already-parsed job mapping."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, JobSpec, source)) from None


def _job_label(name: Any) -> str:
    """A job's name as shown in its errors: printable names as written, anything else quoted (one line)."""
    if name is None:
        return "no name"
    return name[:64] if isinstance(name, str) and name.isprintable() else _quote(name)


def _fleet_job(path: str | Path, i: int, raw: Any, defaults: dict[str, Any]) -> Any:
    """jobs[i] of a fleet file validated (a TaskJob with the defaults merged under it, or a CommandJob)."""
    from musubi.config.fleet import PLACEMENT_KEYS, CommandJob, TaskJob, deep_merge

    label = f"{path}: jobs[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: must be a mapping (name:, task:/command:, ...)")
    label += f" ({_job_label(raw.get('name'))})"
    if "command" in raw:
        if isinstance(raw["command"], str):
            raise ConfigError(f"{label}: command must be an argv list, never a shell string: "
                              f"[{', '.join(repr(p) for p in raw['command'].split())}]")
        try:
            return CommandJob.model_validate(raw)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, CommandJob, label)) from None
    placement = {k: v for k, v in raw.items() if k in PLACEMENT_KEYS}
    body = deep_merge(defaults, {k: v for k, v in raw.items() if k not in PLACEMENT_KEYS})
    try:
        spec = JobSpec.model_validate(body)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, JobSpec, label)) from None
    try:
        return TaskJob(spec=spec, **placement)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, TaskJob, label)) from None


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file; each job's errors name the job and the field (all jobs' at once)."""
    from musubi.config.fleet import MAX_JOBS, FleetSpec

    data = read_yaml(path)
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ConfigError(f"{path}: jobs: must be a non-empty list of jobs (task jobs or command jobs)")
    if len(raw_jobs) > MAX_JOBS:
        raise ConfigError(f"{path}: jobs: {len(raw_jobs)} jobs, more than {MAX_JOBS}; split the fleet")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: defaults: must be a mapping merged under every task job")
    jobs: list[Any] = []
    problems: list[str] = []  # every job's first problem: a fleet with three mistakes is fixed in one pass
    for i, raw in enumerate(raw_jobs):
        try:
            jobs.append(_fleet_job(path, i, raw, defaults))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    first_of: dict[str, int] = {}
    for i, job in enumerate(jobs):  # one line naming both jobs (pydantic's message would dump the whole file)
        if job.name in first_of:
            raise ConfigError(f"{path}: jobs[{i}] ({job.name}): name: duplicate of jobs[{first_of[job.name]}]; "
                              "job names must be unique")
        first_of[job.name] = i
    try:
        return FleetSpec.model_validate({**data, "jobs": jobs})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, FleetSpec, str(path))) from None
