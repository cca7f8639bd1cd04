"""What `musubi train` decides before it imports torch: CPU ranks against cores, a resume against the
job it continues, a run that is already finished, and the plan `--dry-run` prints.

torch takes seconds to import on a small machine (2 to 10 s on 2 shared cores), so everything here
answers from the job file and the run directory alone: a refused or finished run is reported in well
under a second, and nothing is written before a refusal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musubi.config.batch_plan import scale_lr
from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.recovery.fault_rate import cadence_plan
from musubi.tasks.data_line import describe_data

#: Changes listed in an error line before "(+N more)".
_SHOWN_CHANGES = 3


def check_cpu_ranks(nproc: int, cores: int, oversubscribe: bool) -> None:
    """Refuse more CPU ranks than cores: each rank would get a slice of a core and the run would crawl."""
    if nproc > cores and not oversubscribe:
        raise ConfigError(f"--nproc {nproc} CPU ranks but this machine gives {cores} core(s): ranks would share "
                          f"cores and crawl; use --nproc {cores} or fewer, or add --oversubscribe to run them anyway")


def parse_allowed(values: list[str]) -> list[str]:
    """`--allow-changes train.lr,data` (repeatable) -> ['train.lr', 'data'], each a field of the job schema."""
    keys = [k.strip() for v in values for k in v.split(",") if k.strip()]
    for key in keys:
        model: Any = JobSpec
        for part in key.split("."):
            fields = getattr(model, "model_fields", None)
            if fields is None:
                break  # inside a mapping field (model_args.hidden): any key
            if part not in fields:
                raise ConfigError(f"--allow-changes {key}: {part!r} is not a job field; give dotted keys such as "
                                  "train.lr or data (see `musubi schema`)")
            ann = fields[part].annotation
            subs = [a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and hasattr(a, "model_fields")]
            model = subs[0] if subs else None
            if model is None:
                break
    return keys


def config_changes(before: Any, after: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, before, after) for every leaf that differs between two resolved job configs."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in sorted(set(before) | set(after), key=str):
            out += config_changes(before.get(k), after.get(k), f"{prefix}{k}.")
        return out
    return [] if before == after else [(prefix.rstrip("."), before, after)]


def _covered(key: str, allowed: list[str] | None) -> bool:
    """Whether `--allow-changes` lists this key or a section above it (`train` covers train.lr); None: all."""
    return allowed is None or any(key == a or key.startswith(a + ".") for a in allowed)


#: Compares equal to nothing: a key without a schema default is always a change.
_NO_DEFAULT = object()


def _absent(record: dict[str, Any], key: str) -> bool:
    """Whether the dotted `key` (or a section above it) is missing from a recorded job config."""
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return True
        node = node[part]
    return False


def _default_of(key: str) -> Any:
    """The JSON value a job gets for the dotted `key` when its file leaves it out (a sentinel when the key is
    not a schema field with a default, so nothing compares equal to it)."""
    model: Any = JobSpec
    info = None
    for part in key.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return _NO_DEFAULT
        info = fields[part]
        ann = info.annotation
        subs = [a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and hasattr(a, "model_fields")]
        model = subs[0] if subs else None
    if info is None or info.is_required():
        return _NO_DEFAULT
    value = info.get_default(call_default_factory=True)
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def check_resume(record: dict[str, Any], config: dict[str, Any], allowed: list[str] | None,
                 job_json: Path) -> list[dict[str, Any]]:
    """The changes a resume may make to the recorded job; ConfigError naming those --allow-changes lacks."""
    old = record.get("config")
    if not isinstance(old, dict):
        return []
    # A field added to the schema after the run was recorded is absent from the record; at its default it
    # trains as the run did before the field existed, so an upgrade alone never blocks a resume.
    changes = [c for c in config_changes(old, config) if not (_absent(old, c[0]) and c[2] == _default_of(c[0]))]
    refused = [c for c in changes if not _covered(c[0], allowed)]
    if refused:
        shown = "; ".join(f"{k} {b!r} -> {a!r}" for k, b, a in refused[:_SHOWN_CHANGES])
        more = f" (+{len(refused) - _SHOWN_CHANGES} more)" if len(refused) > _SHOWN_CHANGES else ""
        keys = ",".join(k for k, _, _ in refused)
        raise ConfigError(f"--resume: the job differs from {job_json}: {shown}{more}; resume with the same job "
                          f"file and --set, or pass --allow-changes {keys} to train on with the change")
    return [{"key": k, "before": b, "after": a} for k, b, a in changes]


def finished(record: dict[str, Any]) -> bool:
    """Whether a job's record says it trained to its last step (`musubi train` wrote status done)."""
    return record.get("status") == "done"


def plan_lines(spec: JobSpec, nproc: int, kind: str, run_dir: Path, resume: bool) -> list[str]:
    """What `musubi train --dry-run` prints: ranks, batches, LR and why, data, output; nothing is started."""
    t = spec.train
    ranks = f"{nproc} {'GPU' if kind == 'cuda' else 'CPU (gloo)'} rank{'s' if nproc > 1 else ''}"
    model = f"model {spec.model}" if spec.model else "its own model"
    lines = [f"job {spec.name}: task {spec.task}, {model}", f"ranks: {ranks}"]
    if t.batch == "auto":
        lines.append("batch: auto: probed on every rank at start (the minimum that fits; LR follows it)")
    else:
        per_rank = t.global_batch // (nproc * t.accumulation) if t.global_batch is not None else t.batch
        g = per_rank * nproc * t.accumulation
        lines.append(f"batch: {per_rank} per rank x {nproc} rank(s) x {t.accumulation} accumulation = {g} global")
        lr = scale_lr(t.lr, g, t.base_batch, t.lr_rule)
        why = ("unchanged (lr_rule none)" if t.lr_rule == "none" else
               f"{t.lr_rule} rule: {t.lr:g} tuned at base_batch {t.base_batch}, x ({g}/{t.base_batch})"
               + ("^0.5" if t.lr_rule == "sqrt" else ""))
        lines.append(f"lr: {lr:.4g} ({why}); {t.optimizer}, {t.schedule}, {t.warmup_steps} warmup step(s)")
    lines.append(f"data: {describe_data(spec)}")  # a user task's own data: its sizes, or who provides it
    steps = f"max {t.max_steps} steps" if t.max_steps else "no step limit"
    lines.append(f"training: {t.epochs} epoch(s), {steps}; precision {t.precision}, strategy {t.strategy}")
    lines.append(f"checkpoints: {cadence_plan(spec.checkpoint, nproc, run_dir / spec.name)['rule']}")
    lines.append(f"output: {run_dir / spec.name}" + (" (resumed)" if resume else " (new)"))
    return lines
