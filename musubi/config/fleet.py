"""Pydantic models of a fleet: `defaults:` plus `jobs:`, each a task job or an external command.

A *task* job is a Musubi job (everything of `JobSpec`) plus its place in the
fleet (GPU count, priority, family, retries). An *external* job is an argv list
(never a shell string) run with a given Python, an explicit environment and a
launch style; it receives `CUDA_VISIBLE_DEVICES` and `MUSUBI_JOB_DIR` and must
write `$MUSUBI_JOB_DIR/eval.json` (and may write `model.onnx`). No torch here.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from musubi.config.job import MAX_PATH_CHARS, JobSpec, PathStr, ShortStr, StrictModel, check_safe_name
from musubi.config.success import SuccessSpec
from musubi.contract.env import MUSUBI_JOB_DIR

#: A fleet of more jobs than this is a mistake (or an attack on the scheduler).
MAX_JOBS = 1000


def check_arg(value: str) -> str:
    """An argv element: no NUL (the OS would cut it there); other characters are the program's business."""
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


#: Environment variable names of a command job: a portable shell name.
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, Field(max_length=32768), AfterValidator(check_arg)]


class Placement(StrictModel):
    """Where and how often a job runs in the fleet."""

    gpus: int = Field(1, ge=1, le=1024, description="GPUs (or CPU ranks) the job gets on each of its nodes, "
                      "all its own.")
    nodes: int = Field(1, ge=1, le=1024, description="Nodes the job spans (one torchrun agent each, c10d "
                       "rendezvous on the first); more than 1 needs `--executor slurm`.")
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs earlier.")
    family: ShortStr | None = Field(None, description="Jobs of one family run back to back (warm caches).")
    retries: int = Field(1, ge=0, le=20, description="Retries after a failure (not after a config error).")
    memory_gib: float | None = Field(None, gt=0, le=1e6, description="Declared GPU memory need per GPU (GiB).")
    max_gpus: int | None = Field(None, ge=1, le=1024, description="Moldable task job (local executor): the "
                                 "packer chooses its GPU count between min_gpus and this, from the predicted "
                                 "durations (per-rank batch kept: the global batch and LR follow the width). None: "
                                 "always `gpus`.")
    min_gpus: int = Field(1, ge=1, le=1024, description="Moldable task job: the fewest GPUs the packer may give it "
                          "(e.g. an FSDP model that needs 2 to fit).")
    expected_min: float | None = Field(None, gt=0, le=1e7, description="Expected minutes on `gpus` GPUs, start-up "
                                       "included: the packer's estimate until an earlier run of this job on this "
                                       "machine is recorded.")
    after: list[ShortStr] = Field(default_factory=list, max_length=MAX_JOBS, description="Jobs that must end well before this one "
                             "starts (Slurm: --dependency=afterok).")
    cpus_per_rank: int | None = Field(None, ge=1, le=1024, description="Slurm: CPU cores per rank (default: "
                                      "slurm.cpus_per_rank).")
    host_memory_gib: float | None = Field(None, gt=0, le=1e6, description="Slurm: host memory per node (--mem), GiB.")
    time_min: int | None = Field(None, ge=1, le=10**7, description="Slurm: time limit in minutes (--time; default: "
                                 "slurm.time_min).")


#: Keys of a fleet job that place it in the fleet; the rest describe the training job.
PLACEMENT_KEYS = frozenset(Placement.model_fields)


class SlurmSpec(StrictModel):
    """How `musubi run --executor slurm` asks Slurm for each job."""

    partition: ShortStr | None = Field(None, description="Partition (--partition); None: the cluster's default.")
    account: ShortStr | None = Field(None, description="Account (--account).")
    qos: ShortStr | None = Field(None, description="Quality of service (--qos).")
    cpus_per_rank: int = Field(4, ge=1, le=1024, description="CPU cores per rank (data loading), unless the job "
                               "says otherwise.")
    time_min: int | None = Field(None, ge=1, le=10**7, description="Default time limit in minutes (None: the partition's).")
    contiguous: bool = Field(False, description="Multi-node jobs on contiguous nodes (--contiguous).")
    switches: int | None = Field(None, ge=1, le=10**4, description="Multi-node jobs under at most this many leaf switches "
                                 "(--switches).")
    extra: list[ShortStr] = Field(default_factory=list, max_length=64, description="More sbatch options, verbatim (e.g. "
                             "['--constraint=h100']).")
    poll_s: float = Field(10.0, gt=0, le=600, description="Seconds between squeue polls.")


