"""Pydantic models of a training job: what `musubi train JOB.yaml` reads.

Every field carries a description (it is the documentation of the YAML, shown
by `musubi schema`). This module must not import torch: configs are validated
on the launcher side before any worker process is started.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from musubi.config.success import SuccessSpec

#: Job and run names become directory names: a safe alphabet, no path tricks.
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: Bounds of hostile or mistaken input: a path, a free-text value, a model argument's text.
MAX_PATH_CHARS = 4096
MAX_TEXT_CHARS = 256
#: Seeds, step counts and sizes above this are mistakes (and overflow torch's 64-bit seeds).
MAX_COUNT = 2**62


def check_text(value: str) -> str:
    """Refuse NUL and other control characters (they truncate paths in C and rewrite terminals)."""
    if any(ord(c) < 32 and c not in "\t" or ord(c) == 127 for c in value):
        raise ValueError("must not contain NUL or control characters")
    return value


#: A file or directory path from the config: bounded, no NUL/control characters.
PathStr = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(check_text)]
#: A short free-text value (model name, family): bounded, no control characters.
ShortStr = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS), AfterValidator(check_text)]
ScalarArg = Annotated[
    Annotated[str, Field(max_length=MAX_TEXT_CHARS), AfterValidator(check_text)] | int | float | bool | None,
    Field(),
]


class StrictModel(BaseModel):
    """Base: unknown keys are refused (with a suggestion); NaN and infinity are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def check_safe_name(value: str) -> str:
    """Refuse names that could escape a run directory or break a shell (`../x`, `/etc`, NUL, 65+ chars)."""
    if not SAFE_NAME_RE.fullmatch(value) or value in {".", ".."} or ".." in value:
        raise ValueError(
            "must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


class SyntheticSpec(StrictModel):
    """Generated data, deterministic from `seed` and the sample index (no files needed)."""

    train_size: int = Field(512, ge=1, le=50_000_000, description="Number of training samples.")
    val_size: int = Field(64, ge=0, le=10_000_000, description="Number of validation samples (0: no validation).")
    image_size: int = Field(
        224, ge=16, le=8192, description="Image side in pixels (classification, detection)."
    )
    num_classes: int = Field(10, ge=1, le=100_000, description="Classes (classification, detection).")
    objects: int = Field(4, ge=1, le=512, description="Detection: objects per image.")
    min_object: int = Field(8, ge=2, le=8192, description="Detection: smallest object side in pixels.")
    max_object: int = Field(48, ge=2, le=8192, description="Detection: largest object side in pixels.")
    seq_len: int = Field(128, ge=2, le=1_048_576, description="LM: tokens per sample.")
    vocab: int = Field(256, ge=2, le=1_000_000, description="LM: vocabulary size.")
    on_device: bool = Field(
        False,
        description="Generate a pool of batches once, directly on the rank's device, and cycle it "
        "(no data loader): for benchmarks that must measure the step, not the input pipeline.",
    )
    seed: int = Field(0, ge=0, le=MAX_COUNT, description="Seed of the generator; the same seed gives the same data.")

    @model_validator(mode="after")
    def _object_range(self) -> SyntheticSpec:
        if self.min_object > self.max_object:
            raise ValueError("min_object must be <= max_object")
        return self


class DataSplit(StrictModel):
    """One split on disk: an image folder, a COCO image folder + annotation file, or a text file."""

    path: PathStr = Field(description="Image-folder root, COCO image directory, or (lm) a UTF-8 text file.")
    annotations: PathStr | None = Field(None, description="Detection: COCO annotation JSON for this split.")


class SliceSpec(StrictModel):
    """Cut large frames into overlapping tiles inline (detection, COCO data); see `musubi data slice`."""

    tile: int = Field(640, ge=16, le=8192, description="Tile side in pixels (also the model input side).")
    overlap: float = Field(0.2, ge=0.0, lt=1.0, description="Overlap between neighbouring tiles (fraction).")
    min_visibility: float = Field(
        0.5, gt=0.0, le=1.0, description="Keep a clipped box when at least this fraction of its area remains."
    )
    empty_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Fraction of tiles without boxes kept.")
    seed: int = Field(0, ge=0, description="Seed of the empty-tile sampling (same tiles on every rank).")
    sliced_eval: bool = Field(
        True,
        description="Validate on full frames: predict on their tiles and merge with NMS, so mAP is per frame.",
    )
    nms_iou: float = Field(
        0.5, gt=0.0, le=1.0, description="Overlap threshold of the merge of tile detections (see merge, match_metric)."
    )
    merge: Literal["nmm", "nms"] = Field(
        "nmm",
        description="How tile detections merge: nmm (overlapping boxes become their union, as SAHI) or nms "
        "(the lower-scored box is dropped).",
    )
    inline_train: bool = Field(
        True,
        description="Cut the train split into tiles inline. false: the train split is used as given (tiles "
        "already cut by `musubi data slice`) and only validation is sliced (needs sliced_eval).",
    )
    match_metric: Literal["ios", "iou"] = Field(
        "ios", description="Overlap measure of nmm: ios (intersection over the smaller box) or iou."
    )


class PixelNorm(StrictModel):
    """How single-channel pixels are standardised: (x - mean) / std, in the units the frames store."""

    mean: float = Field(description="Subtracted from every pixel (raw units: counts, centikelvin, ...).")
    std: float = Field(gt=0, description="Divides every pixel after the mean is subtracted.")
    source: str | None = Field(None, max_length=MAX_TEXT_CHARS,
                               description="Where the values came from (filled by the launcher: the split's "
                               "content version and its statistics).")


#: What `data.augment` gives a classifier for each colour field left unset: torchvision's reference recipe and
#: timm's default (ColorJitter 0.4); detection's default is 0 (off), as its earlier releases had it.
CLASSIFY_COLOUR = 0.4
#: The random resized crop's area range a classifier gets when crop_scale is left unset (torchvision, timm).
CLASSIFY_CROP_SCALE = (0.08, 1.0)
#: The crop's aspect-ratio range (width / height) by default (torchvision, timm).
CROP_RATIO = (0.75, 4 / 3)


class AugmentSpec(StrictModel):
    """Training augmentations on the device batch (each off at 0 / null); a field left unset takes the task's
    default, and the resolved config (job.json) records the values used."""

    hflip: float = Field(0.5, ge=0.0, le=1.0, description="Probability of a horizontal flip.")
    crop_scale: tuple[float, float] | None = Field(
        None, description="Classification: random resized crop, a crop of [low, high] of the image's area (and an "
        "aspect ratio in crop_ratio) resized back to the image's size. Unset: [0.08, 1] (torchvision, timm); "
        "null: no crop. Not for detection (a crop cuts boxes): use scale."
    )
    crop_ratio: tuple[float, float] = Field(
        CROP_RATIO, description="Classification: the crop's aspect ratio range (width / height), drawn "
        "log-uniformly."
    )
    scale: tuple[float, float] | None = Field(
        None, description="Detection: scale jitter, each image (and its boxes) resized by a factor drawn uniformly "
        "from [low, high], e.g. [0.75, 1.25]."
    )
    mosaic: float = Field(
        0.0, ge=0.0, le=1.0, description="Detection: probability that a sample becomes a mosaic of itself and the "
        "next three of its batch, one per quadrant around a random centre, at its own size."
    )
    brightness: float | None = Field(
        None, ge=0.0, lt=1.0, description="Colour jitter: brightness x a factor in [1-b, 1+b]. Unset: 0.4 for "
        "classification, 0 for detection. channels 1: a gain on the stored units (0.02 is +-6 K at 300 K)."
    )
    contrast: float | None = Field(
        None, ge=0.0, lt=1.0, description="Colour jitter: contrast about the image's mean x a factor in [1-c, 1+c]. "
        "Unset: 0.4 for classification, 0 for detection."
    )
    saturation: float | None = Field(
        None, ge=0.0, lt=1.0, description="Colour jitter: saturation x a factor in [1-s, 1+s]. Unset: 0.4 for "
        "classification, 0 for detection; refused for channels 1 (one channel has no colour)."
    )

    @field_validator("scale")
    @classmethod
    def _scale_range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not 0.1 <= v[0] <= v[1] <= 10.0:
            raise ValueError(f"scale must be [low, high] with 0.1 <= low <= high <= 10, not {list(v)}")
        return v

    @field_validator("crop_scale")
    @classmethod
    def _crop_scale_range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not 0.0 < v[0] <= v[1] <= 1.0:
            raise ValueError(f"crop_scale must be [low, high] with 0 < low <= high <= 1 (fractions of the image's "
                             f"area), not {list(v)}")
        return v

    @field_validator("crop_ratio")
    @classmethod
    def _crop_ratio_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.1 <= v[0] <= v[1] <= 10.0:
            raise ValueError(f"crop_ratio must be [low, high] with 0.1 <= low <= high <= 10, not {list(v)}")
        return v

    def for_task(self, task: str) -> None:
        """Fill the fields left unset with `task`'s defaults; ValueError for a field the task cannot use."""
        if task == "classification":
            if self.scale is not None or self.mosaic > 0:
                raise ValueError("data.augment.scale and mosaic are detection augmentations (boxes follow the "
                                 "pixels); a classifier crops: use crop_scale (and crop_ratio)")
            if "crop_scale" not in self.model_fields_set:
                self.crop_scale = CLASSIFY_CROP_SCALE
            colour = CLASSIFY_COLOUR
        else:
            if self.crop_scale is not None or self.crop_ratio != CROP_RATIO:
                raise ValueError("data.augment.crop_scale and crop_ratio are classification augmentations (a crop "
                                 "cuts boxes); detection jitters the scale: use scale, e.g. [0.75, 1.25]")
            colour = 0.0
        for name in ("brightness", "contrast", "saturation"):
            if getattr(self, name) is None:
                setattr(self, name, colour)


class DataSpec(StrictModel):
    """Where samples come from: `synthetic:` or `train:` (+ optional `val:`) on disk; neither for a user task that
    brings its own data (its loader fields still apply)."""

    synthetic: SyntheticSpec | None = Field(None, description="Generated data (no files).")
    train: DataSplit | None = Field(None, description="Training split on disk.")
    val: DataSplit | None = Field(None, description="Validation split on disk.")
    image_size: int | None = Field(
        None, ge=16, le=8192, description="Resize on-disk images to this side (classification, detection)."
    )
    seq_len: int = Field(128, ge=2, le=1_048_576, description="LM text files: tokens per sample.")
    max_image_pixels: int | None = Field(
        None, ge=1, le=2**40, description="Refuse on-disk images with more pixels than this (decompression "
        "bombs), read from the header before decoding; default PIL's limit (89,478,485)."
    )
    workers: int | Literal["auto", "measure"] | None = Field(
        None, description="Data-loader worker processes per rank (0-64); unset: 2, or fewer on a rank of fewer "
        "than 3 cores (cores minus one: the default never oversubscribes; the rank's first log line says what it "
        "chose); or `auto`: the rank's cores (pinned, else "
        "its share of the machine's) minus one for the training loop, at most 16 (see train.pin_cpus); or "
        "`measure`: time the real loader at 1, 2, 4, ... up to the `auto` count at start and keep the smallest "
        "count within 5% of the best rate.")
    pin_memory: bool = Field(True, description="Pin host batches for faster copies to the GPU.")
    prefetch: int = Field(4, ge=1, le=64, description="Batches each loader worker prepares ahead.")
    persistent_workers: bool = Field(True, description="Keep loader workers (and their caches) between epochs.")
    gpu_decode: bool | Literal["auto"] = Field(
        "auto", description="Detection, COCO files: workers only read the file bytes and the rank's device "
        "decodes the batch (nvJPEG: torchvision.io.decode_jpeg on a list); what nvJPEG cannot read (PNG, 16-bit, "
        "CMYK JPEG) is decoded on the host, image by image, counted in a warning. auto: on when the rank trains "
        "on CUDA and most files are JPEG; false: workers decode (PIL)."
    )
    jpeg_decoder: Literal["auto", "hardware", "cuda"] = Field(
        "auto", description="With device decode (gpu_decode), what decodes the JPEG files on a CUDA rank: auto: the "
        "GPU's hardware JPEG engines (A100, H100, H200) through nvImageCodec where it is installed (`pip install "
        "'musubi-train[hwdecode]'`), else nvJPEG on the SMs (torchvision); hardware: the same, warning in one line "
        "when the engines cannot be used; cuda: nvJPEG on the SMs. Images the engines refuse go to nvJPEG, the rest "
        "to the host. A CPU rank decodes on the host. The feeder's log line and summary.json (loader.decoded) "
        "name the decoder used."
    )
    augment: AugmentSpec | None = Field(
        None, description="Training augmentations (classification, detection), applied to the batch on the rank's "
        "device (box-correct; seeded per sample from train.seed, the epoch and the sample, so a resumed run sees "
        "the same batches). Off unless given; `augment: {}` is the task's default recipe."
    )
    cache: Literal["off", "auto", "on"] = Field(
        "auto", description="With slice: keep decoded tiles in shared RAM (auto: when they fit in half of the "
        "free memory), so each frame is decoded about once per run."
    )
    slice: SliceSpec | None = Field(None, description="Tile large frames inline (detection, COCO data).")
    channels: Literal[1, 3] = Field(
        3, description="Channels of the frames: 3 (RGB, 8-bit) or 1 (single-channel: thermal infrared, greyscale; "
        "8- and 16-bit PNG/TIFF and float TIFF read without loss). Detection, COCO data.")
    one_channel: Literal["stem", "replicate"] = Field(
        "stem", description="channels 1: stem (the model's first convolution takes one channel; RGB start weights "
        "are summed over their channels) or replicate (the channel is copied three times; the model stays RGB).")
    normalize: PixelNorm | None = Field(
        None, description="channels 1: pixels become (x - mean) / std. Unset: filled at launch from the train "
        "split's statistics, computed once per dataset version and kept in musubi.db (`musubi data hash` prints "
        "them), so job.json records the values used.")
    classes: dict[ShortStr, ShortStr | None] | None = Field(
        None, max_length=10_000,
        description="Detection, COCO data: class map applied as the annotations are read, source category "
        "name -> new name (rename; several to one name: merge) or null (drop: its boxes become background). "
        "Unlisted categories are kept; part of the dataset version. E.g. {Dead: tree, Alive: tree, Clutter: null}."
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if self.synthetic is not None and (self.train is not None or self.val is not None):
            raise ValueError("data.synthetic and data.train/val are exclusive: choose one source")
        if isinstance(self.workers, int) and not 0 <= self.workers <= 64:
            raise ValueError("workers must be 0..64 or auto")
        if self.slice is not None and self.synthetic is not None:
            raise ValueError("slice cuts frames on disk (data.train); synthetic data has no frames to cut")
        if self.gpu_decode is False and self.jpeg_decoder != "auto":
            raise ValueError(f"jpeg_decoder: {self.jpeg_decoder} chooses the device's JPEG decoder, but gpu_decode: false "
                             "decodes in the loader workers (PIL): set gpu_decode: true or auto, or remove jpeg_decoder")
        if self.slice is not None and self.image_size is not None:
            raise ValueError("slice cuts frames at their own resolution; unset image_size (the tile is the input)")
        if self.slice is not None and not self.slice.inline_train and not self.slice.sliced_eval:
            raise ValueError("slice.inline_train: false slices only validation; set slice.sliced_eval: true "
                             "or remove data.slice")
        if self.classes is not None and self.synthetic is not None:
            raise ValueError("classes maps the categories of COCO files; synthetic data has none: remove data.classes")
        if self.classes is not None and not self.classes:
            raise ValueError("classes is empty; map at least one category or remove data.classes")
        if self.channels == 1:
            if self.synthetic is not None:
                raise ValueError("channels 1 reads single-channel files; synthetic data is RGB: write a thermal set "
                                 "with `musubi data synth --out OUT --thermal` and train on it")
            if self.gpu_decode is True:
                raise ValueError("gpu_decode decodes JPEG (RGB); single-channel frames (channels 1) are PNG/TIFF: "
                                 "set gpu_decode: false")
            if self.jpeg_decoder != "auto":
                raise ValueError("jpeg_decoder chooses the device's JPEG decoder; single-channel frames (channels 1) "
                                 "are decoded by the workers: remove jpeg_decoder")
            if self.augment is not None and self.augment.saturation:
                raise ValueError("data.augment.saturation needs colour; single-channel frames (channels 1) have "
                                 "one channel: remove saturation (brightness and contrast apply)")
            if self.slice is not None and self.slice.inline_train:
                raise ValueError("channels 1 with inline slicing: cut the tiles offline (`musubi data slice` keeps "
                                 "16-bit pixels) and set slice.inline_train: false")
        elif self.normalize is not None or self.one_channel != "stem":  # resolved configs carry the default
            raise ValueError("normalize and one_channel apply to single-channel frames; set channels: 1 or remove them")
        if self.augment is not None and self.synthetic is not None and self.synthetic.on_device:
            raise ValueError("augment needs a data loader; synthetic.on_device cycles fixed batches: set "
                             "synthetic.on_device: false or remove data.augment")
        return self


class EarlyStopSpec(StrictModel):
    """Stop training when the validation metric stops improving (patience counted in validations)."""

    patience: int = Field(
        ge=1, le=100_000, description="Validations in a row without improvement after which training stops (one a "
        "epoch under eval_every 1). Training ends with that validation and a checkpoint of its weights."
    )
    min_delta: float = Field(
        0.0, ge=0.0, le=1e9, description="An improvement is a change beyond the best value so far by more than this, "
        "in the metric's units (e.g. 0.005 top1)."
    )
    metric: ShortStr | None = Field(
        None, description="Validation metric watched; default: the task's primary metric (top1, map50, val_acc, a "
        "user task's primary_metric)."
    )
    mode: Literal["max", "min"] | None = Field(
        None, description="Whether larger or smaller is better; default: min for a metric named ...loss, else max."
    )

    def mode_for(self, metric: str) -> str:
        """The direction of improvement of `metric`: `mode`, else min for a loss and max otherwise."""
        return self.mode or ("min" if metric.endswith("loss") else "max")


class TrainSpec(StrictModel):
    """The optimisation: batch, LR rule, precision, strategy and loop lengths."""

    epochs: int = Field(1, ge=1, le=100_000, description="Passes over the training set.")
    max_steps: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Stop after this many optimizer steps (across epochs), if given."
    )
    batch: int | Literal["auto"] = Field(
        16,
        description="Per-rank micro-batch (samples per forward), or `auto`: probe the largest that fits on "
        "every rank (real forward+backward+optimizer steps), agree on the minimum, cache the result.",
    )
    global_batch: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="If set, the per-rank batch is derived: global_batch / (world x accumulation), "
        "which must divide exactly.",
    )
    accumulation: int = Field(1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description="Optimizer.")
    lr: float = Field(0.01, gt=0, le=10, description="Learning rate: the one used, unless a scaling rule is "
                      "opted into (base_batch or lr_rule), then the one tuned at `base_batch` global samples.")
    base_batch: int | None = Field(
        None, ge=1, le=1_000_000_000, description="The global batch `lr` was tuned for. Setting it opts into "
        "scaling the LR with the global batch (lr_rule linear unless lr_rule says sqrt or none); None: `lr` is "
        "used as written at any global batch.",
    )
    lr_rule: Literal["linear", "sqrt", "none"] = Field(
        "none", description="How the LR follows the global batch G: lr x (G/base_batch)^1 (linear), ^0.5 (sqrt) "
        "or unchanged (none). Default: none, or linear when `base_batch` is given; linear and sqrt need "
        "`base_batch`. When a rule applies, the first line `musubi train` prints says the arithmetic.",
    )
    warmup_steps: int = Field(0, ge=0, le=MAX_COUNT, description="Linear LR warmup, in optimizer steps.")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="LR after warmup.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (AdamW: beta1).")
    weight_decay: float = Field(1e-4, ge=0, le=1, description="Weight decay.")
    grad_clip: float | None = Field(None, gt=0, le=1e6, description="Clip the global gradient norm to this value.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto",
        description="Autocast dtype: bf16, fp16 (with a gradient scaler) or fp32. `auto`: bf16 on GPU (fp16 "
        "where the GPU has no bf16), fp32 on CPU ranks. Any of them follows evidence: a non-finite loss restarts "
        "the job from its last good checkpoint one precision safer (fp16 -> bf16 -> fp32); the precision it "
        "ended in is recorded (eval.json, fleet.json, leaderboard, manifest).",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp: replicate; fsdp: shard parameters, grads and optimizer state (FSDP2)."
    )
    channels_last: bool = Field(False, description="Use channels-last memory format for image models.")
    seed: int = Field(0, ge=0, le=MAX_COUNT, description="Seed of model init and sampling.")
    deterministic: bool = Field(
        False,
        description="Deterministic kernels; a run stopped and resumed gives bitwise the same weights.",
    )
    log_every: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Log scalars (metrics.jsonl, console) every N optimizer steps. None: "
        "every total_steps // 20 steps, 1 to 10, so a short run's curve still has 20 points (or one a step) and a "
        "long one logs every 10 steps; in a pipe (CI, a log file: no progress bar) the console then shows about 5 "
        "step lines of a short run, one each 50 steps of a long one.",
    )
    eval_every: int = Field(1, ge=1, le=MAX_COUNT, description="Validate every N epochs (and at the end).")
    early_stop: EarlyStopSpec | None = Field(
        None, description="Stop early when the validation metric has not improved for `patience` validations, "
        "e.g. {patience: 5, min_delta: 0.001}; every rank takes rank 0's value, so all stop at the same step. "
        "Unless checkpoint.keep_best is set it becomes 1 (ranked by the watched metric): the best weights stay."
    )
    bn_recalibrate: int = Field(
        16, ge=0, le=100_000, description="Before each validation, recompute BatchNorm running statistics at the "
        "current weights from this many training micro-batches per rank (forward only, averaged over ranks; "
        "the checkpoint keeps them): the running averages lag the weights, and a short or high-LR run "
        "validated at chance without it. 0: validate with the running averages as trained. Models without "
        "BatchNorm skip it.",
    )
    timeout_s: int = Field(600, ge=10, le=86_400, description="Timeout of collectives, in seconds.")
    headroom: float = Field(
        0.10, ge=0.0, lt=0.9, description="`batch: auto`: fraction of GPU memory left free by the probed batch."
    )
    oom_policy: Literal["keep_global_batch", "halve_global_batch"] = Field(
        "keep_global_batch",
        description="After an out-of-memory error: halve the micro-batch and double accumulation (same "
        "optimizer batch and LR), or halve the global batch and rescale the LR by `lr_rule`.",
    )
    min_batch: int = Field(4, ge=1, le=1_000_000, description="OOM recovery never goes below this per-rank micro-batch.")
    pin_cpus: bool = Field(
        True,
        description="Pin each rank and its data-loader workers to CPU cores of its own, nearest its GPU "
        "(NUMA-aware; no core shared between ranks, nor between jobs of a fleet); intra-op threads follow "
        "the cores. false: ranks float over all cores.",
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Coordinated restarts of all ranks (torchrun) after a rank fails or OOMs."
    )
    warm_spare: bool = Field(
        True,
        description="Start torchrun's agent and each rank (and each restart of it) by forking a warm spare that "
        "imported torch and the rank's modules once per launch and node, instead of a new interpreter (seconds "
        "saved per rank and restart). They start the plain way when the spare is not ready or refuses; false: "
        "always the plain way (an environment switch turns it off for every launch; docs/guides/checkpoints.md, "
        "Warm starts).",
    )

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1_000_000:
            raise ValueError("must be between 1 and 1000000, or auto")
        return v

    @model_validator(mode="after")
    def _lr_as_written_unless_scaled(self) -> TrainSpec:
        # The LR a user writes is the LR used: the old default (linear from base_batch 64) trained
        # `lr: 1e-3` at 5e-4 on a global batch of 32 and said so only in --dry-run. Naming base_batch
        # opts into the linear rule; a rule without base_batch has nothing to scale from.
        if "base_batch" in self.model_fields_set and self.base_batch is not None and \
                "lr_rule" not in self.model_fields_set:
            self.lr_rule = "linear"
        if self.lr_rule != "none" and self.base_batch is None:
            raise ValueError(f"lr_rule {self.lr_rule} scales lr from the global batch it was tuned at: set "
                             "train.base_batch to that batch, or lr_rule: none to train at lr as written")
        return self

    @model_validator(mode="after")
    def _auto_batch(self) -> TrainSpec:
        if self.batch == "auto" and self.global_batch is not None:
            raise ValueError("batch: auto and global_batch exclude each other; drop one")
        if self.batch == "auto" and self.strategy == "fsdp":
            raise ValueError("batch: auto probes replicated (ddp) jobs; give a number for strategy fsdp")
        return self


