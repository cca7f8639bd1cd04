"""A one-channel stem: the first RGB convolution of a model (torchvision's, transformers' DETR family) made to take
single-channel input.

The new convolution's weight is the old one summed over its three input channels: on a grey image
replicated to RGB the old layer computed exactly sum_c w_c * x, so the adapted layer gives the same
response to the single channel (timm's `adapt_input_conv` does the same). A freshly initialised
model keeps that property too; start weights are adapted after they are loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from musubi.contract.errors import ConfigError


def first_rgb_conv(model: nn.Module) -> tuple[str, nn.Conv2d]:
    """(dotted name, conv) of the first Conv2d reading 3 channels, in module (definition) order."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == 3:
            return name, module
    raise ConfigError(f"{type(model).__name__} has no convolution reading 3 channels to adapt; use "
                      "data.one_channel: replicate")


def adapt_stem(model: nn.Module, in_channels: int = 1) -> str:
    """Replace the model's first RGB convolution by one of `in_channels` (weights summed, then spread
    evenly over the new channels); return its dotted name for the log."""
    name, conv = first_rgb_conv(model)
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    new = nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                    conv.groups, conv.bias is not None, conv.padding_mode, device=conv.weight.device,
                    dtype=conv.weight.dtype)
    if conv.weight.device.type != "meta":
        with torch.no_grad():
            # [out, 3, kh, kw] -> [out, in_channels, kh, kw]: the summed kernel shared by the new channels.
            new.weight.copy_(conv.weight.sum(dim=1, keepdim=True).expand(-1, in_channels, -1, -1) / in_channels)
            if conv.bias is not None:
                new.bias.copy_(conv.bias)
    setattr(parent, attr, new)
    # transformers' backbones (RT-DETR's ResNet, D-FINE's HGNetV2) refuse input whose channels differ from
    # their embeddings' `num_channels`: every module on the path to the stem that keeps one follows it.
    for depth in range(name.count(".") + 1):
        owner = model.get_submodule(".".join(name.split(".")[:depth]))
        if getattr(owner, "num_channels", None) == conv.in_channels:
            owner.num_channels = in_channels
    return name
