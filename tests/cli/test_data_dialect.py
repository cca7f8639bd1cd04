"""One dialect in `musubi data`: outputs named by --out, a new or empty folder accepted where the docs say so,
what convert prints is what `data check` reads, and advice that can work."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from musubi.cli import app
from tests.data.sets import small_set

runner = CliRunner()


def _yolo(tmp_path: Path) -> Path:
    ann = small_set(tmp_path / "coco", images=2)
    res = runner.invoke(app, ["data", "convert", str(ann), "--to", "yolo", "--out", str(tmp_path / "yolo")])
    assert res.exit_code == 0, res.output
    return tmp_path / "yolo"


def test_convert_to_coco_takes_an_empty_folder_or_a_name_and_prints_what_check_reads(tmp_path: Path) -> None:
    yolo = _yolo(tmp_path)
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "plain-name", tmp_path / "file.json"):
        res = runner.invoke(app, ["data", "convert", str(yolo), "--to", "coco", "--out", str(out)])
        assert res.exit_code == 0, res.output
        pair = res.output.strip().splitlines()[-1].split(": ", 1)[1]  # "images: IMAGES_DIR::ANN.json"
        assert pair.endswith(".json") and Path(pair.split("::")[1]).is_file(), res.output
        check = runner.invoke(app, ["data", "check", pair, "--json"])
        assert check.exit_code == 0 and json.loads(check.output)["ok"], check.output
    # nothing is overwritten: a folder that holds something, or an existing FILE.json
    for out in (tmp_path / "empty", tmp_path / "file.json"):
        res = runner.invoke(app, ["data", "convert", str(yolo), "--to", "coco", "--out", str(out)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_split_of_one_frames_tiles_says_what_can_work(tmp_path: Path) -> None:
    ann = small_set(tmp_path / "frames", images=1, width=512, height=384, objects=12)
    res = runner.invoke(app, ["data", "slice", str(ann), "--tile", "256", "--overlap", "0.2", "--empty-ratio", "1",
                              "--out", str(tmp_path / "tiles")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["data", "split", str(tmp_path / "tiles" / "annotations.json"), "--out",
                              str(tmp_path / "split"), "--by", "folder"])
    assert res.exit_code == 2 and "tiles of 1 source frame(s)" in res.output and "finer key" not in res.output, \
        res.output
    assert not (tmp_path / "split").exists()


def test_usage_errors_are_one_error_line_like_every_other_error() -> None:
    for args in (["train"], ["train", "job.yaml", "--nprc", "2"], ["data", "synth", "--imges", "2"]):
        res = runner.invoke(app, args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, res.output)
        assert "--help`)" in lines[0] and "╭" not in res.output


def test_registry_help_names_every_subcommand_and_tables_fit_a_pipe() -> None:
    import typer

    subs = ("list", "register", "promote", "demote", "manifest", "rebuild")
    group = typer.main.get_command(app).commands["registry"]
    assert sorted(group.commands) == sorted(subs) and all(sub in group.help for sub in subs), group.help
    from musubi.cli.output import PIPE_WIDTH, out_console

    assert out_console().width == PIPE_WIDTH  # CliRunner's stdout is not a terminal: a pipe's width, not 80


def test_shell_completion_is_offered() -> None:
    res = runner.invoke(app, ["--help"], terminal_width=200)
    assert "--install-completion" in res.output and "--show-completion" in res.output
