"""Every RNG a rank uses (python, numpy, torch, cuda), captured as tensors and restored.

States are stored as integer tensors, not pickles, so a checkpoint can be read
without unpickling anything.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's RNG states as tensors."""
    version, internal, gauss = random.getstate()
    py = torch.tensor([version, *internal], dtype=torch.int64)
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": py,
        "python_gauss": torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64),
        "numpy_keys": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_meta": torch.tensor([np_pos, np_has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_gauss], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put back states captured by `capture_rng`."""
    py = [int(v) for v in state["python"].tolist()]
    gauss = float(state["python_gauss"][0])
    random.setstate((py[0], tuple(py[1:]), None if gauss != gauss else gauss))
    pos, has_gauss = (int(v) for v in state["numpy_meta"].tolist())
    keys = state["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, pos, has_gauss, float(state["numpy_gauss"][0])))
    torch.set_rng_state(state["torch"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


class RankRng:
    """This rank's RNG streams as a stateful (checkpoint/states.py): captured at a save, put back at a load."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The streams now (`capture_rng`)."""
        return capture_rng(self.device)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Put loaded streams back (`restore_rng`)."""
        restore_rng(state, self.device)
