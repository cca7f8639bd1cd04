"""The resume matrix (cases.py) for D-FINE (transformers) under DDP: stopped and resumed == never stopped, bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint.resume_matrix.cases import MARKS, check_stop_and_resume, params, train_uninterrupted

pytestmark = MARKS


@pytest.mark.parametrize("case", params("detection-dfine_s-ddp"))
def test_stop_and_resume_equals_uninterrupted(case: str, tmp_path: Path) -> None:
    """Every tensor of every checkpoint both runs committed, bitwise."""
    check_stop_and_resume(case, *train_uninterrupted(case, tmp_path), tmp_path)
