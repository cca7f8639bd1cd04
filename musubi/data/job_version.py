"""Dataset version of a job: a content hash of what it trained on (for the registry)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from musubi.contract.errors import ConfigError
from musubi.data.version import hash_dataset

#: Synthetic-spec keys that change where samples are generated, not which samples.
_NOT_CONTENT = {"on_device"}


def split_versions(data: dict[str, Any], store: Path | None = None) -> dict[str, str] | None:
    """Content version of every on-disk split, e.g. {"train": "data-…", "val": "data-…"}; None if gone.

    Each is exactly what `musubi data hash` prints for that split (IMAGES_DIR + ANN.json hashes as
    the annotation file and the images it lists; a folder or a file as itself): one definition.
    """
    out: dict[str, str] = {}
    for split in ("train", "val"):
        spec = data.get(split)
        if not isinstance(spec, dict):
            continue
        path = Path(str(spec.get("path")))
        try:
            if spec.get("annotations"):
                out[split] = hash_dataset(Path(spec["annotations"]), store, image_dir=path).version
            elif path.exists():
                out[split] = hash_dataset(path, store).version
            else:
                return None
        except ConfigError:
            return None
    return out or None


def options_digest(data: dict[str, Any]) -> str:
    """Six hex digits of the options that change the samples drawn from the same files."""
    options = {k: data.get(k) for k in ("image_size", "seq_len", "slice")}
    if data.get("classes"):  # only when set: versions of jobs without a class map stay what they were
        options["classes"] = data["classes"]
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:6]


def dataset_detail(config: dict[str, Any], store: Path | None = None) -> dict[str, Any] | None:
    """The parts of a job's version: {"train": "data-…", "val": "data-…", "options": "abc123"} (on-disk data)."""
    data = config.get("data") or {}
    if isinstance(data.get("synthetic"), dict):
        return None
    splits = split_versions(data, store)
    return None if splits is None else {**splits, "options": options_digest(data)}


def dataset_version(config: dict[str, Any], store: Path | None = None) -> str | None:
    """`synthetic-<sha256>` of the synthetic spec, `data-<train>[+data-<val>]-<options>` of the files, or None.

    On-disk data: each split's content version as `musubi data hash` prints it (so the version a
    watcher acted on is found verbatim in the job's), joined by '+', then the options that change
    the samples (image_size, seq_len, slice, the class map); None when the files are gone.
    """
    data = config.get("data") or {}
    synthetic = data.get("synthetic")
    if isinstance(synthetic, dict):
        fields = {k: v for k, v in synthetic.items() if k not in _NOT_CONTENT}
        fields["task"] = config.get("task")  # the same seed draws other samples for another task
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "synthetic-" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return _joined(dataset_detail(config, store))


def _joined(detail: dict[str, Any] | None) -> str | None:
    if detail is None:
        return None
    return "+".join(v for k, v in detail.items() if k != "options") + "-" + detail["options"]


def dataset_env(configs: list[dict[str, Any]], store: Path | None = None) -> dict[str, Any]:
    """env.json's data keys: `datasets` (job -> version) and `dataset_splits` (job -> per-split versions)."""
    versions: dict[str, str | None] = {}
    splits: dict[str, Any] = {}
    for c in configs:
        if not isinstance(c, dict):
            continue
        name = str(c.get("name"))
        data = c.get("data") or {}
        if isinstance(data.get("synthetic"), dict):
            versions[name] = dataset_version(c, store)
            continue
        detail = dataset_detail(c, store)
        versions[name] = _joined(detail)
        splits[name] = detail
    return {"datasets": versions, "dataset_splits": splits}
