"""`musubi data ...`: check, hash, slice, convert, watch and generate data sets (thin: parse, call, print).

Registered by the CLI as `app.add_typer(data_app, name="data")`; nothing heavy is
imported until a command runs. Bad input exits 2 with one line; a data set with
problems exits 1 (`check`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from musubi.contract.errors import ConfigError
from musubi.contract.exits import EXIT_CONFIG, EXIT_FAILED

#: Offenders printed per problem kind on the console (--json lists them all).
CONSOLE_EXAMPLES = 20

data_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Data sets: check, version (hash), split, slice, convert, watch, generate.")
err = Console(stderr=True, soft_wrap=True)


def _usage(message: str) -> None:
    err.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(EXIT_CONFIG)


def existing_store(store: Path) -> Path | None:
    """STORE/musubi.db when it exists: check and hash use the digest cache of a store, never create one."""
    db = store / "musubi.db"
    return db if db.is_file() else None


def coco_source(src: str) -> tuple[Path, Path]:
    """(annotation file, image directory) of SRC: ANN.json, IMAGES_DIR::ANN.json or a folder holding one JSON."""
    from musubi.data.layout import PAIR_SEPARATOR, find_image_dir

    if PAIR_SEPARATOR in src:
        a, b = (Path(p) for p in src.split(PAIR_SEPARATOR, 1))
        return (b, a) if b.suffix.lower() == ".json" else (a, b)
    path = Path(src)
    if path.is_dir():
        from musubi.data.layout import folder_layout

        layout, found = folder_layout(path)
        if layout == "yolo":
            raise ConfigError(f"{src}: a YOLO folder ({found[0].name}), not COCO; "
                              f"convert it first: musubi data convert {src} --to coco --out ANN.json")
        if layout != "coco":
            raise ConfigError(f"{src}: no COCO annotation JSON in it (ROOT/*.json or ROOT/annotations/*.json); "
                              "give ANN.json or IMAGES_DIR::ANN.json")
        path = found[0]
    if not path.is_file():
        raise ConfigError(f"SRC {src}: no such file; give a COCO ANN.json, IMAGES_DIR::ANN.json or a folder "
                          "with one annotation JSON")
    from musubi.data.coco_file import read_annotation_json

    names = [i.get("file_name") for i in read_annotation_json(path)["images"] if isinstance(i, dict)]
    image_dir, tried = find_image_dir(path, (n for n in names if isinstance(n, str)))
    if image_dir is None:
        raise ConfigError(f"{path}: cannot find the image directory (looked in {', '.join(map(str, tried[:4]))}); "
                          f"give IMAGES_DIR{PAIR_SEPARATOR}{path}")
    return path, image_dir


def _reading_json(reading: Any) -> dict[str, Any]:
    return {"path": reading.path, "kind": reading.kind, "image_dir": reading.image_dir, "error": reading.error,
            "fix": reading.fix or None, "counts": reading.counts, "per_class": reading.per_class,
            "seconds": reading.seconds, "pixels": reading.pixels,
            "issues": [{"kind": i.kind, "count": i.count, "files": list(i.examples)} for i in reading.issues]}


def _print_reading(console: Console, reading: Any, title: bool) -> None:
    if title:
        console.print(f"== {reading.path}", highlight=False, markup=False)
    for issue in reading.issues:
        console.print(f"{issue.kind} ({issue.count}):", highlight=False, markup=False)
        for ex in issue.examples[:CONSOLE_EXAMPLES]:
            console.print(f"  {ex}", highlight=False, markup=False)
        if issue.count > CONSOLE_EXAMPLES:
            console.print(f"  ... {issue.count - CONSOLE_EXAMPLES} more (--json lists all)", highlight=False,
                          markup=False)
    if reading.per_class:
        console.print("boxes per class: " + ", ".join(f"{k} {v}" for k, v in reading.per_class.items()),
                      highlight=False, markup=False)
        unused = [k for k, v in reading.per_class.items() if v == 0]
        if unused:
            console.print(f"categories without boxes ({len(unused)}): {', '.join(unused)}", highlight=False,
                          markup=False)
    if reading.pixels:
        from musubi.data.pixels import PixelStats

        console.print(f"pixels (single-channel, data.channels: 1): {PixelStats(**reading.pixels).line()}",
                      highlight=False, markup=False)
    if reading.counts.get("images_without_boxes"):
        console.print(f"images without boxes: {reading.counts['images_without_boxes']} of "
                      f"{reading.counts['images']}", highlight=False, markup=False)


def leaks_between(readings: list[Any], store: Path | None) -> Any:
    """Tiles of one frame and near-identical images across the COCO splits that parsed (musubi.data.leakage)."""
    from musubi.data.coco_file import read_annotation_json
    from musubi.data.leakage import find_leaks, split_images

    coco = [r for r in readings if r.kind == "coco" and r.error is None and r.image_dir]
    stems = [Path(r.path).stem for r in coco]
    images = []
    for r, stem in zip(coco, stems, strict=True):
        label = stem if stems.count(stem) == 1 else str(r.path)  # train/x.png, or the file when names repeat
        images += split_images(label, read_annotation_json(Path(r.path)), Path(r.image_dir))
    return find_leaks(images, store, identical=False)  # byte-identical ones: duplicate_across_splits


def _split_findings(readings: list[Any], store: Path | None) -> tuple[list[Any], list[str], Any]:
    """Each split's results, then what leaks between splits: byte-identical images, tiles of one source frame and
    near-identical images (WARN lines; the lists for --json)."""
    from musubi.preflight.checks.data import check_data
    from musubi.preflight.read.data import across_splits
    from musubi.preflight.result import warn

    results = check_data(readings)
    leaks = across_splits(readings, store) if len(readings) > 1 else []
    if leaks:
        results.append(warn("data.splits", f"{len(leaks)} images are byte-identical across splits "
                                           f"(first: {'; '.join(leaks[:3])})",
                            "remove them from one split (they leak into the score)"))
    frame_leaks = leaks_between(readings, store) if len(readings) > 1 else None
    if frame_leaks is not None and (frame_leaks.same_frame or frame_leaks.near_identical):
        results.append(warn("data.leakage", f"{len(frame_leaks.same_frame)} tiles share a source frame and "
                                            f"{len(frame_leaks.near_identical)} images are near-identical across "
                                            "splits (they leak into the score)",
                            "split by source frame, sequence or site: musubi data split SRC --by frame|folder|FIELD"))
    return results, leaks, frame_leaks


@data_app.command("check")
def check_command(
    paths: list[str] = typer.Argument(..., help="ANN.json, IMAGES_DIR::ANN.json (COCO), a data set folder or a "
                                               "text file; several: splits, train first (categories must agree, "
                                               "no image in two splits)."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON (every offender listed)."),
    allow_warnings: bool = typer.Option(False, "--allow-warnings",
                                        help="Exit 0 when only WARN problems (boxes clipped or dropped) are found."),
    store: Path = typer.Option(Path("runs"), "--store", help="Folder of musubi.db (its image digest cache is used "
                                                             "when it exists; none is created)."),
) -> None:
    """Check a data set: it parses, every image exists and decodes, boxes inside with area, ids, duplicates."""
    from musubi.data.layout import PAIR_SEPARATOR
    from musubi.preflight.read.data import read_data
    from musubi.preflight.result import PreflightReport, Status, render

    for path in paths:
        if PAIR_SEPARATOR not in path and not Path(path).exists():
            _usage(f"PATH {path}: no such file or directory; give ANN.json, IMAGES_DIR::ANN.json, a folder or a file")
    readings = []
    for path in paths:
        reading = read_data(path, examples=10**9, store=existing_store(store))
        if reading.kind in ("ambiguous", "yolo"):
            _usage(f"{reading.error}; {reading.fix}")
        if reading.fix and reading.fix.startswith("give --data "):  # the preflight's option; here it is PATH
            reading = dataclasses.replace(reading, fix="give PATH as " + reading.fix.removeprefix("give --data "))
        readings.append(reading)
    results, leaks, frame_leaks = _split_findings(readings, existing_store(store))
    bad = [r for r in results if r.status is Status.FAIL or (r.status is Status.WARN and not allow_warnings)]
    seconds = round(sum(r.seconds for r in readings), 3)
    if as_json:
        if len(readings) == 1:
            out: dict[str, Any] = {**_reading_json(readings[0]), "ok": not bad}
        else:
            out = {"ok": not bad, "datasets": [_reading_json(r) for r in readings],
                   "duplicate_across_splits": leaks,
                   "same_frame_across_splits": frame_leaks.same_frame if frame_leaks else [],
                   "near_identical_across_splits": frame_leaks.near_identical if frame_leaks else []}
        out["results"] = [r.to_dict() for r in results]
        print(json.dumps(out, indent=1, default=str))
    else:
        console = Console(soft_wrap=True)
        render(PreflightReport(results, seconds), console)
        for reading in readings:
            _print_reading(console, reading, len(readings) > 1)
        for kind, found in (("duplicate_across_splits", leaks),
                            ("same_frame_across_splits", frame_leaks.same_frame if frame_leaks else []),
                            ("near_identical_across_splits", frame_leaks.near_identical if frame_leaks else [])):
            if found:
                console.print(f"{kind} ({len(found)}):", highlight=False, markup=False)
                for ex in found[:CONSOLE_EXAMPLES]:
                    console.print(f"  {ex}", highlight=False, markup=False)
    if bad:
        raise typer.Exit(EXIT_FAILED)


@data_app.command("hash")
def hash_command(
    path: str = typer.Argument(..., help="Data set folder, a COCO ANN.json or IMAGES_DIR::ANN.json "
                                         "(the annotation file plus the images it lists), or a file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: Path = typer.Option(Path("runs"), "--store", help="Folder of musubi.db (its digest cache is used when "
                                                             "it exists; none is created)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Read every byte again (no digest cache)."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Hashing threads (default: 2 per core, <=16)."),
) -> None:
    """The content version of a data set: sha256 over every file's name and bytes."""
    from musubi.data.layout import PAIR_SEPARATOR
    from musubi.data.version import hash_dataset

    try:
        image_dir = None
        target = Path(path)
        if PAIR_SEPARATOR in path:
            a, b = (Path(p) for p in path.split(PAIR_SEPARATOR, 1))
            target, image_dir = (b, a) if b.suffix.lower() == ".json" else (a, b)
        if not target.exists():
            raise ConfigError(f"PATH {target}: no such file or directory; give a data set folder, a COCO ANN.json "
                              "or IMAGES_DIR::ANN.json")
        v = hash_dataset(target, None if no_cache else existing_store(store), workers, image_dir=image_dir)
        pixels = single_channel_stats(path, None if no_cache else existing_store(store)) \
            if target.suffix.lower() == ".json" or target.is_dir() else None
    except ConfigError as e:
        _usage(str(e))
    if as_json:
        print(json.dumps({**v.as_dict(), **({"pixels": pixels.as_dict()} if pixels else {})}))
    else:
        print(f"{v.version}  {v.files} files, {v.bytes / 2**20:.1f} MiB, {v.hashed} read ({v.seconds:.2f} s)")
        if pixels:
            print(f"pixels (single-channel, data.channels: 1): {pixels.line()}")


