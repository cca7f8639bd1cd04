"""Per-rank program for the check_unique_devices test: `torchrun --nproc-per-node 2 -m ... OUT_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from musubi.contract.errors import ConfigError
from musubi.contract.world import init_world, shutdown_world
from musubi.worker.devices import DeviceIdentity, check_unique_devices


def main() -> None:
    out = Path(sys.argv[1])
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


if __name__ == "__main__":
    main()
