"""The ranks' own refusals of a checkpoint (checkpoint.load_checkpoint), the second line behind the launch's checks
(launch/checks.py: world size and model signature from the marker): a torchrun elastic restart can change the
world after the launcher looked, and a job resumed unchanged is not built on the meta device by the launcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from musubi.checkpoint import checkpoint as ckpt
from musubi.contract.errors import ConfigError
from musubi.contract.world import World

pytestmark = pytest.mark.timeout(120)


def test_a_checkpoint_of_another_world_or_model_is_refused_by_the_rank(tmp_path: Path) -> None:
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = {"cpu": torch.zeros(4, dtype=torch.uint8)}
    signature = ckpt.model_signature(model)
    ckpt.save_checkpoint(tmp_path, 1, model, opt, {"step": 1, "signature": signature}, rng, world, keep_last=2)
    found = ckpt.latest_checkpoint(tmp_path)
    assert found is not None and found.marker["world_size"] == 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with pytest.raises(ConfigError, match=rf"checkpoint is of another model \(signature {found.marker['signature']} "):
        ckpt.load_checkpoint(found, other, torch.optim.SGD(other.parameters(), lr=0.1), rng, world,
                             ckpt.model_signature(other))
    marker = json.loads((found.path / ckpt.MARKER).read_text())
    (found.path / ckpt.MARKER).write_text(json.dumps({**marker, "world_size": 2}))  # as 2 ranks would have written
    found = ckpt.latest_checkpoint(tmp_path)
    assert found is not None
    with pytest.raises(ConfigError, match=r"written by 2 ranks, this run has 1; exact resume needs the same world "
                                          r"size: use --nproc 2"):
        ckpt.load_checkpoint(found, model, opt, rng, world, signature)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the model was overwritten"
