"""RNG capture/restore round-trips every stream, without pickles."""

from __future__ import annotations

import random

import numpy as np
import torch

from musubi.worker.rng import capture_rng, restore_rng


def test_rng_round_trip() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    state = capture_rng(torch.device("cpu"))
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    expect = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng(state, torch.device("cpu"))
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expect[0] and got[1] == expect[1] and torch.equal(got[2], expect[2])