class CheckpointSpec(StrictModel):
    """When checkpoints are written and how many are kept."""

    every_steps: Annotated[int, Field(ge=1, le=MAX_COUNT)] | Literal["auto"] | None = Field(
        None, description="Checkpoint every N optimizer steps; None: at the end of each epoch; auto: the interval "
        "that loses least to saves and faults (Young/Daly from the measured save cost and the job's fault rate, "
        "re-chosen at every save; docs/guides/checkpoints.md, Cadence)."
    )
    mtbf_s: float | None = Field(
        None, gt=0, le=1e12, description="every_steps auto: the mean seconds between faults until the job's own "
        "history has one; None: Llama 3's published rate (419 interruptions in 54 days on 16,384 GPUs: one per "
        "1.8e8 GPU-seconds) over this job's rank count."
    )
    max_interval_s: float = Field(
        1800.0, gt=0, le=1e7, description="every_steps auto: never more than this many seconds of training between "
        "checkpoints (nor more than an epoch), however rare the faults."
    )
    keep_last: int = Field(3, ge=1, le=1000, description="Committed checkpoints kept (older ones deleted).")
    keep_best: int = Field(
        0, ge=0, le=1000, description="Also keep the N committed checkpoints with the best `best_metric` "
        "(validation value at save time), whatever their age."
    )
    best_metric: str | None = Field(
        None, description="Validation metric ranking `keep_best` (default: the task's primary metric)."
    )
    best_mode: Literal["max", "min"] = Field("max", description="Whether a larger or smaller `best_metric` is better.")
    async_mode: Literal["auto", "process", "thread", "off"] = Field(
        "auto",
        description="Asynchronous save (DCP async_save): the step waits only for the copy to host memory. "
        "auto: process-based on GPU ranks where the installed torch offers it, else thread (CPU ranks); "
        "off: synchronous saves.",
    )
    enabled: bool = Field(True, description="Write checkpoints at all.")

    @field_validator("async_mode", mode="before")
    @classmethod
    def _off_is_false(cls, v: Any) -> Any:
        """YAML 1.1 (PyYAML, and so `--set`) reads a bare `off` as False: take it as "off"."""
        return "off" if v is False else v


