"""A model with a module registered under two names (D-FINE's `class_embed` is also its decoder's) saved and resumed
through DDP: through the wrapper, torch 2.11's state-dict helpers skipped the second name and the resume failed with
"Missing key(s)" (the CPU suite on the GPU machine); the checkpoint reads and writes DDP's inner module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from musubi.checkpoint import checkpoint as ckpt
from musubi.contract.world import World

pytestmark = pytest.mark.timeout(120)


class Body(nn.Module):
    """A layer with BatchNorm and the head (as D-FINE's decoder holds class_embed)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)


class Shared(nn.Module):
    """A head reachable as `head` and as `body.head`, registered after the body (D-FINE's order)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Body()
        self.head = self.body.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.norm(self.body.layer(x)))


def test_a_module_of_two_names_resumes_through_ddp(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(Shared())
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
        rng = {"cpu": torch.zeros(4, dtype=torch.uint8)}
        signature = ckpt.model_signature(model.module)
        ckpt.save_checkpoint(tmp_path / "ck", 1, model, opt, {"step": 1}, rng, world, keep_last=2)
        saved = {k: v.clone() for k, v in model.module.state_dict().items()}
        assert "head.weight" in saved and "body.head.weight" in saved
        saved_moments = {k: v.clone() for k, v in opt.state[model.module.head.weight].items()}

        torch.manual_seed(1)
        fresh = nn.parallel.DistributedDataParallel(Shared())
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.01)
        found = ckpt.latest_checkpoint(tmp_path / "ck")
        assert found is not None
        ckpt.load_checkpoint(found, fresh, fresh_opt, rng, world, signature)
        assert all(torch.equal(saved[k], v) for k, v in fresh.module.state_dict().items())
        moments = fresh_opt.state[fresh.module.head.weight]
        assert all(torch.equal(saved_moments[k], moments[k]) for k in saved_moments)
        del model, fresh  # gloo: the DDP wrappers go before the group
    finally:
        dist.destroy_process_group()