class MetricsFrom(StrictModel):
    """Read an external job's own framework files into eval.json, so the program needs no edit."""

    format: Literal["ultralytics", "lightning", "hf-trainer"] = Field(
        description="ultralytics (results.csv, weights/best.pt), lightning (CSVLogger metrics.csv) or hf-trainer "
        "(trainer_state.json).")
    path: PathStr | None = Field(None, description="File or folder the framework writes to, relative to "
                                 f"${MUSUBI_JOB_DIR} (the program's working directory); default: the newest such "
                                 "file anywhere under it.")
    metrics: dict[Annotated[str, Field(min_length=1, max_length=64)], ShortStr] | None = Field(
        None, max_length=64, description="Musubi name -> the framework's own metric name, e.g. {map50: val_map50}, "
        "{map50: metrics/mAP50(B)} or {top1: eval_accuracy} (HF: `accuracy` too); the first is the primary metric. "
        "Default: ultralytics gives map50/map/precision/recall, the others their own names.")
    export: bool = Field(True, description="ultralytics: export the recorded weights/best.pt to ONNX (with the "
                         "framework's NMS where it has it) in the job's Python through Ultralytics' own exporter, "
                         "then rank the job by that model's FPS, timed like every other job's, and ship it if it "
                         "wins. false: ranked only by an FPS the program reports (or its own model.onnx).")
    python: PathStr | None = Field(None, description="The interpreter that has the framework installed, for the "
                                   "export. Default: the job's `python:`, else the interpreter the command's "
                                   "#! line names (an installed `yolo` script), else Musubi's own Python for a .py "
                                   "command.")

    @model_validator(mode="before")
    @classmethod
    def _bare_format(cls, v: Any) -> Any:
        """`metrics_from: ultralytics` is short for `{format: ultralytics}`."""
        return {"format": v} if isinstance(v, str) else v


