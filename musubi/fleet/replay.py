"""A recorded fleet replayed by the fleet's own packer on a virtual clock: the simulator checked against a run.

`musubi run FLEET.yaml --dry-run --replay RUN` reads RUN/fleet.json: every attempt of every job, the
GPUs it held and for how long (its start to the release of its GPUs: the end of training with
`machine.overlap`, else the end of its evaluation) and its tail (the evaluation that ran after the
release). It queues the attempts in the order they started, each on its recorded width with its
measured seconds, with the fleet's priorities and `after:` (a retry waits for the attempt before it),
and runs `moldable.simulate`, the same packer loop the planner and `--dry-run` use. The simulated
makespan (the latest end of a bar plus its tail) is compared with the recorded one (the latest end
minus the first start). The difference is what the real fleet adds between jobs (its 0.5 s poll,
spawning) and any decision the packer would take differently. Attempts that shared a GPU
(machine.share_gpus) may share again in the simulation, with no further slowdown: their measured seconds
already hold it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from musubi.config.fleet import FleetSpec
from musubi.fleet.moldable import Bar, simulate
from musubi.fleet.packer import Demand
from musubi.fleet.sharing import SharePolicy
from musubi.records.attempts import attempts_of

#: The GPU memory a replay's SharePolicy offers (GiB): more than any two recorded jobs need, headroom included.
REPLAY_GIB = 1e9


@dataclass
class Replay:
    """The recorded and the simulated timelines and makespans."""

    devices: list[int]
    recorded: list[Bar]
    simulated: list[Bar]
    recorded_s: float
    simulated_s: float

    @property
    def error(self) -> float:
        """Simulated over recorded makespan, minus 1."""
        return self.simulated_s / self.recorded_s - 1.0 if self.recorded_s > 0 else 0.0


def replay(record: dict[str, Any], spec: FleetSpec | None = None, devices: Sequence[int] | None = None) -> Replay:
    """Simulate the recorded attempts on the fleet's packer (see the module docstring)."""
    attempts = attempts_of(record)
    devs = sorted(devices if devices is not None else {g for a in attempts for g in a.gpus})
    jobs = {j.name: j for j in spec.jobs} if spec is not None else {}
    previous: dict[str, str] = {}
    queue: list[Demand] = []
    for a in attempts:
        j = jobs.get(a.job)
        after = tuple(j.after) if j is not None else ()
        if a.job in previous:  # a retry starts after the attempt before it ended
            after += (previous[a.job],)
        previous[a.job] = a.name
        shared = (0.0, 0.0) if a.shared_with else (None, None)  # utilisation 0: the slowdown is in its seconds
        queue.append(Demand(a.name, len(a.gpus), j.priority if j is not None else 0, after=after,
                            seconds=(max(0.0, a.released - a.start),), util=shared[0], peak_gib=shared[1]))
    # Memory was checked when they shared: here any two recorded sharers fit.
    share = SharePolicy(memory_gib=REPLAY_GIB) if any(a.shared_with for a in attempts) else None
    bars = simulate(devs, queue, {d.name: d.gpus for d in queue}, share=share)
    tail = {a.name: max(0.0, a.end - a.released) for a in attempts}
    recorded = [Bar(a.name, a.gpus, a.start, a.released) for a in attempts]
    return Replay(devs, recorded, bars, max((a.end for a in attempts), default=0.0),
                  max((b.end + tail[b.name] for b in bars), default=0.0))


def replay_lines(r: Replay, unit: str = "GPU") -> list[str]:
    """What `--replay` prints: both makespans and the difference."""
    return [f"replay of {len(r.recorded)} recorded attempt(s) on {len(r.devices)} {unit}s with the fleet's packer: "
            f"simulated makespan {r.simulated_s:.1f} s, recorded {r.recorded_s:.1f} s ({r.error:+.1%})"]
