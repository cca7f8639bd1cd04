"""End to end: a real run binds only to loopback, writes only inside --out (with the user's umask),
and leaves no secret in its files."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musubi.contract.rendezvous import bind_address, torchrun_module
from musubi.launch.launch import worker_env
from tests.hostile.guard import REPO, listing
from tests.support.pythonpath import repo_on_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_wildcard_rendezvous_host_refused() -> None:
    for host in ("0.0.0.0", "::", "[::]"):
        with pytest.raises(ValueError, match="every interface"):
            bind_address(host)
    assert bind_address("localhost")[1] == "127.0.0.1"


def test_single_node_job_listens_on_loopback_only(tmp_path: Path) -> None:
    out = tmp_path / "listen.json"
    argv = [sys.executable, *torchrun_module(), "--standalone", "--nnodes=1", "--nproc-per-node=2",
            "--max-restarts=0", "-m", "tests.hostile.listen_probe", str(out)]
    env = {**worker_env("cpu", 2, False), "PYTHONPATH": repo_on_path(REPO)}
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    # torchrun's two stores (rendezvous and MASTER_ADDR) and each rank's gloo listener.
    assert len(rec["listening"]) >= 3, rec
    for sock in rec["listening"]:
        assert ipaddress.ip_address(sock["ip"]).is_loopback, f"listening on {sock['ip']}: {rec}"
    assert rec["gloo_ifname"]  # the ranks' own sockets are pinned to the loopback interface


SECRET_VALUES = {"HF_TOKEN": "hf_h13secretvalue1", "MUSUBI_API_TOKEN": "h13secretvalue2",
                 "NVIDIA_API_KEY": "nvapi-h13secretvalue3"}


def test_run_writes_only_inside_out_with_umask_and_no_secrets(tmp_path: Path) -> None:
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for d in (home, cwd, tmp):
        d.mkdir()
    (home / ".bashrc").write_text("# own\n")
    job = cwd / "tiny.yaml"
    job.write_text("name: tiny\ntask: tests.support.tiny_task:make\nmodel: mlp\n"
                   "data: {synthetic: {train_size: 64, val_size: 16}, workers: 0}\n"
                   "train: {epochs: 1, batch: 8, lr: 0.1, log_every: 2}\ncheckpoint: {every_steps: 2}\n")
    out = tmp_path / "runs" / "r1"
    before = listing([tmp_path, REPO], {out})
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TMPDIR")}
    env.update(SECRET_VALUES, HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=repo_on_path(REPO), MUSUBI_DEVICE="cpu",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "musubi.cli", "train", str(job), "--out", str(out), "--nproc", "1",
                           "--device", "cpu", "--no-check"], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=200, preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    after = listing([tmp_path, REPO], {out})
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)
                     and not p.startswith(str(tmp)))  # TMPDIR is the process's own scratch, not the user's files
    # `runs/`, created to hold --out, is the only new entry outside --out.
    assert changed == [str(out.parent)], changed
    # In $TMPDIR (the process's scratch, not the user's files) at most torch's own compiler cache folder.
    assert all(p.name.startswith("torchinductor_") for p in tmp.iterdir()), sorted(tmp.iterdir())
    files = [p for p in out.rglob("*")]
    assert any(p.name == "COMMITTED" for p in files)
    for p in [out, *files]:
        assert p.stat().st_mode & 0o007 == 0, f"{p} ignores the umask: {oct(p.stat().st_mode)}"
    for p in files:
        if p.is_file():
            data = p.read_bytes()
            for name, value in SECRET_VALUES.items():
                assert value.encode() not in data, f"{name}'s value leaked into {p}"
    env_json = json.loads((out / "env.json").read_text())
    assert env_json["env"]["MUSUBI_API_TOKEN"] == "REDACTED"
