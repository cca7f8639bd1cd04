"""Slicing properties (hypothesis): the grid covers the frame, boxes inside a tile survive exactly, merge works."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from musubi.data.slicing import SliceParams, clip_boxes, plan_tiles, sliced_predict, tile_grid

frames = st.tuples(st.integers(20, 600), st.integers(20, 600))
tiles = st.integers(24, 400)
overlaps = st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 0.75])


@st.composite
def frame_with_boxes(draw: st.DrawFn) -> tuple[int, int, np.ndarray]:
    w, h = draw(frames)
    n = draw(st.integers(0, 12))
    boxes = []
    for _ in range(n):
        x0 = draw(st.integers(0, w - 2))
        y0 = draw(st.integers(0, h - 2))
        boxes.append([x0, y0, draw(st.integers(x0 + 1, w)), draw(st.integers(y0 + 1, h))])
    return w, h, np.array(boxes, dtype=np.float64).reshape(-1, 4)


@settings(max_examples=100, deadline=None)
@given(frames, tiles, overlaps)
def test_grid_covers_the_frame_with_full_size_tiles(frame: tuple[int, int], tile: int, overlap: float) -> None:
    w, h = frame
    grid = tile_grid(w, h, tile, overlap)
    covered = np.zeros((h, w), dtype=bool)
    for x0, y0, x1, y1 in grid:
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        assert x1 - x0 == min(tile, w) and y1 - y0 == min(tile, h)
        covered[y0:y1, x0:x1] = True
    assert covered.all() and len(set(grid)) == len(grid)


@settings(max_examples=100, deadline=None)
@given(frame_with_boxes(), tiles, overlaps, st.floats(0.05, 1.0))
def test_every_box_inside_a_tile_is_kept_exactly_once_there(data: tuple[int, int, np.ndarray], tile: int,
                                                            overlap: float, min_vis: float) -> None:
    w, h, boxes = data
    labels = np.arange(1, len(boxes) + 1)
    refs, per_image = plan_tiles([(w, h)], [boxes], [labels], SliceParams(tile, overlap, min_vis, 1.0))
    assert per_image == [len(tile_grid(w, h, tile, overlap))] and len(refs) == per_image[0]
    for ref in refs:
        x0, y0, x1, y1 = ref.window
        inside = [i for i, b in enumerate(boxes) if b[0] >= x0 and b[1] >= y0 and b[2] <= x1 and b[3] <= y1]
        got = list(ref.labels - 1)
        for i in inside:
            assert got.count(i) == 1  # exactly once in each tile that contains it
            k = got.index(i)
            # Tile coordinates plus the tile origin give the original box back, exactly.
            assert np.array_equal(ref.boxes[k] + [x0, y0, x0, y0], boxes[i])
        assert len(got) == len(set(got))  # no box twice in a tile
        # Every kept box lies inside its tile with positive area.
        if len(ref.boxes):
            assert (ref.boxes[:, 0] >= 0).all() and (ref.boxes[:, 2] <= x1 - x0).all()
            assert (ref.boxes[:, 2] > ref.boxes[:, 0]).all() and (ref.boxes[:, 3] > ref.boxes[:, 1]).all()
    # Every box fully inside some tile appears in at least one tile.
    for i, b in enumerate(boxes):
        if any(b[0] >= x0 and b[1] >= y0 and b[2] <= x1 and b[3] <= y1 for x0, y0, x1, y1 in tile_grid(w, h, tile,
                                                                                                      overlap)):
            assert any(i in list(r.labels - 1) for r in refs)


def test_min_visibility_and_empty_ratio() -> None:
    boxes = np.array([[90.0, 10.0, 110.0, 20.0]])  # 10 of 20 px inside the first 100 px tile
    keep, clipped = clip_boxes(boxes, (0, 0, 100, 100), 0.5)
    assert list(keep) == [0] and clipped.tolist() == [[90.0, 10.0, 100.0, 20.0]]
    assert len(clip_boxes(boxes, (0, 0, 100, 100), 0.6)[0]) == 0
    empty = [np.zeros((0, 4))]
    p = SliceParams(tile=16, overlap=0.0, empty_ratio=0.0)
    assert plan_tiles([(160, 160)], empty, [np.zeros(0)], p)[1] == [0]
    some = plan_tiles([(160, 160)], empty, [np.zeros(0)], SliceParams(tile=16, overlap=0.0, empty_ratio=0.3))[1][0]
    assert 10 < some < 60  # 100 empty tiles at 0.3, deterministic per seed
    again = plan_tiles([(160, 160)], empty, [np.zeros(0)], SliceParams(tile=16, overlap=0.0, empty_ratio=0.3))[1][0]
    assert some == again


def test_sliced_predict_maps_back_to_frame_pixels_and_merges_overlaps() -> None:
    """A fake detector finds the one bright square in each tile; the two tiles that both see it give one box."""
    image = torch.zeros(3, 100, 180)
    image[:, 40:60, 80:100] = 1.0  # object at x 80..100, y 40..60: inside both 100x100 tiles (x 0..100, 80..180)

    def predict(tiles: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for t in tiles:
            ys, xs = torch.nonzero(t[0] > 0.5, as_tuple=True)
            if len(xs) == 0:
                out.append({"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0).long()})
                continue
            box = torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float32)
            out.append({"boxes": box, "scores": torch.tensor([0.9]), "labels": torch.tensor([1])})
        return out

    merged = sliced_predict(predict, image, tile=100, overlap=0.2)
    assert merged["boxes"].tolist() == [[80.0, 40.0, 100.0, 60.0]] and merged["labels"].tolist() == [1]


def test_sliced_merge_keeps_the_whole_box_not_the_truncated_part() -> None:
    # Before: plain NMS kept a duplicate truncated box (40 % seen) or, at equal scores, only the truncated one.
    from musubi.data.slicing import tile_grid as grid

    image = torch.zeros(3, 700, 1200)
    for obj, scores in (((620, 300, 670, 350), (0.8, 0.9)), ((610, 300, 660, 350), (0.9, 0.9))):
        tiles = grid(1200, 700, 640, 0.2)
        outs = []
        seen = 0
        for x0, y0, x1, y1 in tiles:
            bx0, by0, bx1, by1 = max(obj[0], x0), max(obj[1], y0), min(obj[2], x1), min(obj[3], y1)
            if bx1 > bx0 and by1 > by0:
                outs.append({"boxes": torch.tensor([[bx0 - x0, by0 - y0, bx1 - x0, by1 - y0]], dtype=torch.float32),
                             "scores": torch.tensor([scores[min(seen, 1)]]), "labels": torch.tensor([1])})
                seen += 1
            else:
                outs.append({"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0).long()})
        assert seen >= 2  # the object straddles a tile edge

        def predict(batch: list[torch.Tensor], outs: list = outs) -> list[dict[str, torch.Tensor]]:
            return [outs.pop(0) for _ in batch]

        merged = sliced_predict(predict, image, tile=640, overlap=0.2, batch=64)
        assert merged["boxes"].tolist() == [list(map(float, obj))], (obj, merged)
