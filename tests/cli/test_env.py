"""`musubi env`: one paste-able block (versions, GPUs, topology, training variables)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from musubi.cli import app
from tests.support.pythonpath import repo_on_path


def test_env_block_and_json(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    res = CliRunner().invoke(app, ["env"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("musubi ") and "torch: " in res.output and "gpus: none visible" in res.output
    assert "NCCL_DEBUG=WARN" in res.output and "UNRELATED_SECRET" not in res.output
    rec = json.loads(CliRunner().invoke(app, ["env", "--json"]).output)
    assert rec["env"]["NCCL_DEBUG"] == "WARN" and "UNRELATED_SECRET" not in rec["env"]


def test_env_prints_the_version_once_and_packages_as_a_table() -> None:
    import re

    import musubi

    out = CliRunner().invoke(app, ["env"]).output
    assert len(re.findall(re.escape(musubi.__version__), out.split("packages:")[0])) == 1, out
    assert "{" not in out, out  # no Python dict
    rows = out.split("packages:\n")[1].splitlines()
    assert rows[0].split() == ["musubi-train", musubi.__version__]
    assert any(r.split()[0] == "torch" for r in rows if r.startswith("  "))


def test_env_record_reads_torchvision_without_importing_it() -> None:
    """Importing torchvision costs seconds (its model zoo); env.json's version string must not."""
    import os
    import subprocess
    import sys

    import torchvision  # here, where the suite has usually imported it already: the probe's process need not

    from tests.conftest import REPO

    probe = ("import sys; from musubi.store.rundir import torchvision_version as v; got = v();"
             "print('imported:', 'torchvision' in sys.modules); print(got)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=repo_on_path(REPO)))
    # the same interpreter and site-packages: the probe read the version this process imported
    assert res.stdout.split() == ["imported:", "False", torchvision.__version__], res.stdout + res.stderr


def test_env_names_musubi_where_it_runs_from_a_checkout(monkeypatch) -> None:
    """On the GPU machine Musubi runs from PYTHONPATH (no internet, no install): no distribution, still its row."""
    from importlib import metadata

    import musubi

    real = metadata.version

    def version(name: str) -> str:
        if name == "musubi-train":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    rows = CliRunner().invoke(app, ["env"]).output.split("packages:\n")[1].splitlines()
    assert rows[0].split() == ["musubi-train", musubi.__version__]
