"""A resume of a run recorded before a schema field existed: the field at its default is no change.

Upgrading Musubi adds job fields (data.jpeg_decoder, say); a run recorded before has no such key. The
resume guard must not call that a change the user made, or every run in flight stops resuming after an
upgrade; the same field set to something other than its default still is one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.launch.admission import check_resume


def _spec(**data: object) -> dict:
    return JobSpec.model_validate({"name": "j", "task": "classification", "model": "resnet18",
                                   "data": {"synthetic": {}, **data}}).resolved()


def test_a_field_the_record_lacks_at_its_default_is_no_change(tmp_path: Path) -> None:
    now = _spec()
    old = _spec()
    del old["data"]["jpeg_decoder"]
    assert check_resume({"config": old}, now, [], tmp_path / "job.json") == []


def test_a_field_the_record_lacks_set_otherwise_is_refused(tmp_path: Path) -> None:
    now = _spec(jpeg_decoder="cuda")
    old = _spec()
    del old["data"]["jpeg_decoder"]
    with pytest.raises(ConfigError, match=r"data\.jpeg_decoder None -> 'cuda'.*--allow-changes data\.jpeg_decoder"):
        check_resume({"config": old}, now, [], tmp_path / "job.json")


def test_a_recorded_value_that_differs_is_still_a_change(tmp_path: Path) -> None:
    old = _spec(jpeg_decoder="cuda")
    with pytest.raises(ConfigError, match="jpeg_decoder 'cuda' -> 'auto'"):
        check_resume({"config": old}, _spec(), [], tmp_path / "job.json")
    changes = check_resume({"config": old}, _spec(), ["data.jpeg_decoder"], tmp_path / "job.json")
    assert changes == [{"key": "data.jpeg_decoder", "before": "cuda", "after": "auto"}]


def test_a_whole_section_the_record_lacks_at_its_defaults_is_no_change(tmp_path: Path) -> None:
    now = _spec()
    old = _spec()
    del old["eval"]
    assert check_resume({"config": old}, now, [], tmp_path / "job.json") == []
