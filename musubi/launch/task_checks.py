"""The launch's readings that need torch: the job's task built (its own checks), the metrics its validation
reports, its model on the meta device (signature, parameter count) and torch's side of the preflight's stack.

torch costs a launcher 3-4 s of CPU to import on 2 cores, and these readings were its only reason to. The launch's
warm spare imports torch for the ranks anyway, so the launcher has it fork a child that runs `read_task` (this
module's `main`, an entry the launcher names on the spare's command line) and writes the answer, a TaskReadings
(contract/records.py), into the spare's folder. The launcher judges the answer with the same lines as before
(launch/checks.py). Where there is no spare (train.warm_spare: false, a spare that refused or died, --dry-run) or
the child met an unexpected exception, the launcher calls `read_task` itself, which raises as it always did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_OK
from musubi.contract.records import TaskQuery, TaskReadings

#: The query and the answer, as files in the warm spare's 0700 folder (the child's argv names them).
QUERY_NAME = "task-query.json"
ANSWER_NAME = "task-readings.json"


def asks_anything(query: TaskQuery) -> bool:
    """Whether the query needs torch at all (a fleet's job without the preflight asks nothing)."""
    return query["validate"] or query["metrics"] or query["signature"] or query["params"] or query["stack"]


def read_task(query: TaskQuery) -> TaskReadings:
    """Build the job's task and read what `query` asks, in the launch's order; the task's own checks raise
    ConfigError (and anything else as it is)."""
    from musubi.config.load import job_from_dict
    from musubi.tasks.registry import build_task

    spec = job_from_dict(query["config"])
    out: TaskReadings = {}
    task = None
    if query["validate"] or query["metrics"]:
        task = build_task(spec)
        if query["validate"]:
            task.validate()
        if query["metrics"]:
            names = task.metric_names()
            out["metric_names"] = None if names is None else sorted(names)
            out["primary_metric"] = task.primary_metric
    if query["signature"] or query["params"]:
        model = meta_model(spec, task)
        if model is not None:
            from musubi.checkpoint.checkpoint import model_signature

            if query["signature"]:
                out["signature"] = model_signature(model)
            if query["params"]:
                out["params"] = sum(p.numel() for p in model.parameters())
    if query["stack"]:
        from musubi.preflight.read.machine import torch_side

        out["stack"] = torch_side()
    return out


def meta_model(spec: Any, task: Any = None) -> Any:
    """The job's model built on the meta device (no memory, no init), or None when it cannot be: the ranks then
    build it for real and make the same checks (signature at load, the disk check guesses)."""
    import torch

    from musubi.tasks.registry import build_task

    try:
        with torch.device("meta"):
            return (task if task is not None else build_task(spec)).build_model()
    except Exception:  # noqa: BLE001 - see the docstring: never a refusal of its own
        return None


def main(argv: list[str], started: float | None = None) -> int:  # noqa: ARG001 - an entry's signature
    """`QUERY_JSON ANSWER_JSON`: read the task as the query asks and write the answer (atomically) for the
    launcher; a refusal is an answer too, so this exits 0 once it wrote one."""
    if len(argv) != 2:
        print("usage: musubi.launch.task_checks QUERY_JSON ANSWER_JSON", flush=True)
        return EXIT_CONFIG
    query: TaskQuery = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        answer = read_task(query)
    except ConfigError as e:
        answer = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - the launcher reruns the checks itself and raises it there, as before
        answer = {"crashed": f"{type(e).__name__}: {e}"}
    out = Path(argv[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(answer), encoding="utf-8")
    os.replace(tmp, out)
    return EXIT_OK
