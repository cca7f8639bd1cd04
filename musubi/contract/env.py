"""Every `MUSUBI_*` environment variable, named once: what crosses a process boundary by environment.

A launcher, a fleet or a user sets them; a rank, a torchrun agent or an external program reads
them. Code everywhere else names them through these constants (a test keeps the spelling here),
so `grep MUSUBI_CPUS` finds every writer and reader.
"""

from __future__ import annotations

#: What every Musubi variable starts with (env.json records all of them for provenance).
VARIABLE_PREFIX = "MUSUBI_"

#: Faults to inject (`oom:rank=1,step=5; kill:...`): parsed by contract/inject.py in every rank.
MUSUBI_INJECT = "MUSUBI_INJECT"
#: `cuda` or `cpu`: the device kind every rank of a job binds (set by the launcher, read by the World).
MUSUBI_DEVICE = "MUSUBI_DEVICE"
#: One core list per local rank (`0-7;8-15`): the cores a rank pins itself to (launch/pin_plan.py).
MUSUBI_CPUS = "MUSUBI_CPUS"
#: Launch number of the job (1, 2, ...; job.json attempts): the first half of a rank's attempt id.
MUSUBI_LAUNCH = "MUSUBI_LAUNCH"
#: Nodes of a multi-node job: set by the launcher so preflight on each node knows it is one of several.
MUSUBI_NNODES = "MUSUBI_NNODES"
#: An external job's own folder RUN/JOB (its working directory): it writes eval.json there.
MUSUBI_JOB_DIR = "MUSUBI_JOB_DIR"
#: A file whose removal lets a job's ranks build their model (the fleet's GPU hand-over while the
#: previous job on those GPUs still evaluates).
MUSUBI_GATE = "MUSUBI_GATE"
#: The fleet's pid beside MUSUBI_GATE: a gate whose owner is gone is ignored.
MUSUBI_GATE_PID = "MUSUBI_GATE_PID"
#: `torchrun` forces the per-rank form of preflight's NCCL probe (default: one process, every GPU).
MUSUBI_COMM_PROBE = "MUSUBI_COMM_PROBE"
#: Seconds a job gets to stop after SIGTERM before its processes are killed.
MUSUBI_STOP_GRACE = "MUSUBI_STOP_GRACE"
#: A run id a user may set; it differs between any two runs, so `musubi compare` does not report it.
MUSUBI_RUN_ID = "MUSUBI_RUN_ID"
#: The pid torchrun started for a rank the warm spare forked (its thin client): torchrun's log names the rank by it.
#: Set by the spare in the rank's environment; the heartbeat records it beside the rank's own pid.
MUSUBI_CLIENT_PID = "MUSUBI_CLIENT_PID"
#: `0` turns the launch's warm spare off (ranks start a fresh interpreter each), whatever train.warm_spare says.
MUSUBI_WARM_SPARE = "MUSUBI_WARM_SPARE"
#: The folder of a running spare server (worker/spare_server.py): a launch has it fork its warm spare instead of
#: starting one that imports torch; unset, or the server gone, the spare starts the plain way.
MUSUBI_SPARE_SERVER = "MUSUBI_SPARE_SERVER"
