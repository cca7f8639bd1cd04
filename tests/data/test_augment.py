"""Detection augmentations (musubi.data.augment) on CPU tensors: boxes follow the pixels, the stream is seeded."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from musubi.config.job import AugmentSpec
from musubi.data.augment import Augment, colour, hflip, mosaic, quadrants, rescale, sample_seed

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def image_with_boxes(draw: st.DrawFn, min_side: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float [3, h, w] image and 0..5 boxes inside it (at least 1 px a side)."""
    h, w = draw(st.integers(min_side, 48)), draw(st.integers(min_side, 48))
    n = draw(st.integers(0, 5))
    rows = []
    for _ in range(n):
        x1 = draw(st.floats(0, w - 1, allow_nan=False))
        y1 = draw(st.floats(0, h - 1, allow_nan=False))
        x2 = draw(st.floats(x1 + 1, w, allow_nan=False))
        y2 = draw(st.floats(y1 + 1, h, allow_nan=False))
        rows.append([x1, y1, x2, y2])
    boxes = torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, h, w, generator=g), boxes, torch.arange(1, n + 1)


def inside(boxes: torch.Tensor, img: torch.Tensor, tol: float = 1e-3) -> bool:
    """Every box within the image and not inverted."""
    _, h, w = img.shape
    return bool(((boxes[:, 0] >= -tol) & (boxes[:, 1] >= -tol) & (boxes[:, 2] <= w + tol) & (boxes[:, 3] <= h + tol)
                 & (boxes[:, 2] >= boxes[:, 0]) & (boxes[:, 3] >= boxes[:, 1])).all())


@SETTINGS
@given(image_with_boxes())
def test_a_flip_twice_is_identity_and_boxes_follow_the_pixels(sample: tuple) -> None:
    img, boxes, _ = sample
    flipped, fboxes = hflip(img, boxes)
    assert inside(fboxes, flipped)
    back, bboxes = hflip(flipped, fboxes)
    assert torch.equal(back, img) and torch.allclose(bboxes, boxes, atol=1e-4)  # float32 w - (w - x)
    # A pixel at column x sits at column w-1-x after the flip: a box's content moves with it.
    _, _, w = img.shape
    assert torch.equal(flipped[:, :, 0], img[:, :, w - 1])
    widths = boxes[:, 2] - boxes[:, 0]
    assert torch.allclose(fboxes[:, 2] - fboxes[:, 0], widths, atol=1e-4)


@SETTINGS
@given(image_with_boxes(), st.floats(0.25, 3.0))
def test_scale_jitter_scales_boxes_with_the_realised_size(sample: tuple, factor: float) -> None:
    img, boxes, labels = sample
    out, sboxes, slabels = rescale(img, boxes, labels, factor)
    _, h, w = img.shape
    _, nh, nw = out.shape
    assert (nh, nw) == (max(1, round(h * factor)), max(1, round(w * factor)))
    assert inside(sboxes, out) and len(sboxes) == len(slabels) <= len(boxes)
    # Every kept box is an original box scaled per axis (labels say which).
    for b, lab in zip(sboxes, slabels, strict=True):
        src = boxes[int(lab) - 1]
        assert torch.allclose(b, src * torch.tensor([nw / w, nh / h, nw / w, nh / h]), atol=1e-3)


