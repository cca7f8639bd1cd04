"""`musubi predict MODEL SOURCE`: parse, call musubi.evaluate.predict, print (one line an image, a progress bar)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(Text("error: ", style="bold red") + Text(message), highlight=False)
    raise typer.Exit(EXIT_CONFIG)


def _default_out(model: str) -> Path:
    import datetime as dt

    stem = Path(model.split(":")[0]).name or "model"
    return Path("runs") / "predict" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{Path(stem).stem}"


def predict_command(
    model: str = typer.Argument(..., help="A job directory (RUN/JOB), an exported .onnx or .pt file, or a "
                                "registered NAME[:VERSION] (the promoted version, else the newest)."),
    source: str = typer.Argument(..., help="An image, a folder of images, a quoted glob ('frames/*.jpg') or a "
                                 "video file (its frames; needs PyAV or OpenCV)."),
    out: Path | None = typer.Option(None, "--out", help="Folder for predictions.json (COCO results with class "
                                    "names) and images/ (default runs/predict/<time>-<model>)."),
    checkpoint: str = typer.Option("last", "--checkpoint", help="With a job directory: best (best validation "
                                   "metric recorded at save time), last (the newest) or a step number."),
    conf: float | None = typer.Option(None, "--conf", help="Keep detections scoring at least this (default: all "
                                      "the model reports, as evaluation scores them)."),
    save_images: bool = typer.Option(False, "--save-images", help="Also write each image with its boxes drawn "
                                     "(OUT/images/)."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: a GPU if visible)."),
    db: Path | None = typer.Option(None, "--db", help="Registry database for a registered MODEL (default "
                                   "runs/musubi.db)."),
) -> None:
    """Run a trained, exported or registered model on images, a folder, a glob or a video; COCO results with names."""
    from musubi.evaluate.fps import resolve_device
    from musubi.evaluate.predict import check_request, run_predict
    from musubi.evaluate.predict_sources import resolve_source
    from musubi.evaluate.predictors import load_predictor

    console = Console(soft_wrap=True, highlight=False)
    target = out if out is not None else _default_out(model)
    try:
        frames = resolve_source(source)
        check_request(target, conf, save_images)  # a bad option is refused before the model loads (seconds)
        predictor = load_predictor(model, checkpoint, resolve_device(device), db)
        console.print(Text(f"{predictor.described}: {predictor.recipe.get('task')}, classes "
                           f"{', '.join(predictor.recipe.get('classes') or []) or '-'}; {len(frames)} image(s)"))
        columns = (TextColumn("predict"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        # The same console as the lines: rich prints each line above the live bar (shown on a terminal only).
        with Progress(*columns, console=console, transient=True, disable=len(frames) < 2) as bar:
            task = bar.add_task("predict", total=len(frames))

            def show(result) -> None:  # noqa: ANN001 - an ImageResult
                console.print(Text(result.line()))
                bar.advance(task)

            done = run_predict(predictor, frames, target, conf, save_images, show)
    except ConfigError as e:
        _fail(str(e))
        return
    what = "detections" if done.task == "detection" else "classified images"
    console.print(Text(f"{len(done.rows)} {what} on {len(done.images)} image(s) -> {target / 'predictions.json'}"
                       + (f" and {target / 'images'}/" if save_images else "")))