class CommandJob(Placement):
    """An external program with the fleet's contract (writes $MUSUBI_JOB_DIR/eval.json, or declares metrics_from)."""

    name: str = Field(max_length=64, description="Job name; becomes the job's directory name.")
    command: list[Annotated[str, Field(max_length=MAX_PATH_CHARS), AfterValidator(check_arg)]] = Field(
        min_length=1, max_length=1024, description="argv list (never a shell string).")
    python: PathStr | None = Field(None, description="Interpreter (e.g. another venv's bin/python): runs "
                                   "`python argv...`.")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=256,
                                         description="Extra environment variables (explicit).")
    launch: Literal["single", "torchrun"] = Field(
        "single", description="single: one process; torchrun: `python -m torch.distributed.run` over its GPUs."
    )
    metrics_from: MetricsFrom | None = Field(
        None, description="Read the metrics from the files the program's framework writes (ultralytics, lightning, "
        "hf-trainer) instead of an eval.json it would have to write.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_safe_name(v)

    @model_validator(mode="after")
    def _single_gpu(self) -> CommandJob:
        if self.launch == "single" and self.gpus > 1:
            raise ValueError("launch: single runs one process: gpus must be 1 (or use launch: torchrun)")
        if self.nodes > 1:
            raise ValueError("nodes: external commands run on one node; multi-node jobs are task jobs")
        if self.max_gpus is not None:
            raise ValueError("max_gpus: an external command runs on exactly `gpus` GPUs; only task jobs are moldable")
        return self


class TaskJob(Placement):
    """A Musubi training job and its placement."""

    spec: JobSpec

    @model_validator(mode="after")
    def _widths(self) -> TaskJob:
        if self.max_gpus is not None and not self.min_gpus <= self.gpus <= self.max_gpus:
            raise ValueError(f"gpus: {self.gpus} must lie between min_gpus ({self.min_gpus}) and max_gpus "
                             f"({self.max_gpus}); widen the range or change gpus")
        if self.max_gpus is not None and self.nodes > 1:
            raise ValueError("max_gpus: multi-node jobs keep their width; drop max_gpus or nodes")
        return self

    @property
    def widths(self) -> tuple[int, ...]:
        """The GPU counts the packer may give this job (only `gpus` unless it is moldable)."""
        if self.max_gpus is None:
            return (self.gpus,)
        return tuple(range(self.min_gpus, self.max_gpus + 1))

    @property
    def name(self) -> str:
        """The job's name (from its spec)."""
        return self.spec.name


class LeaderboardSpec(StrictModel):
    """How jobs are ranked and which are exported."""

    quality_weight: float = Field(0.7, ge=0, le=1, description="Weight of the quality metric (mAP50, top-1).")
    fps_weight: float = Field(0.3, ge=0, le=1, description="Weight of normalised FPS.")
    fps_target: float | None = Field(None, gt=0, description="Normalise FPS by this target (default: fleet best).")
    quality_floor: float = Field(0.5, ge=0, le=1, description="Rank a job only when its quality is above 0 and at "
                                 "least this share of the best quality (same metric); the others are listed "
                                 "unranked, so speed alone never wins.")
    min_quality: dict[Annotated[str, Field(min_length=1, max_length=64)], Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, max_length=64, description="Absolute quality floor by metric: a job below it is listed "
        "unranked whatever its speed or the other jobs, e.g. {map50: 0.1}. Defaults: map50 0.05, map 0.02; top1 "
        "(top5) a tenth of the way from chance, 1/classes (5/classes), to 1 (10 classes: 0.19); any other metric "
        "only needs to be above 0. Given here, a metric's floor replaces its default.")
    export_top: int = Field(1, ge=0, le=100, description="Export (ONNX) and register the top-k jobs.")
    promote: bool = Field(True, description="Promote the exported top-k for deployment (each supersedes the "
                          "promoted version of its model name); false: register only, promote by hand.")

    @model_validator(mode="after")
    def _some_weight(self) -> LeaderboardSpec:
        if self.quality_weight + self.fps_weight <= 0:
            raise ValueError("quality_weight and fps_weight are both 0: nothing would rank the jobs; give one a "
                             "weight > 0")
        return self


class MachineSpec(StrictModel):
    """How the fleet uses the machine: its topology and the cores of each job's ranks."""

    topology: str | None = Field(
        None, description="A recorded `nvidia-smi topo -m` text or env.json to place jobs by, instead of "
        "reading this machine (path relative to the fleet file).")
    pin_cpus: bool = Field(
        True, description="Give each GPU (or CPU slot) its own cores and pin every job's ranks to the cores of "
        "their GPUs (external commands to the cores of all their GPUs). false: no pinning in the fleet.")
    overlap: bool | None = Field(
        None, description="Local executor: a job's GPUs go back to the packer when its training ends, so the next "
        "job starts (imports, torchrun, process group) while the evaluation step runs, building its model only "
        "once that evaluation is over; the evaluation step itself is started early (its imports beside the "
        "training). false: a job holds its GPUs to the end of its evaluation and evaluation starts after training. "
        "Unset: on with GPUs, off on CPU slots (there the start-up and the evaluation take cores from the "
        "training beside them: on 2 idle cores the demo fleet took longer with it than without; see BENCHMARKS.md).")
    share_gpus: Literal["auto", "off"] = Field(
        "off", description="Local executor on GPUs (opt-in: small jobs measured sharing a GPU ran slower than "
        "the slowdown model said; see BENCHMARKS.md). auto: two single-GPU jobs may share one GPU when an earlier "
        "run of each alone on this machine recorded utilisations of <= 0.5 each and <= 0.9 together and peak "
        "memories that fit with headroom, no GPU is free, neither was measured 2x slower or more while sharing, "
        "and the plan predicts a fleet at least 10 % shorter with it (unmeasured jobs never share; see "
        "docs/guides/fleets.md, Two jobs on one GPU). off (or false): a job's GPUs are its own.")


    @field_validator("share_gpus", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        """YAML reads a bare `off` as false (and `on` as true): the same words."""
        return {False: "off", True: "auto"}.get(v, v) if isinstance(v, bool) else v


class FleetSpec(StrictModel):
    """A fleet: shared defaults and the jobs (built by `config.load.load_fleet`, which merges the
    defaults under each task job and names the job in every error)."""

    name: str = Field(max_length=64, description="Fleet name; the run directory is runs/<time>-<name>.")
    defaults: dict[str, Any] = Field(default_factory=dict, description="Merged under every task job.")
    leaderboard: LeaderboardSpec = Field(default_factory=LeaderboardSpec, description="Ranking and export.")
    success: SuccessSpec = Field(default_factory=SuccessSpec, description="Success criteria over the whole "
                                 "fleet, checked at the end (RUN/checklist.json, exit code).")
    machine: MachineSpec = Field(default_factory=MachineSpec, description="Topology and CPU pinning.")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="Resources and polling of `--executor slurm`.")
    jobs: list[TaskJob | CommandJob] = Field(min_length=1, max_length=MAX_JOBS, description="The jobs.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_safe_name(v)

    @model_validator(mode="after")
    def _unique(self) -> FleetSpec:
        seen: set[str] = set()
        for job in self.jobs:
            if job.name in seen:
                raise ValueError(f"two jobs are named {job.name!r}: job names must be unique")
            seen.add(job.name)
        for job in self.jobs:
            for dep in job.after:
                if dep not in seen or dep == job.name:
                    raise ValueError(f"job {job.name!r}: after: {dep!r} is no other job of this fleet; name one of "
                                     f"{sorted(seen - {job.name})}")
        deps = {j.name: set(j.after) for j in self.jobs}
        done: set[str] = set()
        while len(done) < len(deps):  # peel jobs whose dependencies are all peeled; what stays is a cycle
            ready = {n for n, d in deps.items() if n not in done and d <= done}
            if not ready:
                raise ValueError(f"after: the jobs {sorted(set(deps) - done)} wait for each other (a cycle); "
                                 "break it")
            done |= ready
        return self


#: Keys whose mapping a job replaces whole instead of merging (they belong to one model).
REPLACED_KEYS = {"model_args"}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mappings merged key by key (lists, scalars and model_args replaced)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in REPLACED_KEYS:
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
