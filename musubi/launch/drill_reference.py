"""The drill's reference: an uninterrupted run's final weights, recorded so that later drills can share it.

A drill compares every faulted run with a clean run of the same job. That run is the same whatever the
faults, so a drill writes `reference/drill-reference.json` beside it (what the run was: the resolved job,
the world, torch and musubi; what it ended with: its steps, checkpoint steps and a SHA-256 of its final
tensors) and `musubi drill --reference DIR` reuses it instead of training it again. A reference is
refused in one line when it is not the same run (another job config, world size, device, torch, or
musubi's version or code) or when it is damaged (its final checkpoint missing, not intact, or not the tensors recorded):
a drill never compares against a wrong reference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musubi.config.job import JobSpec
from musubi.config.version import VERSION, source_digest
from musubi.contract.errors import ConfigError
from musubi.contract.run_files import RUN_FILES

#: The record a drill writes in its reference run's folder (DRILL/reference/).
REFERENCE_FILE = "drill-reference.json"
#: Job fields that change how a run is saved or watched, never its arithmetic: a reference made with other
#: values of them holds the same weights (tests/recovery: the DCP-process drill against a thread-mode one).
WEIGHT_FREE = (("checkpoint", "async_mode"), ("watchdog",))


@dataclass
class Reference:
    """A finished reference run: where it is, what it ended with, how long it took."""

    job_dir: Path
    total_steps: int
    ckpt_steps: list[int]
    wall_s: float
    tensors: dict[str, Any]


def flatten_tensors(node: Any) -> dict[str, Any]:
    """Every tensor of a nested state dict, keyed by its dotted path (`optim.state.x.exp_avg`)."""
    import torch

    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(f"{prefix}.{i}", v)

    walk("", node)
    return flat


def final_tensors(job_dir: Path) -> dict[str, Any]:
    """Model and optimizer tensors of the newest committed checkpoint, flattened by key."""
    from musubi.checkpoint.checkpoint import latest_checkpoint, read_full_state

    ck = latest_checkpoint(job_dir / RUN_FILES.checkpoints, warn=False)
    if ck is None:
        return {}
    full = read_full_state(ck.path)
    return flatten_tensors({"model": full["model"], "optim": full["optim"]})


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when both hold the same keys and bitwise equal tensors."""
    import torch

    return bool(a) and set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def tensors_digest(flat: dict[str, Any]) -> str:
    """SHA-256 of flattened tensors: every key, dtype, shape and byte, in key order."""
    import torch

    h = hashlib.sha256()
    for key in sorted(flat):
        t = flat[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def identity(spec: JobSpec, nproc: int, device: str) -> dict[str, Any]:
    """What makes two reference runs the same run: the resolved job (less WEIGHT_FREE), world, torch, musubi's
    version and the digest of its code (a reference trained by other code of the same version is another run)."""
    import torch

    config = spec.model_dump(mode="json")
    for path in WEIGHT_FREE:
        node = config
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    return {"config": config, "nproc": nproc, "device": device, "torch": torch.__version__, "musubi": VERSION,
            "musubi_source": source_digest()}


def write_reference(ref_run: Path, ident: dict[str, Any], ref: Reference) -> None:
    """Record a finished reference run in REF_RUN/drill-reference.json (written last: a torn run has none)."""
    record = {"identity": ident, "job": ref.job_dir.name, "total_steps": ref.total_steps,
              "ckpt_steps": ref.ckpt_steps, "wall_s": round(ref.wall_s, 3), "tensors": len(ref.tensors),
              "sha256": tensors_digest(ref.tensors)}
    tmp = ref_run / f".{REFERENCE_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    tmp.replace(ref_run / REFERENCE_FILE)


def first_difference(mine: Any, theirs: Any) -> tuple[list[str], Any, Any] | None:
    """(keys, mine, theirs) of the first value that differs between two JSON trees, else None."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs)):
            found = first_difference(mine.get(key), theirs.get(key))
            if found:
                return [str(key), *found[0]], found[1], found[2]
        return None
    return None if mine == theirs else ([], mine, theirs)


def load_reference(given: Path, ident: dict[str, Any]) -> Reference:
    """The reference recorded in GIVEN (a drill's folder or its reference/), checked against this drill; else
    ConfigError naming why it cannot serve."""
    ref_run = given / "reference" if (given / "reference" / REFERENCE_FILE).is_file() else given
    fix = "drop --reference to train a fresh one"
    try:
        record = json.loads((ref_run / REFERENCE_FILE).read_text(encoding="utf-8"))
        theirs, job, total = record["identity"], str(record["job"]), int(record["total_steps"])
        ckpt_steps, wall_s = [int(s) for s in record["ckpt_steps"]], float(record["wall_s"])
    except FileNotFoundError:
        raise ConfigError(f"--reference {given}: no {REFERENCE_FILE} there (not a finished drill reference); "
                          f"name a drill's folder or its reference/ folder, or {fix}") from None
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise ConfigError(f"--reference {given}: {REFERENCE_FILE} is unreadable ({type(e).__name__}: {e}); "
                          f"{fix}") from None
    diff = first_difference(ident, theirs)
    if diff is not None:
        keys, mine_v, their_v = diff
        raise ConfigError(f"--reference {given}: another run ({'.'.join(keys)}: {their_v!r} there, {mine_v!r} here); "
                          f"a drill compares only against a reference of the same job, world and stack: {fix}")
    return Reference(ref_run / job, total, ckpt_steps, wall_s, _checked_tensors(given, ref_run / job, record))


def _checked_tensors(given: Path, job_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The reference's final tensors, once its last checkpoint is intact and holds exactly what was recorded."""
    from musubi.checkpoint.checkpoint import read_full_state
    from musubi.checkpoint.committed import latest_checkpoint

    fix = "drop --reference to train a fresh one"
    ck = latest_checkpoint(job_dir / RUN_FILES.checkpoints, checksums=True, warn=False)
    if ck is None or ck.step != int(record["total_steps"]):
        found = "none" if ck is None else f"step {ck.step}"
        raise ConfigError(f"--reference {given}: damaged: its final checkpoint (step {record['total_steps']}) is "
                          f"missing or not intact (newest intact: {found}); {fix}")
    full = read_full_state(ck.path, verified=True)  # its SHA-256 were just compared with the marker
    flat = flatten_tensors({"model": full["model"], "optim": full["optim"]})
    if len(flat) != record.get("tensors") or tensors_digest(flat) != record.get("sha256"):
        raise ConfigError(f"--reference {given}: damaged: its final tensors are not the ones recorded "
                          f"(SHA-256 differs); {fix}")
    return flat
