"""Field-by-field documentation of the job and fleet YAML, generated from the pydantic models."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from musubi.config.fleet import CommandJob, FleetSpec, Placement
from musubi.config.job import JobSpec


def _type_name(ann: Any) -> str:
    if get_origin(ann) is Literal:
        return " | ".join(str(a) for a in get_args(ann))
    if get_origin(ann) is Annotated:  # a bounded str (PathStr): its base type
        return _type_name(get_args(ann)[0])
    if get_origin(ann) in (Union, UnionType):
        return " | ".join(_type_name(a) for a in get_args(ann))
    if ann is type(None):
        return "None"
    text = getattr(ann, "__name__", None) or str(ann)
    return text.replace("typing.", "").replace("musubi.config.job.", "")


def _nested(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def schema_rows(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every field, depth first."""
    rows: list[tuple[str, str, str, str]] = []
    for name, f in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _nested(f.annotation)
        if f.default is PydanticUndefined and f.default_factory is None:
            default = "required"
        elif f.default_factory is not None:
            default = "(section)" if sub else "{}"
        else:
            default = repr(f.default)
        typ = sub.__name__ if sub else _type_name(f.annotation)
        rows.append((key, typ, default, f.description or ""))
        if sub is not None:
            rows += schema_rows(sub, prefix=f"{key}.")
    return rows


def table(rows: list[tuple[str, str, str, str]]) -> str:
    """Rows of `schema_rows` as a markdown table."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, typ, default, desc in rows:
        cells = [f"`{key}`", typ, default, desc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def schema_markdown() -> str:
    """The job schema as a markdown table (what `musubi schema` prints)."""
    return table(schema_rows())


def reference_markdown() -> str:
    """The whole configuration reference page (docs/reference/config.md): job, fleet, fleet jobs."""
    placement = set(Placement.model_fields)
    command_rows = [r for r in schema_rows(CommandJob) if r[0] not in placement]
    return "\n".join([
        "# Configuration reference",
        "",
        "<!-- Generated from the pydantic models by `python -m musubi.config.readme_sync`; "
        "a test fails when it is stale. Edit the field descriptions in musubi/config, not this page. -->",
        "",
        "Every key of a job file (`musubi train JOB.yaml`) and a fleet file (`musubi run FLEET.yaml`), "
        "with its type, default and meaning. `musubi schema` prints the job table. Unknown keys are refused "
        "with a \"did you mean\"; see the [training guide](../guides/train.md) and the "
        "[fleet guide](../guides/fleets.md) for how the pieces fit.",
        "",
        "## Job file reference",
        "",
        table(schema_rows()),
        "",
        "## Fleet file reference",
        "",
        "`defaults:` is merged under every task job; each entry of `jobs:` is a task job or an external command "
        "(below).",
        "",
        table(schema_rows(FleetSpec)),
        "",
        "## Fleet job placement",
        "",
        "Keys every fleet job may carry beside its job: a task job is a whole job (the job file reference) "
        "plus these.",
        "",
        table(schema_rows(Placement)),
        "",
        "## External command jobs",
        "",
        "A fleet job with `command:` runs another program; it takes the placement keys above plus these.",
        "",
        table(command_rows),
        "",
    ])
