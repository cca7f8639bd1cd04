"""The hostile-input corpus: every attack ends in its own refusal, with nothing outside a scratch folder touched.

Config attacks are files in `corpus/jobs` and `corpus/fleets` (first line: `# expect: REGEX`),
run through the real CLI (`musubi train` / `musubi run`). Data sets, checkpoints, weights,
names and report strings are built per case below. Each case runs under a `Guard`: a
listing of the repository, HOME and the test folder outside `scratch` must be identical
afterwards, and no payload may have created `outside/pwned`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from musubi.cli import app
from musubi.contract.errors import ConfigError
from tests.hostile.guard import Guard

CORPUS = Path(__file__).parent / "corpus"


@pytest.fixture
def guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Guard whose HOME and TMPDIR are scratch folders; checked after the case."""
    g = Guard(tmp_path)
    monkeypatch.setenv("HOME", str(g.home))
    monkeypatch.setenv("TMPDIR", str(g.scratch / "tmp"))
    yield g
    g.check()


def expectation(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode("utf-8")
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


def one_error_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


# -- configs through the CLI ------------------------------------------------------
@pytest.mark.parametrize("path", sorted((CORPUS / "jobs").glob("*.yaml")), ids=lambda p: p.stem)
def test_hostile_job_file(path: Path, guard: Guard) -> None:
    out = guard.scratch / "out"
    code, output = cli("train", str(path), "--out", str(out), "--device", "cpu", "--no-check")
    assert code == 2, output
    assert re.search(expectation(path), one_error_line(output)), output
    assert not out.exists()


@pytest.mark.parametrize("path", sorted((CORPUS / "fleets").glob("*.yaml")), ids=lambda p: p.stem)
def test_hostile_fleet_file(path: Path, guard: Guard) -> None:
    out = guard.scratch / "out"
    code, output = cli("run", str(path), "--out", str(out), "--device", "cpu", "--no-check")
    assert code == 2, output
    assert re.search(expectation(path), one_error_line(output)), output
    assert not out.exists()


GOOD_JOB = CORPUS / "good_job.yaml"


@pytest.mark.parametrize(("override", "expect"), [
    ("name=../../outside/victim.txt", r"name: must be 1-64 characters"),
    ("name=/etc/cron.d/x", r"name: must be 1-64 characters"),
    ("train.lr=.nan", r"train\.lr: .*finite number"),
    ("train.workers=4", r"unknown key train\.workers"),
], ids=["set_name_parent", "set_name_absolute", "set_lr_nan", "set_unknown_key"])
def test_hostile_override(override: str, expect: str, guard: Guard) -> None:
    out = guard.scratch / "out"
    code, output = cli("train", str(GOOD_JOB), "--set", override, "--out", str(out), "--device", "cpu", "--no-check")
    assert code == 2 and re.search(expect, one_error_line(output)), output
    assert not out.exists()


def test_oversized_job_file(guard: Guard) -> None:
    big = guard.scratch / "big.yaml"
    big.write_text("name: t\n" + "# padding\n" * 120_000, encoding="utf-8")
    code, output = cli("train", str(big), "--out", str(guard.scratch / "out"), "--no-check")
    assert code == 2 and "larger than 1048576 bytes" in one_error_line(output)


def test_too_many_jobs(guard: Guard) -> None:
    fleet = guard.scratch / "fleet.yaml"
    fleet.write_text("name: f\njobs:\n" + "".join(f"  - {{name: j{i}, command: ['true']}}\n" for i in range(1001)),
                     encoding="utf-8")
    code, output = cli("run", str(fleet), "--out", str(guard.scratch / "out"), "--no-check")
    assert code == 2 and "1001 jobs, more than 1000" in one_error_line(output)


def test_error_line_prints_markup_literally(guard: Guard) -> None:
    code, output = cli("train", str(guard.scratch / "[red]x[/red].yaml"), "--no-check")
    assert code == 2 and "[red]x[/red].yaml: no such file" in one_error_line(output)


# -- datasets ---------------------------------------------------------------------
def png_with_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a bomb that is a few bytes on disk)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def coco(g: Guard, images: dict[str, bytes] | None = None, doc: dict | str | bytes | None = None,
         file_name: str = "a.png") -> tuple[Path, Path]:
    """A COCO set in scratch: image files and an annotation file (a dict, or raw text/bytes)."""
    from PIL import Image

    img_dir = g.scratch / "images"
    img_dir.mkdir(exist_ok=True)
    if images is None:
        Image.new("RGB", (64, 48), (10, 20, 30)).save(img_dir / "a.png")
    for name, data in (images or {}).items():
        (img_dir / name).write_bytes(data)
    if doc is None:
        doc = {"images": [{"id": 1, "file_name": file_name, "width": 64, "height": 48}],
               "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 10, 10]}],
               "categories": [{"id": 1, "name": "person"}]}
    ann = g.scratch / "ann.json"
    if isinstance(doc, dict):
        ann.write_text(json.dumps(doc), encoding="utf-8")
    else:
        ann.write_bytes(doc.encode() if isinstance(doc, str) else doc)
    return img_dir, ann


