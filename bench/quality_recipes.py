"""The quality bench's recipes (bench/quality.py): each model's training, identical on both sides, and the
cost figures that only plan the time."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from bench import quality_data


@dataclass(frozen=True)
class Recipe:
    """One model's training, identical on both sides; the cost figures only plan the time."""

    key: str
    label: str
    task: str
    model: str
    model_args: dict[str, Any]
    image_size: int
    epochs: int
    global_batch: int
    optimizer: str
    lr: float
    weight_decay: float
    warmup_steps: int
    metric: str
    floor: float  # the plain loop's mean must reach this for the comparison to mean anything
    momentum: float = 0.9
    grad_clip: float | None = None
    log_every: int = 10
    eval_every: int | None = None  # epochs between validations (None: at the end only); both sides alike
    #: Planning only, seconds on one H100/H200 with the GPU to itself (BENCHMARKS.md figures, see COSTS):
    #: a training step at the global batch on one GPU; the share of it that scales with a rank's images
    #: (the rest is per-step launch and host work, the same at any rank count); the start (process, imports,
    #: data sets, model; Musubi's launcher, torchrun and first step) and exit; one validation.
    gpu_step_s: float = 0.1
    gpu_image_share: float = 0.5
    gpu_fixed_s: dict[str, float] = field(default_factory=lambda: {"plain": 15.0, "musubi": 30.0})
    gpu_eval_s: float = 3.0
    #: Per step on one CPU rank of this 2-core machine at the rehearsal's sizes (its rehearsal of these recipes, load
    #: 12-15: resnet18 1.7 s, Faster R-CNN 38 s, RT-DETR 54 s at 16 images); the start-up there is ~25 s (plain) and
    #: ~55 s (Musubi) with the validation.
    cpu_step_s: float = 1.0


