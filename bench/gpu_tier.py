"""`make gpu-test`: the GPU tier (tests/gpu) on this machine's GPUs, and its result file.

    python bench/gpu_tier.py [--workers 2] [--cpu-suite] [--budget-s 480] [TEST ...]

Runs `pytest -m gpu tests/gpu` in two phases: the `wide` tests (those that occupy every GPU) one after
the other, then the rest in two pytest-xdist workers (lanes `pair-a`/`pair-b`, two GPUs each, through
tests/gpu/lease.py) when xdist is installed. Named tests run in the given order instead. It writes `bench/results/gpu-tests-DATE-CARD.txt`, whose first line names
the commit and the card, then the torch/CUDA/NCCL versions, the pytest summary and the figures the
tests recorded. `--cpu-suite` also runs the CPU suite here at the same time (this machine's torch and
cores: version skew shows up before users meet it) into `bench/results/cpu-suite-DATE-CARD.txt`.
Where $OUT is set (the lent machine), the result files are copied there too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.provenance import commit  # noqa: E402


def card() -> tuple[str, str]:
    """('4xH200', 'NVIDIA H200 x4, driver ...') from NVML; ('cpu', ...) without GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        name = name.decode() if isinstance(name, bytes) else name
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver
        return "cpu", "no GPU"
    short = next((w for w in name.replace("-", " ").split() if w[:1] in "HABLV" and any(c.isdigit() for c in w)),
                 name.split()[-1])
    return f"{n}x{short}", f"{n}x {name}, driver {driver}"


