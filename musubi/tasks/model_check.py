"""Is a job's model one its task builds? Answered from the generated name table, without torch.

The launcher asks before anything is written (a misspelt model is refused in well under a second);
the tasks ask the same function, so the refusal reads the same from the launcher, a fleet and a rank.
"""

from __future__ import annotations

import difflib

from musubi.contract.errors import ConfigError
from musubi.tasks import model_names

#: Model names with this prefix are built by timm (when it is installed): checked by the classification task.
TIMM_PREFIX = "timm/"
#: torchvision's other model families: named, so a model of one is refused with the reason, not "unknown".
OTHER_FAMILIES = {"detection": "a detection model: set task: detection",
                  "segmentation": "a segmentation model: Musubi trains classification, detection and lm tasks",
                  "video": "a video model: Musubi trains classification, detection and lm tasks",
                  "optical_flow": "an optical-flow model: Musubi trains classification, detection and lm tasks",
                  "quantization": "a quantized model (for inference): train its float model, e.g. "}
#: torchvision detectors the detection task refuses: (what they train on, the same model's box detector).
REFUSED_DETECTORS = {
    "maskrcnn_resnet50_fpn": ("Mask R-CNN trains on instance masks", "fasterrcnn_resnet50_fpn"),
    "maskrcnn_resnet50_fpn_v2": ("Mask R-CNN trains on instance masks", "fasterrcnn_resnet50_fpn_v2"),
    "keypointrcnn_resnet50_fpn": ("Keypoint R-CNN trains on keypoints", "fasterrcnn_resnet50_fpn"),
}
#: The built-in tasks whose models the table lists (a user task, `module:function`, builds its own).
BUILT_IN = ("classification", "detection", "lm")


def suggest(name: str, choices: list[str] | frozenset[str]) -> str:
    """' (did you mean a, b?)' for close matches, else ''."""
    close = difflib.get_close_matches(name, sorted(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def family_of(name: str) -> str | None:
    """The torchvision family (detection, video, ...) that has this model, or None."""
    return next((f for f in OTHER_FAMILIES if name in getattr(model_names, f"TORCHVISION_{f.upper()}")), None)


def check_classifier(name: str) -> None:
    """ConfigError unless `name` is a torchvision classifier (a `timm/` name is the task's to check)."""
    if name.startswith(TIMM_PREFIX) or name in model_names.CLASSIFICATION:
        return
    family = family_of(name)
    if family is not None:
        float_model = name.removeprefix("quantized_") if family == "quantization" else ""
        raise ConfigError(f"model: {name} is {OTHER_FAMILIES[family]}{float_model}")
    raise ConfigError(f"model: unknown classification model {name!r}{suggest(name, model_names.CLASSIFICATION)}; "
                      "any torchvision.models classifier works, or timm models as 'timm/NAME'")


def check_detector(name: str) -> None:
    """ConfigError unless `name` is a built-in detector: why a torchvision builder is refused, else the close
    names (did you mean) and every known one."""
    known = sorted(model_names.DETECTION)
    if name in model_names.DETECTION:
        return
    if name in REFUSED_DETECTORS:
        why, boxes = REFUSED_DETECTORS[name]
        raise ConfigError(f"model: {name} is refused: {why}, which the detection task (boxes only) does not "
                          f"read; did you mean {boxes}, the same model's box detector?")
    if name in model_names.CLASSIFICATION:
        raise ConfigError(f"model: {name} is a classification model; set task: classification, or pick a "
                          f"detector (e.g. fasterrcnn_resnet50_fpn_v2, retinanet_resnet50_fpn_v2)")
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"model: unknown detection model {name!r}{hint}; known: {', '.join(known)}")


def check_lm(name: str) -> None:
    """ConfigError unless `name` is a language model of task lm."""
    if name not in model_names.LM:
        raise ConfigError(f"model: unknown lm model {name!r}{suggest(name, model_names.LM)}; use 'gpt'")


def check_model(task: str, name: str) -> None:
    """The model check of a built-in task (nothing for a user task: it builds its own models)."""
    check = {"classification": check_classifier, "detection": check_detector, "lm": check_lm}.get(task)
    if check is not None:
        check(name)
