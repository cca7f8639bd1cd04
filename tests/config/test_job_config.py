"""Job YAML: every shipped example parses; every mistake gives one line naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.config.load import apply_overrides, job_from_dict, load_job
from musubi.contract.errors import ConfigError
from tests.conftest import REPO, TINY_JOB, _merge

# Job files; fleet files (fleet-*.yaml) are parsed by tests/fleet/test_fleet_config.py.
# A folder of its own holds an example with its code (examples/own_model/: job.yaml beside the task's module).
EXAMPLES = sorted(p for p in [*(REPO / "examples").glob("*.yaml"), *(REPO / "examples").glob("*/job.yaml")]
                  if not p.name.startswith("fleet-"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(REPO / "examples")) for p in EXAMPLES])
def test_every_shipped_example_parses(path: Path) -> None:
    spec = load_job(path)
    assert spec.name and spec.train.batch >= 1


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"detect-synthetic.yaml", "resnet50-bench.yaml", "fcos-bench.yaml", "lm-fsdp.yaml"} <= names


def _err(extra: dict) -> str:
    with pytest.raises(ConfigError) as ei:
        job_from_dict(_merge(TINY_JOB, extra), source="job.yaml")
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_unknown_key_suggests_the_right_one() -> None:
    msg = _err({"train": {"bacth": 4}})
    assert "train.bacth" in msg and "did you mean 'batch'" in msg


def test_ranges_and_types() -> None:
    assert "train.batch" in _err({"train": {"batch": 0}})
    assert "train.precision" in _err({"train": {"precision": "fp8"}})
    assert "train.strategy" in _err({"train": {"strategy": "zero3"}})


def test_names_cannot_escape_the_run_directory() -> None:
    for bad in ["../evil", "/abs", "a/b", "x" * 80, "", "a\x00b", ".."]:
        assert "name" in _err({"name": bad})


def test_data_source_is_required_of_built_in_tasks_and_exclusive() -> None:
    with pytest.raises(ConfigError, match="data: task lm needs a source"):
        job_from_dict({**TINY_JOB, "task": "lm", "model": "gpt", "data": {"workers": 1}})
    # a user task (TINY_JOB's) may read its own data: the loader's fields alone are no error
    assert job_from_dict({**TINY_JOB, "data": {"workers": 1}}).own_data
    assert "exclusive" in _err({"data": {"train": {"path": "x"}}})


def test_task_name_form() -> None:
    assert "task" in _err({"task": "rm -rf /"})


def test_overrides_are_typed() -> None:
    data = apply_overrides(_merge(TINY_JOB, {}), ["train.batch=32", "train.deterministic=true",
                                                  "data.synthetic.val_size=0"])
    spec = job_from_dict(data)
    assert spec.train.batch == 32 and spec.train.deterministic is True and spec.data.synthetic.val_size == 0
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["train.batch"])


def test_yaml_is_parsed_safely(tmp_path: Path) -> None:
    p = tmp_path / "evil.yaml"
    p.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_job(p)
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_job(p)
    with pytest.raises(ConfigError, match="no such file"):
        load_job(tmp_path / "missing.yaml")


def test_config_package_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, musubi.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_reference_page_is_current() -> None:
    """docs/reference/config.md is exactly what the generator writes today, and holds `musubi schema`'s table."""
    from musubi.config.readme_sync import REFERENCE
    from musubi.config.schema_doc import reference_markdown, schema_markdown

    page = (REPO / REFERENCE).read_text(encoding="utf-8")
    assert page == reference_markdown(), f"{REFERENCE} is stale: run python -m musubi.config.readme_sync"
    assert schema_markdown() in page


def test_reference_documents_every_job_and_fleet_field() -> None:
    """Each field of the job, the fleet, its placement and its command jobs has a row with a meaning."""
    from musubi.config.fleet import CommandJob, FleetSpec, Placement
    from musubi.config.job import JobSpec
    from musubi.config.schema_doc import reference_markdown, schema_rows

    page = reference_markdown()
    for model in (JobSpec, FleetSpec, Placement, CommandJob):
        for key, _typ, _default, desc in schema_rows(model):
            assert f"| `{key}` |" in page, f"{model.__name__}.{key} has no row"
            assert desc, f"{model.__name__}.{key} has no description"


@pytest.mark.parametrize("task, hint", [("detecton", " (did you mean detection?)"),
                                        ("classify", " (did you mean classification?)"),
                                        ("segmentation", "")])
def test_a_near_miss_task_name_gets_a_did_you_mean(task: str, hint: str) -> None:
    msg = _err({"task": task})
    assert msg == (f"job.yaml: task: must be classification, detection, lm, or `package.module:function`{hint} "
                   f"(got {task!r})"), msg
