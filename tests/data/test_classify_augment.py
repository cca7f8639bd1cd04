"""Classification augmentations (musubi.data.classify_augment) on CPU batches: crops where asked, seeded per sample."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musubi.data.classify_augment import CROP_TRIES, ClassifyAugment, colour_batch, crop_and_flip, crop_window

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(st.integers(8, 300), st.integers(8, 300), st.floats(0.01, 1.0), st.floats(0.01, 1.0),
       st.floats(0.2, 1.0), st.floats(1.0, 5.0), st.lists(st.floats(0, 0.999999), min_size=4 * CROP_TRIES,
                                                          max_size=4 * CROP_TRIES))
def test_a_crop_window_lies_in_the_image_with_its_area_and_ratio(h: int, w: int, a: float, b: float, r0: float,
                                                                 r1: float, u: list[float]) -> None:
    scale = (min(a, b), max(a, b))
    top, left, ch, cw = crop_window(u, h, w, scale, (r0, r1))
    assert 0 <= top and 0 <= left and 0 < ch and 0 < cw and top + ch <= h and left + cw <= w
    # The first try that fits is taken; its area and ratio are the drawn ones (up to rounding to pixels).
    for t in range(CROP_TRIES):
        ua, ur = u[4 * t], u[4 * t + 1]
        target = h * w * (scale[0] + (scale[1] - scale[0]) * ua)
        aspect = math.exp(math.log(r0) + (math.log(r1) - math.log(r0)) * ur)
        tw, th = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < tw <= w and 0 < th <= h:
            assert (ch, cw) == (th, tw)
            return
    # none fitted: a centre crop
    assert abs(top - (h - ch) // 2) <= 0 and abs(left - (w - cw) // 2) <= 0


def ramp(b: int, h: int, w: int) -> torch.Tensor:
    """[b, 3, h, w] whose value is the column index (channel 0), the row index (1) and a constant (2)."""
    x = torch.arange(w, dtype=torch.float32).expand(h, w)
    y = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
    return torch.stack([x, y, torch.full((h, w), 7.0)])[None].repeat(b, 1, 1, 1)


def test_a_crop_resizes_its_window_back_and_a_flip_mirrors_it() -> None:
    h, w = 24, 32
    img = ramp(3, h, w)
    crops = [(0, 0, h, w), (4, 6, 12, 16), (2, 10, 20, 20)]
    out = crop_and_flip(img, crops, [False, False, True])
    assert torch.allclose(out[0], img[0], atol=1e-4)  # the whole image, unflipped: unchanged
    xs = torch.arange(w, dtype=torch.float32)
    ys = torch.arange(h, dtype=torch.float32)
    for i, (top, left, ch, cw) in enumerate(crops[1:], start=1):
        # bilinear sampling of a linear ramp is exact: output column x reads input column left + (x + .5) cw / W - .5
        col = (left + (xs + 0.5) * cw / w - 0.5).clamp(0, w - 1)
        row = (top + (ys + 0.5) * ch / h - 0.5).clamp(0, h - 1)
        if i == 2:
            col = col.flip(0)
        assert torch.allclose(out[i, 0], col.expand(h, w), atol=1e-3), i
        assert torch.allclose(out[i, 1], row[:, None].expand(h, w), atol=1e-3), i
        assert torch.allclose(out[i, 2], torch.full((h, w), 7.0))
    flipped = crop_and_flip(img[:1], [(0, 0, h, w)], [True])
    assert torch.allclose(flipped[0], img[0].flip(-1), atol=1e-4)


def test_colour_jitter_keeps_bounds_and_one_channel_has_no_saturation() -> None:
    g = torch.Generator().manual_seed(0)
    rgb = torch.rand(4, 3, 8, 8, generator=g)
    factors = torch.tensor([[1.4, 1.4, 1.4], [0.6, 0.6, 0.6], [1.0, 1.0, 1.0], [1.2, 1.0, 0.0]])
    out = colour_batch(rgb, factors, (0.0, 1.0))
    assert float(out.min()) >= 0 and float(out.max()) <= 1 and torch.allclose(out[2], rgb[2])
    # saturation 0: every channel is the pixel's grey
    assert torch.allclose(out[3, 0], out[3, 1], atol=1e-5) and torch.allclose(out[3, 1], out[3, 2], atol=1e-5)
    # 16-bit counts in one channel: brightness is a gain, the stored type's range is kept, saturation does nothing
    grey = torch.full((2, 1, 4, 4), 50_000.0)
    one = colour_batch(grey, torch.tensor([[1.2, 1.0, 0.0], [0.9, 1.0, 1.5]]), (0.0, 65535.0))
    assert torch.allclose(one[0], torch.full((1, 4, 4), 60_000.0)) and torch.allclose(one[1], grey[1] * 0.9)
    assert float(colour_batch(grey, torch.tensor([[1.4, 1.0, 1.0]] * 2), (0.0, 65535.0)).max()) == 65535.0
    # unbounded (zero-centred synthetic images): no clamp
    assert float(colour_batch(grey - 60_000, torch.tensor([[1.3, 1.0, 1.0]] * 2), None).min()) == -13_000.0


def test_each_sample_is_a_function_of_seed_epoch_and_its_key_not_of_the_batch() -> None:
    aug = ClassifyAugment(crop_scale=(0.08, 1.0), hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4)
    g = torch.Generator().manual_seed(1)
    images = torch.rand(6, 3, 16, 16, generator=g)
    keys = [11, 3, 7, 100, 5, 42]
    out = aug(images, keys, seed=9, epoch=2)
    assert out.shape == images.shape and float(out.min()) >= 0 and float(out.max()) <= 1
    assert torch.equal(out, aug(images, keys, seed=9, epoch=2))
    perm = [4, 0, 5, 2, 1, 3]
    assert torch.allclose(aug(images[perm], [keys[i] for i in perm], seed=9, epoch=2), out[perm])
    # another epoch or seed: other crops
    assert not torch.allclose(aug(images, keys, seed=9, epoch=3), out)
    assert not torch.allclose(aug(images, keys, seed=8, epoch=2), out)
    # a single sample alone gives what it gave in the batch
    assert torch.allclose(aug(images[1:2], [3], seed=9, epoch=2), out[1:2])


def test_off_is_the_identity_and_the_draws_follow_their_probabilities() -> None:
    images = torch.rand(3, 3, 10, 12)
    off = ClassifyAugment(crop_scale=None, hflip=0.0)
    assert off.active() == [] and torch.equal(off(images, [0, 1, 2], 0, 0), images)
    aug = ClassifyAugment(crop_scale=(0.25, 0.5), hflip=0.5, brightness=0.2)
    assert aug.active() == ["crop", "hflip", "colour"] and aug.active(channels=1) == ["crop", "hflip", "colour"]
    assert ClassifyAugment(saturation=0.3, crop_scale=None, hflip=0).active(channels=1) == []
    draws = [aug.draw(0, 0, k, 100, 100) for k in range(400)]
    assert 150 < sum(d.flip for d in draws) < 250
    areas = [d.crop[2] * d.crop[3] / 1e4 for d in draws]
    assert min(areas) > 0.23 and max(areas) < 0.52  # drawn in [0.25, 0.5], rounded to pixels
    assert all(0.8 <= d.brightness <= 1.2 and d.contrast == 1.0 for d in draws)
