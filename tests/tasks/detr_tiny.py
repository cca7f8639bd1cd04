"""Tiny configs of the transformers DETR-family presets: a few hundred thousand parameters, seconds a step."""

from __future__ import annotations

from typing import Any

#: RT-DETR (v1 and v2) with a 4-stage ResNet of 16..128 channels, a 32-wide encoder and 2 decoder layers.
TINY_RTDETR: dict[str, Any] = {
    "backbone_hidden_sizes": "16,32,64,128", "backbone_depths": "1,1,1,1", "backbone_embedding_size": 16,
    "encoder_hidden_dim": 32, "encoder_ffn_dim": 64, "d_model": 32, "decoder_ffn_dim": 64, "decoder_layers": 2,
    "num_queries": 20, "num_denoising": 10, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
}
#: D-FINE with an HGNetV2 of 16..128 channels and the same encoder/decoder widths.
TINY_DFINE: dict[str, Any] = {
    **{k: v for k, v in TINY_RTDETR.items() if not k.startswith("backbone_")},
    "backbone_stem_channels": "3,8,8", "backbone_stage_in_channels": "8,16,32,64",
    "backbone_stage_mid_channels": "8,8,16,16", "backbone_stage_out_channels": "16,32,64,128",
    "backbone_stage_numb_of_layers": "1,1,1,1", "backbone_stage_num_blocks": "1,1,1,1",
}