class TrackingSpec(StrictModel):
    """Experiment trackers rank 0 mirrors metrics.jsonl to (metrics.jsonl is always written)."""

    tensorboard: bool = Field(True, description="TensorBoard event files in JOB/tensorboard (when installed).")
    mlflow: bool = Field(False, description="Log params and metrics to MLflow (the `mlflow` extra: mlflow-skinny).")
    mlflow_uri: str | None = Field(
        None, max_length=2048, description="MLflow tracking URI (http(s)://, databricks, file:); None: a local "
        "file store in RUN/mlruns.")
    mlflow_experiment: str | None = Field(
        None, max_length=256, description="MLflow experiment name; None: the fleet's or job's name.")


class TelemetrySpec(StrictModel):
    """Per-rank step spans, hardware sampling and live straggler warnings (JOB/telemetry/)."""

    enabled: bool = Field(True, description="Record spans, sample GPU/CPU and watch for stragglers.")
    sample_hz: float = Field(2.0, ge=0.1, le=10, description="NVML/psutil samples per second.")
    straggler_threshold: float | None = Field(
        None, gt=0, le=1,
        description="Flag a rank whose pre-sync step time exceeds the other ranks' by this fraction of a step, "
        "clearly above the step-to-step noise (default 0.05 on GPUs, 0.07 on CPU ranks, which share the host's "
        "cores).",
    )