@SETTINGS
@given(st.lists(image_with_boxes(), min_size=4, max_size=4), st.floats(0.25, 0.75), st.floats(0.25, 0.75))
def test_mosaic_boxes_map_to_their_quadrants(samples: list, fx: float, fy: float) -> None:
    images = [s[0] for s in samples]
    boxes = [s[1] for s in samples]
    # Labels say which source (k) a box came from: 10*k + its index.
    labels = [10 * k + s[2] for k, s in enumerate(samples)]
    out, oboxes, olabels = mosaic(images, boxes, labels, (fx, fy))
    assert out.shape == images[0].shape and inside(oboxes, out) and len(oboxes) == len(olabels)
    _, h, w = out.shape
    cx, cy = min(w - 1, max(1, round(fx * w))), min(h - 1, max(1, round(fy * h)))
    wins = quadrants(w, h, cx, cy)
    for b, lab in zip(oboxes.tolist(), olabels.tolist(), strict=True):
        x0, y0, x1, y1 = wins[lab // 10]
        assert x0 - 1e-3 <= b[0] and b[2] <= x1 + 1e-3 and y0 - 1e-3 <= b[1] and b[3] <= y1 + 1e-3, (b, lab)


def test_mosaic_puts_each_image_in_its_quadrant() -> None:
    images = [torch.full((3, 40, 40), k / 4) for k in range(4)]  # image k is flat grey k/4
    box = torch.tensor([[4.0, 4.0, 36.0, 36.0]])
    out, b, lab = mosaic(images, [box] * 4, [torch.tensor([k]) for k in range(4)], (0.5, 0.5))
    assert lab.tolist() == [0, 1, 2, 3]
    for k, (x0, y0, x1, y1) in enumerate(quadrants(40, 40, 20, 20)):
        assert torch.allclose(out[:, y0:y1, x0:x1], torch.full((3, y1 - y0, x1 - x0), k / 4))
    assert b.tolist() == [[2, 2, 18, 18], [22, 2, 38, 18], [2, 22, 18, 38], [22, 22, 38, 38]]


@SETTINGS
@given(image_with_boxes(), st.floats(0.5, 1.5), st.floats(0.5, 1.5), st.floats(0.0, 2.0))
def test_colour_jitter_stays_in_range_and_leaves_boxes(sample: tuple, b: float, c: float, s: float) -> None:
    img, _, _ = sample
    out = colour(img.clone(), b, c, s)
    assert out.shape == img.shape and float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert torch.allclose(colour(img.clone(), 1.0, 1.0, 1.0), img)


@SETTINGS
@given(st.lists(image_with_boxes(), min_size=1, max_size=5), st.integers(0, 2**40), st.integers(0, 1000))
def test_the_batch_pipeline_is_box_correct_and_a_function_of_seed_epoch_and_key(samples: list, seed: int,
                                                                               epoch: int) -> None:
    aug = Augment(hflip=0.5, scale=(0.5, 1.5), mosaic=0.5, brightness=0.3, contrast=0.3, saturation=0.3)
    images = [s[0] for s in samples]
    targets = [{"boxes": s[1], "labels": s[2]} for s in samples]
    keys = list(range(100, 100 + len(samples)))
    out, tout = aug(images, targets, keys, seed, epoch)
    for img, t in zip(out, tout, strict=True):
        assert inside(t["boxes"], img) and len(t["boxes"]) == len(t["labels"])
        assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    again, tagain = aug(images, targets, keys, seed, epoch)
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))
    assert all(torch.equal(a["boxes"], b["boxes"]) for a, b in zip(tout, tagain, strict=True))
    # A sample's draw depends on (seed, epoch, key) only, not on its place in the batch.
    assert aug.draw(seed, epoch, keys[0]) == aug.draw(seed, epoch, keys[0])


def test_draws_differ_between_epochs_seeds_and_samples() -> None:
    aug = Augment(hflip=0.5, scale=(0.5, 1.5))
    draws = {aug.draw(s, e, k).scale for s in range(3) for e in range(3) for k in range(3)}
    assert len(draws) == 27  # no two of (seed, epoch, key) share a stream
    flips = [aug.draw(0, 0, k).flip for k in range(400)]
    assert 150 < sum(flips) < 250  # p = 0.5
    assert sample_seed(0, 0, 1) != sample_seed(0, 1, 0) != sample_seed(1, 0, 0)


def test_augment_config_one_line_errors() -> None:
    with pytest.raises(ValidationError, match="scale must be"):
        AugmentSpec(scale=(1.5, 0.5))
    with pytest.raises(ValidationError, match="hflip"):
        AugmentSpec(hflip=1.5)
    with pytest.raises(ValidationError, match="extra|not permitted"):
        AugmentSpec(rotate=10)  # type: ignore[call-arg]
    assert AugmentSpec().hflip == 0.5 and AugmentSpec(scale=[0.5, 1.5]).scale == (0.5, 1.5)
