"""One training step and a prediction of a built-in detector on two of its own training images: the check the
detection tests share (the default model, every accepted torchvision builder)."""

from __future__ import annotations

import math

import torch

from musubi.tasks.detection import DetectionTask


def train_step_and_predict(task: DetectionTask) -> dict[str, torch.Tensor]:
    """Forward/backward of 2 images (finite loss, >= 2 detached parts, finite gradients), then predict in eval
    mode (boxes, scores, labels for each image); the loss parts, for assertions of the caller's own."""
    model = task.build_model().train()
    ds = task.train_dataset()
    batch = task.to_device(task.collate([ds[0], ds[1]]), torch.device("cpu"))
    assert isinstance(batch[0], list) and len(batch[0]) == 2
    loss, parts = task.loss(model, batch)
    assert loss.ndim == 0 and math.isfinite(float(loss.detach())) and len(parts) >= 2
    assert not any(p.requires_grad for p in parts.values())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.eval()
    with torch.no_grad():
        out = task.predict(model, batch)
    assert len(out) == 2 and {"boxes", "scores", "labels"} <= set(out[0])
    return parts