class WatchdogSpec(StrictModel):
    """Hang detection: every rank's progress is watched by a thread outside the training loop."""

    enabled: bool = Field(True, description="Watch every rank's heartbeat; on a hang dump stacks and end the "
                          "attempt (torchrun restarts it).")
    floor_s: float = Field(
        120.0, ge=1, le=86_400, description="The hang timeout is never shorter than this (seconds)."
    )
    factor: float = Field(
        10.0, ge=1, le=1000, description="Hang timeout = max(floor_s, factor x the slowest recent step)."
    )


class EvalSpec(StrictModel):
    """How validation scores the model."""

    max_detections: int | None = Field(
        None, ge=1, le=1_000_000, description="Detection: detections per image and class that mAP scores (the top "
        "ones by score). Unset: every detection the model returns, so a dense scene is never capped by the metric "
        "(COCO's own cap of 100 scores a frame of 279 trees' ground truth mAP50 0.356); 100 gives COCO's numbers. "
        "The model's own cap still applies (model_args box_detections_per_img, detections_per_img or "
        "max_detections): eval.json records both.")


#: Musubi's own tasks, and a model name each for the error that asks for one.
BUILTIN_TASKS = ("classification", "detection", "lm")
EXAMPLE_MODEL = {"classification": "resnet18", "detection": "fasterrcnn_mobilenet_v3_large_320_fpn", "lm": "gpt"}