def _coco_dataset(g: Guard, **kw) -> object:
    from musubi.data.coco import CocoDetection

    max_pixels = kw.pop("max_pixels", None)
    img_dir, ann = coco(g, **kw)
    return CocoDetection(img_dir, ann, max_image_pixels=max_pixels)


def _coco_item(g: Guard, **kw) -> object:
    return _coco_dataset(g, **kw)[0]  # type: ignore[index]


def _symlink_image(g: Guard) -> object:
    img_dir, ann = coco(g, images={})
    (img_dir / "a.png").symlink_to(g.outside / "victim.txt")
    from musubi.data.coco import CocoDetection

    return CocoDetection(img_dir, ann)


def _symlink_class_folder(g: Guard) -> object:
    from PIL import Image

    from musubi.tasks.classification import image_folder

    root = g.scratch / "folder"
    (root / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(root / "cat" / "1.png")
    Image.new("RGB", (8, 8)).save(g.outside / "secret.png")
    (root / "dog").mkdir()
    (root / "dog" / "2.png").symlink_to(g.outside / "secret.png")
    g.rebaseline()
    return image_folder(str(root), None, 8)


def _folder_bomb(g: Guard) -> object:
    from musubi.tasks.classification import image_folder

    root = g.scratch / "folder"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "bomb.png").write_bytes(png_with_header(100_000, 100_000))
    return image_folder(str(root), None, 8)[0]


