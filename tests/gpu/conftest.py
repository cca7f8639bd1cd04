"""The GPU tier: real CUDA tensors and NCCL on the lent GPU machine (`make gpu-test`).

Every test here is marked `gpu` and skipped with a one-line reason where the machine has fewer
GPUs than it needs, so CI (no GPU) stays green. The GPUs are counted through NVML, never through
torch.cuda: the pytest process must not initialise CUDA (the jobs it starts do).

`MUSUBI_GPU_TIER_ON_CPU=1` rehearses the tier on gloo CPU ranks (same commands, `--device cpu`,
real OOMs replaced by the `oom_above` injection): the way to debug the tier's own code without
spending GPU time. A rehearsal proves the plumbing, never the GPU behaviour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.lease import lease

REPO = Path(__file__).resolve().parents[2]
REHEARSAL = os.environ.get("MUSUBI_GPU_TIER_ON_CPU") == "1"
#: CUDA_VISIBLE_DEVICES as pytest found it (the root conftest blanks it for the CPU tests).
_VISIBLE_AT_START = os.environ.get("CUDA_VISIBLE_DEVICES")


def count_gpus() -> int:
    """GPUs this process may use, by NVML (CUDA_VISIBLE_DEVICES applied); 0 without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU
        return 0
    if _VISIBLE_AT_START is not None:
        ids = [x for x in _VISIBLE_AT_START.split(",") if x.strip()]
        return min(n, len(ids))
    return n


GPUS = 4 if REHEARSAL else count_gpus()


def needs_gpus(n: int, uses: int | None = None, lane: str | None = None) -> list[pytest.MarkDecorator]:
    """Marks of a test that needs `n` GPUs (and occupies `uses`, default `n`): `gpu`, a skip naming what is
    missing, `wide` when it occupies every GPU here, and `xdist_group(lane)` for the tests that share the
    machine. `make gpu-test` runs the wide tests first, one at a time on the whole machine, then the others
    side by side in two lanes of two GPUs: a wide test queued behind narrow ones would hold idle GPUs until
    both lanes drained (on 2026-11-26 that, and a CPU suite beside it, took the 4-GPU tier to 532 s)."""
    marks = [pytest.mark.gpu, pytest.mark.skipif(GPUS < n, reason=f"needs {n} CUDA GPUs, found {GPUS} "
                                                 "(the GPU tier runs on the lent machine: make gpu-test)")]
    if (uses or n) >= GPUS:
        marks.append(pytest.mark.wide)
    elif lane:
        marks.append(pytest.mark.xdist_group(lane))
    return marks


@pytest.fixture(autouse=True)
def _cpu_and_repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overrides the root conftest's fixture: GPU tests keep the GPUs visible (jobs get a lease)."""
    monkeypatch.chdir(REPO)
    os.environ.pop("MUSUBI_INJECT", None)
    if REHEARSAL:
        monkeypatch.setenv("MUSUBI_DEVICE", "cpu")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


class Musubi:
    """Runs `python -m musubi.cli ...` on leased GPUs (or CPU ranks in a rehearsal)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def __call__(self, *args: str, gpus: int, inject: str | None = None, timeout: int = 300,
                 expect: int = 0) -> subprocess.CompletedProcess:
        cpu_flag = ["--device", "cpu"] if args[0] in ("train", "run") else []
        return self.run([sys.executable, "-m", "musubi.cli", *args], cpu_flag, gpus, inject, timeout, expect)

    def torchrun(self, script: str, *args: str, gpus: int, timeout: int = 300) -> subprocess.CompletedProcess:
        """`script` (a path in the repository) under torchrun, one rank a GPU; `--cpu` added in a rehearsal."""
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
               str(REPO / script), *args]
        return self.run(cmd, ["--cpu"], gpus, None, timeout, 0)

    def run(self, cmd: list[str], cpu_args: list[str], gpus: int, inject: str | None, timeout: int,
            expect: int) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        env.pop("MUSUBI_INJECT", None)
        if inject:
            env["MUSUBI_INJECT"] = inject
        with lease(gpus, max(GPUS, 1)) as ids:
            if REHEARSAL:
                env.update(MUSUBI_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
                cmd = cmd + cpu_args
            else:
                env.pop("MUSUBI_DEVICE", None)
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(_physical(i)) for i in ids)
            res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        out = res.stdout + res.stderr
        assert res.returncode == expect, f"{' '.join(cmd)} -> exit {res.returncode}, wanted {expect}:\n{out[-6000:]}"
        return res


def _physical(i: int) -> str:
    """The i-th GPU of those pytest may use, as CUDA_VISIBLE_DEVICES names it."""
    if _VISIBLE_AT_START:
        return [x.strip() for x in _VISIBLE_AT_START.split(",") if x.strip()][i]
    return str(i)


@pytest.fixture
def musubi(tmp_path: Path) -> Musubi:
    return Musubi(tmp_path)


def write_job(path: Path, job: dict[str, Any]) -> Path:
    """Write a job YAML (JSON is YAML) and return its path."""
    path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def train_losses(job_dir: Path) -> list[float]:
    """Rank 0's logged training losses, in step order."""
    return [r["loss"] for r in read_jsonl(job_dir / "metrics.jsonl") if r.get("kind") == "train" and "loss" in r]


def assert_same_tensors(a: dict[str, Any], b: dict[str, Any], what: str, atol: float = 0.0) -> None:
    """Same keys, and every tensor equal (bitwise when atol is 0)."""
    import torch

    assert a and set(a) == set(b), f"{what}: keys differ: {sorted(set(a) ^ set(b))[:5]}"
    bad = [k for k in a if not (torch.equal(a[k], b[k]) if atol == 0 else
                                torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=atol))]
    assert not bad, f"{what}: {len(bad)} of {len(a)} tensors differ, first {bad[:3]}"


def figure(name: str, value: object) -> None:
    """Record a figure for the tier's result file (bench/gpu_tier.py collects MUSUBI_GPU_FIGURES)."""
    path = os.environ.get("MUSUBI_GPU_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"figure": name, "value": value}) + "\n")


def stop_resume_equals_uninterrupted(musubi: Musubi, tmp_path: Path, job: dict, nproc: int, stop: int) -> Path:
    """Uninterrupted run, then stop at `stop` and --resume: every checkpoint tensor bitwise equal."""
    from musubi.launch.drill import final_tensors

    path = write_job(tmp_path / f"{job['name']}.yaml", job)
    base = ("train", str(path), "--nproc", str(nproc), "--no-check")
    musubi(*base, "--out", str(tmp_path / "full"), gpus=nproc)
    musubi(*base, "--out", str(tmp_path / "cut"), "--max-steps", str(stop), gpus=nproc)
    musubi(*base, "--out", str(tmp_path / "cut"), "--resume", gpus=nproc)
    full, cut = tmp_path / "full" / job["name"], tmp_path / "cut" / job["name"]
    losses = train_losses(full)
    assert losses[-1] < losses[0], f"{job['name']} did not learn: {losses}"
    assert_same_tensors(final_tensors(cut), final_tensors(full), f"{job['name']} x{nproc}: stop at {stop}, resume")
    return full