def versions() -> str:
    code = ("import torch,platform;"
            "nccl='.'.join(map(str,torch.cuda.nccl.version())) if torch.cuda.is_available() else '-';"
            "print(f'python {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda} nccl {nccl}')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()


def pytest_cmd(args: list[str], workers: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-v", "-rA", "--durations=0", "-p", "no:cacheprovider", *args]
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    return cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the tests that share the GPUs")
    ap.add_argument("--cpu-suite", action="store_true", help="also run the CPU suite here, at the same time")
    ap.add_argument("--cpu-workers", type=int, default=8)
    ap.add_argument("--cpu-deadline-s", type=int, default=530,
                    help="the CPU suite is stopped this many seconds after it started (its log so far is kept)")
    ap.add_argument("--budget-s", type=int, default=480, help="the tier's time limit (the issue's 8 minutes)")
    ap.add_argument("-k", default=None, help="pytest -k expression (a part of the tier)")
    ap.add_argument("tests", nargs="*", default=["tests/gpu"],
                    help="test files or node ids, run in this order in one phase (default: tests/gpu, two phases)")
    a = ap.parse_args()

    tag, card_text = card()
    date = dt.date.today().isoformat()
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    head = f"commit {commit()} · card {card_text} · {date}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cpu = None
    if a.cpu_suite:
        cpu_env = dict(env, CUDA_VISIBLE_DEVICES="", MUSUBI_DEVICE="cpu")
        cpu_log = open(Path(tempfile.gettempdir()) / "musubi-cpu-suite.log", "w")  # noqa: SIM115
        # tests/slurm installs Slurm with apt-get where none runs: the lent machines have no network.
        # Its own basetemp: a failed test's folder is kept (tmp_path_retention_policy), and its launches' logs come
        # back in an archive (launches that failed there with "torchrun exited with 1" left no log otherwise).
        cpu_base = Path(tempfile.mkdtemp(prefix="musubi-cpu-suite-"))
        cpu_args = ["-m", "not gpu", "tests", "--ignore=tests/gpu", "--ignore=tests/slurm", f"--basetemp={cpu_base}"]
        # Niced: the CPU suite shares the cores with the GPU tests' ranks, which must not wait on it.
        cpu = (subprocess.Popen(pytest_cmd(cpu_args, a.cpu_workers), cwd=REPO, env=cpu_env, stdout=cpu_log,
                                stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(10)), cpu_log, time.time())
    figures = Path(tempfile.mkdtemp()) / "figures.jsonl"
    env["MUSUBI_GPU_FIGURES"] = str(figures)
    t0 = time.time()
    # The tests' run directories in a known place: their logs say where each launch spent its time.
    basetemp = Path(tempfile.mkdtemp(prefix="musubi-gpu-tier-"))
    common = ["-m", "gpu"] + (["-k", a.k] if a.k else [])
    if a.tests == ["tests/gpu"] and not a.k:
        # Wide tests alone first, while the machine is empty; then two lanes side by side.
        phases = [(["-m", "gpu and wide", "tests/gpu"], 1), (["-m", "gpu and not wide", "tests/gpu"], a.workers)]
    else:
        phases = [(a.tests, 1)]
    # Streamed to a file as it runs: a tier cut short by its budget still says which tests passed.
    gpu_log = Path(tempfile.gettempdir()) / "musubi-gpu-tier.log"
    rc, commands = 0, []
    with open(gpu_log, "w", encoding="utf-8") as log:
        for i, (selection, workers) in enumerate(phases):
            # A phase of its own basetemp: pytest empties the one it is given.
            cmd = pytest_cmd(common + [f"--basetemp={basetemp / f'phase{i + 1}'}"] + selection, workers)
            commands.append(" ".join(cmd[1:]))
            log.write(f"=== phase {i + 1}: {commands[-1]}\n")
            log.flush()
            left = a.budget_s + 60 - (time.time() - t0)
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=max(1.0, left))
            except subprocess.TimeoutExpired:
                interrupt(proc, group=True)
                code = 124
            if code == 124:
                log.write(f"\nTIMEOUT after {a.budget_s + 60}s\n")
            rc = rc if code == 5 else max(rc, code)  # 5: this phase selected nothing (e.g. 2 GPUs: all wide)
            if code == 124:
                break
    out = gpu_log.read_text(encoding="utf-8", errors="replace")
    wall = time.time() - t0
    body = [head, versions(), "command: make gpu-test (" + " ; ".join(commands) + ")",
            f"wall {wall:.0f} s (budget {a.budget_s} s){' OVER BUDGET' if wall > a.budget_s else ''}; pytest exit {rc}",
            "", "figures:"]
    body += figures.read_text().splitlines() if figures.is_file() else ["(none)"]
    body += ["", "pytest:", *out.splitlines()[-500:]]
    path = results / f"gpu-tests-{date}-{tag}.txt"
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    print("\n".join(body[:6] + body[-25:]))
    print(f"written: {path}")
    paths = [path, gpu_log, run_logs(basetemp)]
    # To $OUT at once: a call whose own time limit ends while the CPU suite still runs keeps the GPU result
    # (on 2026-11-26 a `timeout` around `make gpu-test` ended it there and both result files were lost).
    copy_out(paths)
    if cpu is not None:
        proc, log, c0 = cpu
        try:
            proc.wait(timeout=max(30, a.cpu_deadline_s - (time.time() - c0)))
        except subprocess.TimeoutExpired:
            interrupt(proc, group=False)
        log.close()
        text = Path(log.name).read_text(encoding="utf-8", errors="replace").splitlines()
        cpath = results / f"cpu-suite-{date}-{tag}.txt"
        cpath.write_text("\n".join([head, versions(), f"CPU suite on the GPU machine: exit {proc.returncode}, "
                                    f"{time.time() - c0:.0f} s, {a.cpu_workers} xdist workers", "",
                                    *text[-200:]]) + "\n", encoding="utf-8")
        print(f"CPU suite: exit {proc.returncode}; {text[-1] if text else ''}\nwritten: {cpath}")
        paths += [cpath, Path(log.name), run_logs(cpu_base, "cpu-suite-run-logs.tgz")]
        copy_out(paths[3:])
    return 0 if rc == 0 else 1


def interrupt(proc: subprocess.Popen, group: bool, grace_s: float = 25.0) -> None:
    """End a pytest run at its deadline the way Ctrl-C does, so it still prints which tests failed and why
    (on 2026-11-26 a SIGKILL at the deadline lost the summary of 4 failures), then kill what is left."""
    import signal

    try:
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9) if group else proc.kill()
        proc.wait()


def run_logs(basetemp: Path, name: str = "gpu-tier-run-logs.tgz") -> Path:
    """The launches' small text records (rank and torchrun logs, start-up marks, exit records, summaries) as one
    archive."""
    import tarfile

    keep = {"startup.jsonl", "summary.json", "goodput.json", "fleet.json", "metrics.jsonl", "checklist.json"}
    path = Path(tempfile.gettempdir()) / name
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(basetemp.rglob("*")):
            if f.is_file() and (f.name in keep or f.suffix == ".log" or f.parent.name == "exits") \
                    and f.stat().st_size < 4_000_000:
                tar.add(f, arcname=str(f.relative_to(basetemp)))
    return path


def copy_out(paths: list[Path]) -> None:
    """Copy result files to $OUT where it is set (the lent machine returns only what lies there)."""
    if os.environ.get("OUT"):
        for p in paths:
            shutil.copy(p, Path(os.environ["OUT"]) / p.name)


if __name__ == "__main__":
    sys.exit(main())