#: The cost figures (planning only) are the means of what bench/quality_plan.calibrate reads from two calls on
#: 2x H200: the 27 runs at 4 epochs, 4 runs a GPU (bench/results/quality-2026-11-28-2xH200-2c8e561-wip.json) and
#: the detectors' 10 finished runs at 8 epochs, 2 a GPU (quality-2026-11-28-2xH200-6c906c8.json): start-up and
#: exit (wall less train_s), a step and a validation with the GPU to itself (the GPU part deflated by the sharing
#: each run met). Replayed through the plan, they predict every finished run of both calls within 15 %
#: (tests/evaluate/test_quality_bench.py). A 2-GPU Musubi step of these detectors is ~0.9 of a 1-GPU one (the
#: image share 0.22), not the half a rank's batch would suggest: per-step launch and host work dominate.
RECIPES: dict[str, Recipe] = {r.key: r for r in (
    # 1438 train digits / 64 = 22 steps an epoch x 15 = 330 steps; measured (2c8e561-wip, 4 a GPU): a run 18-21 s
    # (plain), 34-43 s (Musubi 1 GPU), 38-40 s (2 GPUs); 330 steps launch-bound (no gain from half a batch a rank).
    Recipe("classifier", "resnet18 classifier, digits 32 px", "classification", "resnet18", {}, 32, epochs=15,
           global_batch=64, optimizer="sgd", lr=0.1, weight_decay=5e-4, warmup_steps=20, metric="top1",
           floor=0.9, eval_every=3, gpu_step_s=0.017, gpu_image_share=0.0,
           gpu_fixed_s={"plain": 7.1, "musubi": 26.6}, gpu_eval_s=0.25, cpu_step_s=1.7),
    # 800 scenes / 16 = 50 steps an epoch. torchvision's MobileNetV3-Large 320 FPN builder at its own input
    # size, 320 px: the 256 px scenes are upscaled by the model's transform (both sides), so the digits meet its
    # anchors (32-512 px) and its stride-16 map is 20 x 20 (at 160 px on 160 px scenes, session 19, 300 steps of
    # 32, its mAP50 spread over 0.13-0.46 by seed). The zoo's RPN sampling sizes, twice its proposals and RoIs
    # for 8-16 digits an image; AdamW, clipping at 10. At 4 epochs (2c8e561-wip) mAP50 was still rising by 0.1-0.2
    # an epoch at the end and spread over 0.35-0.72 by seed: 6 here. At 8 epochs, 2 a GPU (6c906c8): a run
    # 111-123 s (plain), 132-140 s (Musubi 1 GPU), 125 s (2 GPUs), mAP50 0.93-0.96.
    Recipe("cnn_detector", "Faster R-CNN MobileNetV3-320 FPN at 320 px, digit scenes 256 px", "detection",
           "fasterrcnn_mobilenet_v3_large_320_fpn",
           {"min_size": 320, "max_size": 320, "rpn_pre_nms_top_n_train": 600, "rpn_post_nms_top_n_train": 200,
            "rpn_pre_nms_top_n_test": 300, "rpn_post_nms_top_n_test": 200, "rpn_batch_size_per_image": 128,
            "box_batch_size_per_image": 128},
           256, epochs=6, global_batch=16, optimizer="adamw", lr=1.5e-3, weight_decay=1e-4, warmup_steps=30,
           metric="map50", floor=0.3, grad_clip=10.0, eval_every=2, gpu_step_s=0.20, gpu_image_share=0.22,
           gpu_fixed_s={"plain": 11.7, "musubi": 27.8}, gpu_eval_s=1.35, cpu_step_s=38.0),
    # 800 scenes / 16 = 50 steps an epoch. transformers' RT-DETR with ResNet-18 (Musubi's `rtdetr_r18`
    # preset; the plain loop builds the same config from transformers), 100 queries, at the scenes' 256 px.
    # The zoo's recipe (AdamW 4e-4 at 16, clipping at 0.1 as DETR recipes do): mAP50 0.73 after 300 steps
    # of 16 there. At 4 epochs (2c8e561-wip) mAP50 was ~0 at 100 steps, 0.26-0.77 at 150, 0.39-0.82 at 200: 6 here.
    # At 8 epochs, 2 a GPU (6c906c8): a run 131-132 s (plain), 155-157 s (Musubi 1 GPU), 139 s (2 GPUs), mAP50
    # 0.91-0.96.
    Recipe("detr", "RT-DETR r18 (transformers), digit scenes 256 px", "detection", "rtdetr_r18",
           {"num_queries": 100}, 256, epochs=6, global_batch=16, optimizer="adamw", lr=4e-4, weight_decay=1e-4,
           warmup_steps=30, metric="map50", floor=0.3, grad_clip=0.1, eval_every=2, gpu_step_s=0.225,
           gpu_image_share=0.22, gpu_fixed_s={"plain": 14.4, "musubi": 37.2}, gpu_eval_s=1.0, cpu_step_s=54.0),
    # Not in the default run: the other DETR family Musubi ships, transformers' D-FINE-N (HGNetV2-B0, 4 M
    # parameters), the same recipe (the zoo's D-FINE-N, AdamW 4e-4 at 16, reached mAP50 0.91 after 300 steps of
    # 16 at 160 px on thermal frames, session 5). Costs: unmeasured here; the zoo's D-FINE-N stepped 0.24 s alone
    # against RT-DETR's ~0.25 at 160 px, so RT-DETR's figures, a step 7 % shorter.
    Recipe("dfine", "D-FINE-N (transformers), digit scenes 256 px", "detection", "dfine_n",
           {"num_queries": 100}, 256, epochs=6, global_batch=16, optimizer="adamw", lr=4e-4, weight_decay=1e-4,
           warmup_steps=30, metric="map50", floor=0.3, grad_clip=0.1, eval_every=2, gpu_step_s=0.21,
           gpu_image_share=0.22, gpu_fixed_s={"plain": 14.4, "musubi": 37.2}, gpu_eval_s=1.0, cpu_step_s=40.0),
)}

#: The models of a run without --models: a classifier, a CNN detector, a DETR-family detector (issue 43).
DEFAULT_MODELS = ("classifier", "cnn_detector", "detr")
#: Data-set sizes: `full` for the comparison, `smoke` for a CPU rehearsal of the plumbing.
DATA_SCALES = {"full": quality_data.DataParams(),
               "smoke": quality_data.DataParams(train_scenes=64, val_scenes=16)}


#: Recipe fields that only plan the time: two result files whose recipes differ in these alone trained alike.
COST_FIELDS = ("label", "gpu_step_s", "gpu_image_share", "gpu_fixed_s", "gpu_eval_s", "cpu_step_s")


def training_fields(recipe: dict[str, Any]) -> dict[str, Any]:
    """A recipe as a result file records it, less the fields that only plan or label it."""
    return {k: v for k, v in recipe.items() if k not in COST_FIELDS}


def trained_as(recorded: dict[str, dict[str, Any]]) -> dict[str, Recipe]:
    """A result file's recipes (model -> its recorded fields) with today's cost figures: how those runs
    trained, planned as this bench plans now."""
    out = {}
    for key, fields in recorded.items():
        if key not in RECIPES:
            raise ValueError(f"{key}: not a recipe of this bench (known: {', '.join(RECIPES)})")
        keep = {k: v for k, v in training_fields(fields).items() if k in Recipe.__dataclass_fields__}
        out[key] = replace(RECIPES[key], **keep)
    return out
