"""Per-rank program for the check_unique_devices test: `torchrun --nproc-per-node 2 -m ... OUT_DIR`, or `forked`
started by torch.multiprocessing (tests/preflight/test_runtime.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.contract.world import init_world, shutdown_world
from musubi.worker.devices import DeviceIdentity, check_unique_devices


def run(out: Path) -> None:
    """This rank's three checks (CPU ranks, distinct GPUs, one shared GPU), written to OUT/rank{r}.json."""
    world = init_world(60, "cpu")
    seen: dict[str, str | None] = {}
    check_unique_devices(world)  # CPU ranks: a no-op, no collective
    seen["cpu"] = None
    for case, uuid in (("distinct", f"GPU-{world.rank}"), ("shared", "GPU-same")):
        # Crafted readings through the real all-gather: both ranks claim one GPU in "shared".
        ident = DeviceIdentity(rank=world.rank, host="node-a", uuid=uuid, name="NVIDIA H100", device="cuda:0")
        try:
            check_unique_devices(world, ident)
            seen[case] = None
        except ConfigError as e:
            seen[case] = str(e)
    (out / f"rank{world.rank}.json").write_text(json.dumps(seen), encoding="utf-8")
    shutdown_world()


def forked(rank: int, world_size: int, port: int, out: str) -> None:
    """One rank started by torch.multiprocessing: the environment torchrun would give it, then `run`."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    run(Path(out))


def main() -> None:
    run(Path(sys.argv[1]))


if __name__ == "__main__":
    main()
