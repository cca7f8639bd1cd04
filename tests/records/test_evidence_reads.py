"""The run readers parse each telemetry file once while it stays unchanged, and again once it changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musubi.records import evidence
from musubi.store import rundir


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = rundir.read_jsonl

    def counting(path: Path) -> list[dict]:
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(evidence, "_read_jsonl", counting)
    evidence._parsed.cache_clear()
    yield seen
    evidence._parsed.cache_clear()


def test_a_jobs_rank_file_is_parsed_once_by_all_its_readers(tmp_path: Path, parses: list[str]) -> None:
    job = tmp_path / "job"
    steps = [{"kind": "step", "step": s, "wall_ms": 10.0, "host": {"data": 1.0}} for s in range(1, 21)]
    samples = [{"kind": "sample", "gpu_index": 0, "util": 90, "mem_used_gib": 3.5} for _ in range(10)]
    _write(job / "telemetry" / "rank0.jsonl", steps)
    _write(job / "telemetry" / "sampler-rank0.jsonl", samples)
    assert evidence.rank_steps(job) == {0: 20}
    assert evidence.gpu_utilisation(job) == {0: pytest.approx(0.9)}
    assert evidence.gpu_peak_gib(job) == 3.5
    assert evidence.data_wait_share(job) == pytest.approx(0.1)
    # Four readers; each file parsed once (before: the rank file four times, the sampler's twice).
    assert sorted(parses) == ["rank0.jsonl", "sampler-rank0.jsonl"]


def test_a_file_that_grew_is_read_again(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "telemetry" / "rank0.jsonl"
    _write(path, [{"kind": "step", "step": 1}])
    assert evidence.rank_steps(tmp_path) == {0: 1}
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "step", "step": 2}) + "\n")
    assert evidence.rank_steps(tmp_path) == {0: 2}
    assert parses == ["rank0.jsonl", "rank0.jsonl"]


def test_a_missing_file_reads_as_no_records(tmp_path: Path) -> None:
    assert evidence.read_jsonl(tmp_path / "absent.jsonl") == ()