def single_channel_stats(src: str, store: Path | None) -> Any:
    """PixelStats of a COCO split of single-channel frames (recorded in `store` by version), else None."""
    from PIL import Image

    from musubi.data.coco_file import read_annotation_json
    from musubi.data.pixels import split_pixel_stats
    from musubi.data.single_channel import SINGLE_CHANNEL_MODES

    try:
        ann, images = coco_source(src)
    except ConfigError:
        return None  # not a COCO split (a folder of classes, a text file): no frames to describe
    first = next((i.get("file_name") for i in read_annotation_json(ann)["images"] if isinstance(i, dict)), None)
    if not isinstance(first, str) or not (images / first).is_file():
        return None
    with Image.open(images / first) as im:
        if im.mode not in SINGLE_CHANNEL_MODES:
            return None
    return split_pixel_stats(ann, images, store)[1]


@data_app.command("slice")
def slice_command(
    src: str = typer.Argument(..., help="COCO source: ANN.json, IMAGES_DIR::ANN.json or a folder with one JSON."),
    out: Path = typer.Option(..., "--out", help="Output folder (images/ + annotations.json)."),
    tile: int = typer.Option(640, "--tile", help="Tile side in pixels."),
    overlap: float = typer.Option(0.2, "--overlap", help="Overlap between neighbouring tiles (fraction)."),
    min_visibility: float = typer.Option(0.5, "--min-visibility",
                                         help="Keep a clipped box when at least this fraction of it remains."),
    empty_ratio: float = typer.Option(0.1, "--empty-ratio", help="Fraction of tiles without boxes kept."),
    seed: int = typer.Option(0, "--seed", help="Seed of the empty-tile sampling."),
    as_json: bool = typer.Option(False, "--json", help="Print the report (tiles per image) as JSON."),
) -> None:
    """Cut large frames into overlapping tiles (boxes clipped, tiny remnants dropped) and write a COCO set."""
    from musubi.data.sliced import slice_coco
    from musubi.data.slicing import SliceParams

    try:
        params = SliceParams(tile, overlap, min_visibility, empty_ratio, seed)
        params.check()
        ann, images = coco_source(src)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"--out {out} is not an empty folder; give a new folder (nothing is overwritten)")
        report = slice_coco(ann, images, out, params)
    except ConfigError as e:
        _usage(str(e))
    if as_json:
        print(json.dumps({**vars(report), "worst_case": report.worst_case}))
        return
    counts = sorted(report.tiles_per_image.values())
    print(f"{report.frames} frames -> {report.tiles} tiles ({min(counts)}-{max(counts)} per frame, "
          f"worst case {report.worst_case}); boxes {report.boxes_in} -> {report.boxes_out}; {report.annotations}")