DEEP_JSON = "[" * 100_000 + "]" * 100_000
DATA_CASES: dict[str, tuple[Callable[[Guard], object], str]] = {
    "coco_not_json": (lambda g: _coco_dataset(g, doc="{images: nope"), r"ann\.json: not valid JSON \(line 1"),
    "coco_deep_json": (lambda g: _coco_dataset(g, doc=DEEP_JSON), r"JSON nested too deeply to parse"),
    "coco_huge_int": (lambda g: _coco_dataset(g, doc='{"images": [' + "9" * 5000 + "]}"),
                      r"unreadable JSON value"),
    "coco_not_utf8": (lambda g: _coco_dataset(g, doc=b'{"images": "\xff\xfe"}'), r"not UTF-8 text"),
    "coco_top_level_list": (lambda g: _coco_dataset(g, doc="[1, 2]"), r"top level is not a JSON object"),
    "coco_parent_file_name": (lambda g: _coco_dataset(g, file_name="../outside/victim.txt"),
                              r"escapes the image directory"),
    "coco_absolute_file_name": (lambda g: _coco_dataset(g, file_name="/etc/passwd"), r"escapes the image directory"),
    "coco_windows_file_name": (lambda g: _coco_dataset(g, file_name="..\\..\\outside\\victim.txt"),
                               r"escapes the image directory"),
    "coco_nul_file_name": (lambda g: _coco_dataset(g, file_name="a.png\0.jpg"), r"empty or non-string file_name"),
    "coco_id_overflow": (lambda g: _coco_dataset(g, doc={"images": [{"id": 2**64, "file_name": "a.png"}],
                                                         "annotations": [], "categories": []}),
                         r"images\[0\] has no integer 'id'"),
    "coco_symlink_escape": (_symlink_image, r"outside the data set .*a symlink leaves it"),
    "coco_decompression_bomb": (lambda g: _coco_item(g, images={"a.png": png_with_header(100_000, 100_000)}),
                                r"over the \d+ pixel limit"),
    "coco_over_configured_max": (lambda g: _coco_item(g, max_pixels=1000),
                                 r"64x48 pixels, over the 1000 pixel limit.*data\.max_image_pixels"),
    "coco_garbage_image": (lambda g: _coco_item(g, images={"a.png": b"\x89PNG\r\n\x1a\nnot really"}),
                           r"cannot read image"),
    "folder_symlink_escape": (_symlink_class_folder, r"outside the data set"),
    "folder_decompression_bomb": (_folder_bomb, r"over the \d+ pixel limit"),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_hostile_dataset(case: str, guard: Guard) -> None:
    make, expect = DATA_CASES[case]
    with pytest.raises(ConfigError) as info:
        make(guard)
    message = str(info.value)
    assert "\n" not in message and re.search(expect, message), message


# -- checkpoints and weights -----------------------------------------------------
class Payload:
    """Unpickling this runs a shell command that creates `outside/pwned`."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.target}",))


def committed_checkpoint(root: Path, extra: dict | None = None) -> Path:
    """A DCP checkpoint with a valid COMMITTED marker, as Musubi lays it out (step 1)."""
    import torch.distributed.checkpoint as dcp

    from musubi.checkpoint.committed import MARKER, listing

    d = root / "checkpoints" / "step-000000001"
    d.mkdir(parents=True)
    state = {"model": torch.nn.Linear(3, 4).state_dict(), **(extra or {})}
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(d))
    (d / "state.json").write_text("{}", encoding="utf-8")
    recommit(d)
    assert (d / MARKER).is_file() and listing(d)
    return d


def recommit(d: Path) -> None:
    """Rewrite the marker to match the files (what an attacker who edits a checkpoint would do)."""
    from musubi.checkpoint.committed import MARKER, listing

    (d / MARKER).write_text(json.dumps({"step": 1, "world_size": 1, "files": listing(d)}), encoding="utf-8")


def _ckpt_metadata_payload(g: Guard) -> object:
    from musubi.checkpoint.checkpoint import read_full_state

    d = committed_checkpoint(g.scratch)
    (d / ".metadata").write_bytes(pickle.dumps(Payload(g.pwned)))
    recommit(d)
    return read_full_state(d)


def _ckpt_bytes_payload(g: Guard) -> object:
    from musubi.checkpoint.checkpoint import read_full_state

    d = committed_checkpoint(g.scratch, {"extra": Payload(g.pwned)})
    return read_full_state(d)


def _ckpt_shard_escape(g: Guard) -> object:
    from musubi.checkpoint.checkpoint import read_full_state
    from musubi.checkpoint.safe_dcp import safe_unpickle

    d = committed_checkpoint(g.scratch)
    meta = safe_unpickle((d / ".metadata").read_bytes())
    for info in meta.storage_data.values():
        info.relative_path = "../../../outside/victim.txt"
    (d / ".metadata").write_bytes(pickle.dumps(meta))
    recommit(d)
    return read_full_state(d)


def _ckpt_symlinked_step(g: Guard) -> object:
    from musubi.checkpoint.checkpoint import latest_checkpoint, read_full_state

    real = committed_checkpoint(g.outside / "elsewhere")
    link_root = g.scratch / "job" / "checkpoints"
    link_root.mkdir(parents=True)
    (link_root / real.name).symlink_to(real, target_is_directory=True)
    g.rebaseline()
    assert latest_checkpoint(link_root) is None  # never picked for a resume
    return read_full_state(link_root / real.name)


def _ckpt_symlinked_shard(g: Guard) -> object:
    from musubi.checkpoint.checkpoint import read_full_state

    d = committed_checkpoint(g.scratch)
    shard = next(d.glob("*.distcp"))
    moved = g.scratch / "moved.distcp"
    shard.rename(moved)
    shard.symlink_to(moved)
    return read_full_state(d)


def _weights_payload(g: Guard) -> object:
    from musubi.tasks.weights import read_state_dict

    p = g.scratch / "w.pt"
    torch.save({"weight": Payload(g.pwned)}, p)
    return read_state_dict(p)


def _weights_garbage(g: Guard) -> object:
    from musubi.tasks.weights import read_state_dict

    p = g.scratch / "w.pt"
    p.write_bytes(b"PK\x03\x04 definitely not a zip")
    return read_state_dict(p)


def _weights_not_state_dict(g: Guard) -> object:
    from musubi.tasks.weights import read_state_dict

    p = g.scratch / "w.pt"
    torch.save([torch.zeros(2)], p)
    return read_state_dict(p)


def _weights_shape_mismatch(g: Guard) -> object:
    from musubi.tasks.weights import load_weights

    p = g.scratch / "w.pt"
    torch.save(torch.nn.Linear(3, 5).state_dict(), p)
    model = torch.nn.Linear(3, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return load_weights(model, p)
    finally:  # refused before the model was touched
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


CKPT_CASES: dict[str, tuple[Callable[[Guard], object], str]] = {
    "dcp_metadata_payload": (_ckpt_metadata_payload,
                             r"cannot be loaded \(.*checkpoint metadata refused .*posix\.system is not allowed"),
    "dcp_bytes_payload": (_ckpt_bytes_payload, r"cannot be loaded \(a checkpoint entry is not plain data: it would "
                          r"unpickle posix\.system, refused by weights_only loading"),
    "dcp_shard_outside": (_ckpt_shard_escape, r"names shard '\.\./\.\./\.\./outside/victim\.txt' outside its directory"),
    "dcp_symlinked_step": (_ckpt_symlinked_step, r"not a committed, intact checkpoint"),
    "dcp_symlinked_shard": (_ckpt_symlinked_shard, r"not a committed, intact checkpoint"),
    "weights_payload": (_weights_payload, r"cannot load it safely \(it would unpickle posix\.system"),
    "weights_garbage": (_weights_garbage, r"cannot load it safely"),
    "weights_not_state_dict": (_weights_not_state_dict, r"not a state_dict of tensors"),
    "weights_shape_mismatch": (_weights_shape_mismatch,
                               r"does not fit model Linear: .*shape mismatch \(weight file \[5, 3\] vs model \[4, 3\]"),
}


@pytest.mark.parametrize("case", sorted(CKPT_CASES))
def test_hostile_checkpoint(case: str, guard: Guard) -> None:
    make, expect = CKPT_CASES[case]
    with pytest.raises(ConfigError) as info:
        make(guard)
    message = str(info.value)
    assert "\n" not in message and re.search(expect, message), message


# -- names, report strings and secrets --------------------------------------------
HOSTILE_STRINGS = ["[red]x[/red]", "<script>alert(1)</script>", "[link=file:///etc/passwd]y[/link]", "\x1b[2Jz"]


def test_leaderboard_prints_hostile_strings_literally(guard: Guard) -> None:
    from musubi.evaluate.leaderboard_view import leaderboard_table

    rows = [{"rank": i + 1, "job": s, "model": s, "metric": s, "reason": s} for i, s in enumerate(HOSTILE_STRINGS)]
    console = Console(record=True, width=400, color_system=None)
    console.print(leaderboard_table({"formula": "[bold]f", "rows": rows}))
    text = console.export_text()
    for s in HOSTILE_STRINGS[:3]:
        assert s in text
    assert "[bold]f" in text


def test_registry_refuses_hostile_model_name(guard: Guard) -> None:
    from musubi.evaluate.registry import register

    job = guard.scratch / "run" / "job"
    job.mkdir(parents=True)
    (job / "model.onnx").write_bytes(b"onnx")
    with pytest.raises(ConfigError, match=r"model name '\.\./\.\./outside': must be 1-64 characters"):
        register(job, name="../../outside", db=guard.scratch / "musubi.db")
    assert not (guard.scratch / "musubi.db").exists()


SECRETS = {"MUSUBI_HF_TOKEN": "hf_abcdefsecret1", "NVIDIA_API_KEY": "nvapi-secret2", "NCCL_IB_PASSWORD": "pw-secret3",
           "CUDA_AUTH": "secret4-auth", "MASTER_ADDR": "http://admin:secret5@10.0.0.1"}


def test_env_json_redacts_credentials(guard: Guard, monkeypatch: pytest.MonkeyPatch) -> None:
    from musubi.store.rundir import env_record

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    rec = env_record()
    text = json.dumps(rec)
    assert not re.search(r"secret\d", text), text
    assert rec["env"]["NVIDIA_API_KEY"] == "REDACTED" and rec["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert rec["env"]["MASTER_ADDR"] == "http://admin:REDACTED@10.0.0.1"


def test_run_json_redacts_argv_and_command_env(guard: Guard) -> None:
    from musubi.store.rundir import run_record

    config = {"jobs": [{"name": "ext", "command": ["x"], "env": {"WANDB_API_KEY": "secret6", "SEED": "3"}}]}
    rec = run_record(config, ["musubi", "train", "j.yaml", "--set", "model_args.api_key=secret7", "--token",
                              "secret8", "--hub-token=secret9", "https://u:secret0@host/x"])
    text = json.dumps(rec)
    assert not re.search(r"secret\d", text), text
    assert rec["config"]["jobs"][0]["env"]["SEED"] == "3"


def test_preflight_readings_redact_credentials(guard: Guard) -> None:
    from musubi.preflight.read.machine import read_env
    from musubi.topology.nvml import NvmlReading

    reading = read_env(1, NvmlReading(available=False), {"NCCL_NET_TOKEN": "secret1", "CUDA_VISIBLE_DEVICES": "0"})
    assert reading.variables == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_NET_TOKEN": "REDACTED"}


def test_logs_scrub_secret_values(guard: Guard, monkeypatch: pytest.MonkeyPatch) -> None:
    from musubi.store.redact import ScrubFilter

    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue42")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ScrubFilter())
    log = logging.getLogger("musubi.test.scrub")
    log.addHandler(handler)
    try:
        log.warning("request failed with token %s", "hf_secretvalue42")
    finally:
        log.removeHandler(handler)
    assert "hf_secretvalue42" not in stream.getvalue() and "REDACTED(HF_TOKEN)" in stream.getvalue()


def test_corpus_is_large_enough() -> None:
    files = len(list((CORPUS / "jobs").glob("*.yaml"))) + len(list((CORPUS / "fleets").glob("*.yaml")))
    assert files + 4 + 2 + len(DATA_CASES) + len(CKPT_CASES) + 7 >= 50


def test_command_job_gets_argv_explicit_env_and_its_own_folder(guard: Guard, monkeypatch: pytest.MonkeyPatch) -> None:
    from musubi.config.fleet import CommandJob
    from musubi.fleet.jobs import command_launch

    monkeypatch.setenv("HF_TOKEN", "hf_not_for_the_job")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    job = CommandJob(name="ext", command=["prog", "a; rm -rf ~", "$(touch pwned)"], env={"SEED": "1"})
    launch = command_launch(job, guard.scratch / "run", [0], "cpu", guard.scratch)
    assert launch.argv == ["prog", "a; rm -rf ~", "$(touch pwned)"]  # an argv list: no shell sees it
    assert launch.cwd == guard.scratch / "run" / "ext"
    assert "HF_TOKEN" not in launch.env and "LD_PRELOAD" not in launch.env and launch.env["SEED"] == "1"
    assert launch.env["MUSUBI_JOB_DIR"] == str((guard.scratch / "run" / "ext").resolve())


@pytest.fixture
def one_rank_world(monkeypatch: pytest.MonkeyPatch):
    """A real one-rank gloo group in this process (what a resume runs inside)."""
    import socket

    from musubi.contract.world import init_world, shutdown_world

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    world = init_world(30, "cpu")
    yield world
    shutdown_world()


@pytest.mark.timeout(60)
def test_resume_refuses_another_models_checkpoint_before_touching_the_model(guard: Guard, one_rank_world) -> None:
    from musubi.checkpoint import checkpoint as ck

    def make(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(width)
        m = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))
        return m, torch.optim.SGD(m.parameters(), lr=0.1)

    root = guard.scratch / "checkpoints"
    saved, opt = make(8)
    rng = {"cpu": torch.zeros(4, dtype=torch.uint8)}
    ck.save_checkpoint(root, 1, saved, opt, {"step": 1, "signature": "forged"}, rng, one_rank_world, keep_last=2)
    found = ck.latest_checkpoint(root)
    assert found is not None
    target, target_opt = make(5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ConfigError, match=r"checkpoint is of another model \(signature forged != "):
        ck.load_checkpoint(found, target, target_opt, rng, one_rank_world, ck.model_signature(target))
    # A lying marker (the attacker forged the signature): DCP's plan-time size check still refuses.
    with pytest.raises(ConfigError, match=r"cannot be loaded \(.*Size mismatch"):
        ck.load_checkpoint(found, target, target_opt, rng, one_rank_world, "forged")
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items()), "the model was overwritten"