class JobSpec(StrictModel):
    """One training job: a task (model + data + loss + metric) and how to train it."""

    name: str = Field(max_length=64, description="Job name; becomes the job's directory name.")
    task: str = Field(
        max_length=MAX_TEXT_CHARS,
        description="classification, detection, lm, or a user task as `module:function`."
    )
    model: ShortStr | None = Field(
        None, validate_default=True, description="Model name within the task (e.g. resnet50, fcos_resnet50_fpn, "
        "gpt); required by the built-in tasks. A user task builds its own model: leave it out, or give a name the "
        "task reads (spec.model).")
    model_args: dict[Annotated[str, Field(max_length=64)], ScalarArg] = Field(
        default_factory=dict, max_length=64, description="Keyword arguments for the model constructor."
    )
    weights: PathStr | None = Field(
        None, description="Start weights: a local weights file (loaded strictly), or torchvision's pretrained "
        "weights of the model by name (DEFAULT, an enum member such as COCO_V1 or IMAGENET1K_V2, or "
        "ResNet50_Weights.IMAGENET1K_V2) read from $TORCH_HOME/hub/checkpoints and transferred (the head is "
        "left fresh). Nothing is downloaded.")
    data: DataSpec = Field(
        None, validate_default=True, description="Data source (synthetic: or train:/val:) and how it is loaded; "
        "required by the built-in tasks. A user task that reads its own data leaves it out (or gives only the "
        "loader's fields: workers, prefetch, ...); its datasets are its own.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Optimisation.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    success: SuccessSpec = Field(default_factory=SuccessSpec, description="Success criteria the run checks "
                                 "itself against (RUN/checklist.json).")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="TensorBoard / MLflow logging.")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec, description="Telemetry (spans, sampler).")
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec, description="Hang detection.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Validation scoring (mAP's detections per image).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_safe_name(v)

    @property
    def builtin(self) -> bool:
        """Whether the task is one of Musubi's (classification, detection, lm), not a user's `module:function`."""
        return self.task in BUILTIN_TASKS

    @property
    def own_data(self) -> bool:
        """A user task that reads its own data: `data:` names no source (the datasets are the task's)."""
        return not self.builtin and self.data.synthetic is None and self.data.train is None

    def model_label(self) -> str:
        """The model in words for lines and messages: its name, or "the task's own model" (a user task's)."""
        return self.model or "the task's own model"

    # Only a user task builds its own model and reads its own data: a built-in one needs both named. Field
    # validators (run on the defaults too), so the one-line error names the field.
    @field_validator("model")
    @classmethod
    def _built_in_task_needs_a_model(cls, v: str | None, info: ValidationInfo) -> str | None:
        task = info.data.get("task")
        if v is None and task in BUILTIN_TASKS:
            raise ValueError(f"task {task} needs a model name, e.g. model: {EXAMPLE_MODEL[task]}; only a user task "
                             "(`module:function`) builds its own")
        return v

    @field_validator("data", mode="before")
    @classmethod
    def _data_section_or_none(cls, v: Any) -> Any:
        return {} if v is None else v  # left out: the loader's defaults, no source (a user task's own data)

    @field_validator("data")
    @classmethod
    def _built_in_task_needs_data(cls, v: DataSpec, info: ValidationInfo) -> DataSpec:
        task = info.data.get("task")
        if v.synthetic is None and v.train is None and task in BUILTIN_TASKS:
            raise ValueError(f"task {task} needs a source: data.synthetic or data.train (+ data.val); only a user "
                             "task (`module:function`) reads its own")
        return v

    @model_validator(mode="after")
    def _classes_need_coco(self) -> JobSpec:
        if self.data.classes is not None and self.task in ("classification", "lm"):
            raise ValueError(f"data.classes maps COCO categories (detection); task {self.task} does not read "
                             "them: remove data.classes")
        if self.data.augment is not None:
            if self.task not in ("classification", "detection"):
                raise ValueError(f"data.augment is for the built-in classification and detection tasks; task "
                                 f"{self.task} does not use it: remove data.augment")
            self.data.augment.for_task(self.task)
        return self

    @model_validator(mode="after")
    def _early_stop_needs_validation(self) -> JobSpec:
        early = self.train.early_stop
        if early is None:
            return self
        data = self.data
        no_val = (data.synthetic.val_size == 0) if data.synthetic is not None else data.val is None
        if no_val and self.task in ("classification", "detection", "lm"):
            raise ValueError("train.early_stop watches a validation metric and this job has no validation split: "
                             "add data.val (or synthetic.val_size > 0) or remove train.early_stop")
        ck = self.checkpoint
        # Patience means the last weights are not the best ones: keep the best checkpoint unless told otherwise.
        if "keep_best" not in ck.model_fields_set:
            ck.keep_best = max(ck.keep_best, 1)
        if early.metric is not None and "best_metric" not in ck.model_fields_set:
            ck.best_metric = early.metric
            if "best_mode" not in ck.model_fields_set:
                ck.best_mode = early.mode_for(early.metric)  # type: ignore[assignment]
        return self

    @model_validator(mode="after")
    def _max_detections_need_detection(self) -> JobSpec:
        if self.eval.max_detections is not None and self.task in ("classification", "lm"):
            raise ValueError(f"eval.max_detections caps detection mAP; task {self.task} has none: remove it")
        return self

    @model_validator(mode="after")
    def _channels_need_detection(self) -> JobSpec:
        if self.data.channels == 1 and self.task != "detection":
            raise ValueError(f"data.channels 1 feeds single-channel frames to detection models; task {self.task} "
                             "reads RGB: set task: detection or data.channels: 3")
        return self

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        if v in BUILTIN_TASKS:
            return v
        if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            return v
        close = difflib.get_close_matches(v.lower(), ["classification", "detection", "lm"], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"must be classification, detection, lm, or `package.module:function`{hint}")

    def resolved(self) -> dict[str, Any]:
        """The job as plain JSON-able data (what run.json/job.json record)."""
        return self.model_dump(mode="json")