@data_app.command("split")
def split_command(
    src: str = typer.Argument(..., help="COCO source: ANN.json, IMAGES_DIR::ANN.json or a folder with one JSON."),
    out: Path = typer.Option(..., "--out", help="New folder for <name>.json per split (COCO; images stay where "
                                                "they are)."),
    ratios: str = typer.Option("0.8,0.2", "--ratios", help="Share of images per split, e.g. 0.8,0.2 or 0.7,0.15,0.15."),
    names: str | None = typer.Option(None, "--names", help="Split names (default train,val[,test])."),
    by: str = typer.Option("frame", "--by", help="What stays on one side: frame (a `data slice` tile's source "
                                                 "frame), folder (the file name's folder: a sequence or site), "
                                                 "or an image field such as sequence, site or video_id."),
    seed: int = typer.Option(0, "--seed", help="Seed of the group shuffle (same seed, same split)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Split a COCO set by group (frame, folder, any image field); tiles of one frame and copies never straddle."""
    from musubi.data.split import parse_ratios, split_coco

    try:
        shares = parse_ratios(ratios, names)
        if not by or not by.replace("_", "").isalnum():
            raise ConfigError(f"--by {by!r}: give frame, folder or an image field name such as sequence")
        ann, images = coco_source(src)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"--out {out} is not an empty folder; give a new folder (nothing is overwritten)")
        report = split_coco(ann, images, out, shares, by, seed)
    except ConfigError as e:
        _usage(str(e))
    if as_json:
        print(json.dumps(vars(report)))
        return
    print(f"{report.groups} groups by {report.by} (seed {report.seed}; tiles of one frame kept together, "
          f"{report.joined_by_content} more joined as copies or near-copies):")
    for name, part in report.splits.items():
        print(f"  {name}: {part['images']} images, {part['boxes']} boxes, {part['groups']} groups -> "
              f"{images}::{part['annotations']}")
        if part["classes_without_boxes"]:
            print(f"    no boxes of: {', '.join(part['classes_without_boxes'])}")


@data_app.command("convert")
def convert_command(
    src: str = typer.Argument(..., help="COCO source (ANN.json, IMAGES_DIR::ANN.json) or a YOLO folder (data.yaml)."),
    to: str = typer.Option(..., "--to", help="yolo or coco."),
    out: Path = typer.Option(..., "--out", help="A new or empty folder (yolo: the data set; coco: annotations.json, "
                                                "or <split>.json per split), or for coco a new FILE.json."),
    val: str | None = typer.Option(None, "--val", help="--to yolo: the COCO val split (written to images/val)."),
) -> None:
    """Convert COCO to YOLO (images/, labels/, data.yaml) or back."""
    from musubi.data.yolo import coco_to_yolo, yolo_to_coco

    try:
        if to == "yolo":
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise ConfigError(f"--out {out} is not an empty folder; give a new folder (nothing is overwritten)")
            ann, images = coco_source(src)
            counts: dict[str, Any] = coco_to_yolo(ann, images, out, coco_source(val) if val else None)
        elif to == "coco":
            if val:
                raise ConfigError("--val is for --to yolo; a YOLO set's splits come from its data.yaml")
            if not Path(src).is_dir():
                raise ConfigError(f"SRC {src}: not a folder; give the root of a YOLO data set (data.yaml)")
            if out.suffix.lower() == ".json" and out.exists():
                raise ConfigError(f"--out {out} exists; give a new name (nothing is overwritten)")
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise ConfigError(f"--out {out} is not an empty folder; give a new or empty folder, or a new "
                                  "FILE.json (nothing is overwritten)")
            counts = yolo_to_coco(Path(src), out)
        else:
            raise ConfigError(f"--to {to!r}: give yolo or coco")
    except ConfigError as e:
        _usage(str(e))
    numbers = {k: v for k, v in counts.items() if isinstance(v, int)}
    print(f"{out}: " + ", ".join(f"{v} {k}" for k, v in numbers.items()))
    if to == "coco":  # where the images are: the JSON alone does not say
        pairs = [f"{k}: {v}" for k, v in counts.items() if isinstance(v, str) and "::" in v]
        for line in pairs or [f"images: {counts.get('images_dir')}::{counts.get('annotations', out)}"]:
            print(f"  {line}")


def reads_from(spec: Any, data_dir: Path, base: Path) -> bool:
    """Whether any job of the fleet has a data path (images or annotations) under `data_dir`."""
    root = data_dir.resolve()
    for job in getattr(spec, "jobs", []):
        data = getattr(getattr(job, "spec", None), "data", None)
        for split in (getattr(data, "train", None), getattr(data, "val", None)):
            for value in (getattr(split, "path", None), getattr(split, "annotations", None)):
                if not value:
                    continue
                for where in {Path(value).resolve(), (base / value).resolve()}:
                    if where == root or root in where.parents:
                        return True
    return False


@data_app.command("watch")
def watch_command(
    data_dir: Path = typer.Argument(..., help="Folder the labelling tool exports into."),
    fleet: Path = typer.Option(..., "--fleet", help="Fleet YAML started on each new version."),
    interval: float = typer.Option(60.0, "--interval", min=0.0, help="Seconds between polls."),
    once: bool = typer.Option(False, "--once", help="Poll once: start the fleet if the version is new, then exit."),
    settle: float = typer.Option(2.0, "--settle", min=0.0, help="Seconds a version must hold still before it counts."),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where run directories, musubi.db and the state go."),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (as `musubi run`)."),
    cpu_slots: int | None = typer.Option(None, "--cpu-slots", help="Without GPUs: CPU rank slots."),
) -> None:
    """Start FLEET whenever DIR gets a new content version (previous best model first)."""
    from musubi.config.load import load_fleet
    from musubi.data.watch import StartFailed, WatchState, watch
    from musubi.fleet.run import FleetRequest, run_fleet
    from musubi.launch.request import PreflightFailed
    from musubi.store.rundir import default_run_dir

    try:
        if not data_dir.is_dir():
            raise ConfigError(f"DIR {data_dir}: not a folder; give the folder the labelling tool exports into")
        spec = load_fleet(fleet)
        name = spec.name
    except ConfigError as e:
        _usage(str(e))
    if not reads_from(spec, data_dir, fleet.parent):
        err.print(f"warning: no job of {fleet} reads data under {data_dir}; a new version of it retrains "
                  "on other data (point data.train.path / annotations into it)", highlight=False, markup=False)

    def start(version: str) -> str:
        req = FleetRequest(fleet_path=fleet, out=default_run_dir(name, runs), device=device, cpu_slots=cpu_slots,
                           trigger={"data_dir": str(data_dir), "version": version})
        try:
            run_dir, states = run_fleet(req, Console())
        except (ConfigError, PreflightFailed) as e:
            err.print(f"fleet for {version} did not start: {e}", highlight=False, markup=False)
            raise StartFailed(str(e)) from None
        failed = [s.name for s in states.values() if s.state != "done"]
        return f"{run_dir} ({'failed: ' + ', '.join(failed) if failed else 'done'})"

    try:
        watch(data_dir, WatchState(runs / f"watch-{name}.json"), runs / "musubi.db", start, interval_s=interval,
              once=once, settle_s=settle)
    except ConfigError as e:
        _usage(str(e))


