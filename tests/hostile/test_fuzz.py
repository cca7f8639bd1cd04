"""Property-based fuzzing (hypothesis) of the config loader and the COCO reader.

Thousands of generated documents, structured (valid jobs and COCO files with one
part replaced by anything) and raw (arbitrary text and bytes): every one is
either accepted or refused with Musubi's own one-line ConfigError. Any other
exception is a bug. About 2,600 documents in ~25 s on 2 cores (two bugs found this way:
a YAML reader error and a job name holding a newline both broke the one-line rule).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musubi.config.load import load_fleet, load_job
from musubi.contract.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

BASE = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    """Hypothesis settings: `examples` documents, no deadline, no example database written to the repo."""
    return settings(BASE, max_examples=examples)


#: Text without lone surrogates (they cannot be written as UTF-8 at all).
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)

GOOD_JOB: dict[str, Any] = {
    "name": "fuzz",
    "task": "classification",
    "model": "resnet18",
    "data": {"synthetic": {"train_size": 16, "val_size": 4, "image_size": 32}, "workers": 0},
    "train": {"epochs": 1, "batch": 4, "lr": 0.1},
    "checkpoint": {"keep_last": 2},
}
FIELDS = ["name", "task", "model", "model_args", "weights", "data", "train", "checkpoint", "synthetic", "train_size",
          "image_size", "batch", "lr", "epochs", "global_batch", "precision", "strategy", "path", "annotations",
          "seed", "keep_last", "every_steps", "max_image_pixels", "jobs", "defaults", "command", "env", "gpus"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), texts,
    st.sampled_from(["auto", "..", "../x", "/etc/passwd", "a\x00b", "[red]x", "ddp", "fsdp", "bf16", "1e-3",
                     "classification", "os:system", "!!python/object:os.system", "~", "*a", "&a"]),
)
keys = st.one_of(st.sampled_from(FIELDS), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(keys, inner, max_size=5)), max_leaves=12)


def dump(doc: Any) -> str:
    """YAML text of a document (libyaml's safe dumper when present: generation, not the loader, is the cost)."""
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), allow_unicode=True)


def check_refusal(fn, *args) -> Any:  # noqa: ANN001
    """Call the loader: a result or a ConfigError of one line (a fleet: one line per refused job) are both fine;
    anything else fails the test."""
    try:
        return fn(*args)
    except ConfigError as e:
        lines = str(e).split("\n")
        assert len(lines) == 1 or all(ln.startswith(f"{args[0]}: jobs[") for ln in lines), str(e)
        assert all(0 < len(ln) < 2000 for ln in lines), str(e)
        return None


def _set_path(doc: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    node = doc
    for k in path[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[path[-1]] = value
    return doc


LEAF_PATHS = [["name"], ["task"], ["model"], ["model_args"], ["weights"], ["data"], ["data", "synthetic"],
              ["data", "synthetic", "train_size"], ["data", "synthetic", "image_size"], ["data", "train"],
              ["data", "train", "path"], ["data", "workers"], ["data", "max_image_pixels"], ["train"],
              ["train", "batch"], ["train", "lr"], ["train", "epochs"], ["train", "global_batch"],
              ["train", "precision"], ["train", "seed"], ["checkpoint", "keep_last"], ["checkpoint", "every_steps"],
              ["extra"]]


@fuzz(600)
@given(path=st.sampled_from(LEAF_PATHS), value=values)
def test_job_with_one_field_replaced(tmp_path: Path, path: list[str], value: Any) -> None:
    doc = _set_path(copy.deepcopy(GOOD_JOB), path, value)
    f = tmp_path / "job.yaml"
    f.write_text(dump(doc), encoding="utf-8")
    check_refusal(load_job, f)


@fuzz(300)
@given(doc=st.dictionaries(keys, values, max_size=8))
def test_job_of_anything(tmp_path: Path, doc: dict[str, Any]) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(dump(doc), encoding="utf-8")
    check_refusal(load_job, f)


YAML_BITS = st.sampled_from(["name: ", "task: ", "train:", "\n", "  ", "- ", "[", "]", "{", "}", ": ", ", ", "&a ",
                             "*a ", "!!python/object:os.system ", "!!binary ", "? ", "'", '"', "#", "|", ">", "\t",
                             "x", "1", ".inf", "~", "\\0", "%YAML 1.1\n", "---\n", "...\n", "<<: *a\n"])


@fuzz(600)
@given(text=st.one_of(st.lists(YAML_BITS, max_size=40).map("".join), st.text(max_size=200)))
def test_raw_job_text(tmp_path: Path, text: str) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    check_refusal(load_job, f)


@fuzz(300)
@given(jobs=st.lists(st.one_of(values, st.fixed_dictionaries({"name": scalars, "command": values}),
                               st.fixed_dictionaries({"name": scalars, "task": scalars, "env": values})), max_size=4),
       defaults=values)
def test_fleet_of_anything(tmp_path: Path, jobs: list[Any], defaults: Any) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(dump({"name": "f", "defaults": defaults, "jobs": jobs}),
                 encoding="utf-8")
    check_refusal(load_fleet, f)


# -- the COCO reader ---------------------------------------------------------------
GOOD_COCO: dict[str, Any] = {
    "images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 48},
               {"id": 2, "file_name": "sub/b.png", "width": 32, "height": 32}],
    "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1.0, 2.0, 10.0, 10.0], "iscrowd": 0},
                    {"id": 2, "image_id": 2, "category_id": 5, "bbox": [0, 0, 40, 40]}],
    "categories": [{"id": 3, "name": "person"}, {"id": 5, "name": "boat"}],
}
COCO_PATHS = [["images"], ["annotations"], ["categories"], ["images", 0], ["images", 0, "id"],
              ["images", 0, "file_name"], ["images", 0, "width"], ["annotations", 0], ["annotations", 0, "bbox"],
              ["annotations", 0, "image_id"], ["annotations", 0, "category_id"], ["annotations", 1, "iscrowd"],
              ["annotations", 0, "bbox", 2], ["categories", 0, "id"], ["categories", 1], ["info"]]


def _coco_with(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD_COCO)
    node: Any = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _read_coco(img_dir: Path, ann: Path) -> None:
    from musubi.data.coco import CocoDetection

    ds = CocoDetection(img_dir, ann, check_files=False)
    assert len(ds) >= 0 and ds.num_classes >= 0
    for b in ds._boxes.flatten().tolist():  # what reaches the model is finite
        assert math.isfinite(b)


@fuzz(500)
@given(path=st.sampled_from(COCO_PATHS), value=values)
def test_coco_with_one_part_replaced(tmp_path: Path, path: list[Any], value: Any) -> None:
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(_coco_with(path, value)), encoding="utf-8")
    check_refusal(_read_coco, tmp_path, ann)


@fuzz(300)
@given(raw=st.one_of(st.binary(max_size=300), texts.map(str.encode),
                     values.map(lambda v: json.dumps(v).encode())))
def test_raw_annotation_bytes(tmp_path: Path, raw: bytes) -> None:
    ann = tmp_path / "ann.json"
    ann.write_bytes(raw)
    check_refusal(_read_coco, tmp_path, ann)
