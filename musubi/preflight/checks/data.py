"""Data checks: every dataset exists and parses, every image decodes, every box lies inside its image."""

from __future__ import annotations

from musubi.preflight.readings import DataIssue, DataReading
from musubi.preflight.result import CheckResult, Status, fail, passed

#: Offenders named on a result's line (`musubi data check` lists the rest below it).
LINE_EXAMPLES = 3
#: (status, what the count means, fix) per issue kind. FAIL: training would crash or refuse; WARN: it
#: silently changes the data (drops or clips boxes).
ISSUES: dict[str, tuple[Status, str, str]] = {
    "missing": (Status.FAIL, "images listed in the annotations are missing",
                "fix the image directory or the annotation file"),
    "undecodable": (Status.FAIL, "images do not decode", "replace or remove them (and their annotations)"),
    "mixed_channels": (Status.FAIL, "images are multi-channel in a set of single-channel frames",
                       "export every frame single-channel (8/16-bit greyscale PNG/TIFF) or drop those"),
    "empty_class": (Status.FAIL, "class folders hold no images",
                    "add images or remove the folders (ImageFolder refuses empty classes)"),
    "duplicate_image_id": (Status.FAIL, "image ids are used twice", "give each image a unique id"),
    "unknown_image": (Status.FAIL, "annotations refer to an image id that is not listed",
                      "add the image or remove the annotations"),
    "unknown_category": (Status.FAIL, "annotations refer to an unknown category",
                         "add the category or fix the category_id"),
    "bad_category_entry": (Status.FAIL, "categories have no integer id", "give each category an integer 'id'"),
    "duplicate_category_id": (Status.FAIL, "category ids are used twice", "give each category a unique id"),
    "bad_image_entry": (Status.FAIL, "image entries are not objects with an integer id",
                        "give each image an integer 'id'"),
    "bad_file_name": (Status.FAIL, "image file_names are empty or escape the image directory",
                      "use a path relative to the image directory without '..'"),
    "bad_annotation_entry": (Status.FAIL, "annotations are not JSON objects", "fix or remove those entries"),
    "bad_bbox": (Status.FAIL, "annotations have no [x, y, w, h] bbox of numbers", "fix or remove those entries"),
    "duplicate_annotation_id": (Status.WARN, "annotation ids are used twice",
                                "give each annotation a unique id (COCO evaluation tools need it)"),
    "duplicate_file_name": (Status.WARN, "file names are listed twice", "list each image once: it trains twice"),
    "duplicate_image": (Status.WARN, "images are byte-identical copies of another",
                        "remove the copies (they double-count and leak between splits)"),
    "empty_box": (Status.WARN, "boxes have zero or negative width/height", "fix them: training drops them"),
    "box_outside": (Status.WARN, "boxes extend outside their image", "fix them: training clips them"),
    "duplicate_box": (Status.WARN, "boxes repeat another box exactly (same image, category and bbox)",
                      "remove the copies (they double the loss and count twice in evaluation)"),
    "duplicate_category_name": (Status.WARN, "category names are used by more than one id",
                                "merge the categories or rename one (reports by name mix them)"),
    "exif_rotated": (Status.WARN, "images carry an EXIF rotation that training does not apply",
                     "write the rotation into the pixels (e.g. PIL ImageOps.exif_transpose) and re-export the "
                     "annotations, or annotate the stored orientation"),
    "size_mismatch": (Status.WARN, "images differ from their declared width/height",
                      "re-export the annotations: boxes may be for another resolution"),
}


def _of(issue: DataIssue, reading: DataReading) -> str:
    total = reading.counts.get("annotations" if "box" in issue.kind or issue.kind in ("unknown_image",
                               "unknown_category", "duplicate_annotation_id", "bad_annotation_entry") else
                               "categories" if "category" in issue.kind else
                               "classes" if issue.kind == "empty_class" else "images")
    return f"{issue.count} of {total}" if total is not None else f"{issue.count}"


def check_dataset(reading: DataReading) -> list[CheckResult]:
    """One dataset: its structural error, or one line per kind of problem, or a PASS with its counts."""
    name = f"data.{reading.kind}"
    results = []
    if reading.error is not None:
        results.append(fail(name, reading.error, reading.fix or "fix the dataset"))
    for issue in reading.issues:
        status, what, fix = ISSUES.get(issue.kind, (Status.WARN, issue.kind, "fix the dataset"))
        first = "; ".join(issue.examples[:LINE_EXAMPLES])
        results.append(CheckResult(name, status, f"{reading.path}: {_of(issue, reading)} {what} (first: {first})", fix))
    if not results and reading.error is None:
        c = reading.counts
        if reading.kind == "coco":
            found = (f"{reading.path}: {c['images']} images, {c['boxes']} boxes, {c['categories']} categories; "
                     "every image decodes, every box inside its image")
        elif reading.kind == "image_folder":
            found = f"{reading.path}: {c['images']} images in {c['classes']} classes; every image decodes"
        else:
            found = f"{reading.path}: {c.get('bytes', 0)} bytes of UTF-8 text"
        results.append(passed(name, f"{found} ({reading.seconds:.1f} s)"))
    return results


def check_splits(readings: list[DataReading]) -> list[CheckResult]:
    """Later splits use only the first split's categories/classes (labels are mapped from the first)."""
    out = []
    for kind in ("coco", "image_folder"):
        ok = [r for r in readings if r.kind == kind and r.error is None]
        for later in ok[1:]:
            extra = [c for c in later.categories if c not in ok[0].categories]
            if extra:
                word = "categories" if kind == "coco" else "classes"
                out.append(fail(f"data.{kind}", f"{later.path} has {word} not in {ok[0].path}: {', '.join(extra[:5])}",
                                f"use the same {word} in every split"))
    return out


def check_data(readings: list[DataReading]) -> list[CheckResult]:
    """Every --data target, then agreement between splits."""
    results: list[CheckResult] = []
    for r in readings:
        results += check_dataset(r)
    return results + check_splits(readings)