@data_app.command("synth")
def synth_command(
    out: Path | None = typer.Option(None, "--out", help="New or empty output folder (images/ + annotations.json)."),
    positional: str | None = typer.Argument(None, hidden=True, help="The old spelling of --out (refused)."),
    images: int = typer.Option(16, "--images", min=1, help="Frames to write."),
    size: str = typer.Option("1920x1080", "--size", help="Frame size WxH."),
    objects: int = typer.Option(12, "--objects", min=0, help="Objects per frame."),
    min_object: int = typer.Option(12, "--min-object", help="Smallest object side (px)."),
    max_object: int = typer.Option(48, "--max-object", help="Largest object side (px)."),
    classes: int = typer.Option(3, "--classes", min=1, help="Object classes."),
    seed: int = typer.Option(0, "--seed", help="Same seed, same bytes."),
    thermal: bool = typer.Option(False, "--thermal", help="Thermal infrared: single-channel radiometric frames "
                                                          "(centikelvin) with warm objects, for data.channels: 1."),
    bits: int = typer.Option(16, "--bits", help="--thermal: 16 or 8 bits per pixel."),
    image_format: str = typer.Option("png", "--format", help="--thermal: png or tiff."),
) -> None:
    """Write a synthetic detection set as real files (JPEG; --thermal: 16-bit PNG/TIFF): small objects on big frames."""
    from musubi.data.synthetic_files import SyntheticFiles, write_synthetic_coco

    if positional is not None:
        _usage(f"give the folder as --out {positional} (every data command names its output with --out)")
    if out is None:
        _usage("give --out DIR: a new or empty folder for images/ and annotations.json")
    try:
        w, _, h = size.lower().partition("x")
        if not (w.isdigit() and h.isdigit()):
            raise ConfigError(f"--size {size!r}: give WIDTHxHEIGHT like 4000x3000")
        params = SyntheticFiles(images, int(w), int(h), classes, objects, min_object, max_object, seed,
                                thermal=thermal, bits=bits, image_format=image_format.lower())
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"--out {out} is not an empty folder; give a new folder (nothing is overwritten)")
        ann = write_synthetic_coco(out, params)
    except ConfigError as e:
        _usage(str(e))
    print(f"{images} frames of {size} -> {ann}")
