"""Model specs the planner reasons about: dense or MoE decoders, and a generic params+FLOPs form.

A spec is shape only (no weights, no code): enough to count parameters, FLOPs and
activation bytes. Named presets cover common models and the published validation runs;
`load_spec` reads the same fields from YAML.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from musubi.plan.errors import PlanError


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer: dense (GQA, SwiGLU or GELU MLP) or mixture-of-experts."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int = 0  # 0: same as heads (multi-head attention)
    ffn_hidden: int = 0  # 0: 4 x hidden (GELU) or 8/3 x hidden rounded to 256 (SwiGLU)
    mlp: str = "swiglu"  # swiglu (3 matrices) or gelu (2 matrices)
    experts: int = 0  # 0: dense model
    top_k: int = 0
    shared_experts: int = 0
    moe_ffn_hidden: int = 0  # 0: ffn_hidden
    dense_layers: int = 0  # leading layers with a dense MLP in a MoE model
    tied_embeddings: bool = False
    learned_positions: bool = False  # GPT-2/3 position table (seq x hidden parameters)
    bias: bool = False  # biases on the linear layers (GPT-3 style)
    norm: str = "rmsnorm"  # rmsnorm (1 vector) or layernorm (2 vectors)
    dropout: bool = False  # dropout layers present (their masks cost activation memory)
    global_batch: int = 0  # default global batch in sequences (0: none; --global-batch sets it)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            if getattr(self, name) < 1:
                raise PlanError(f"spec {self.name}: {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise PlanError(f"spec {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads and self.heads % self.kv_heads:
            raise PlanError(f"spec {self.name}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.mlp not in ("swiglu", "gelu"):
            raise PlanError(f"spec {self.name}: mlp must be swiglu or gelu, got {self.mlp!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise PlanError(f"spec {self.name}: norm must be rmsnorm or layernorm, got {self.norm!r}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise PlanError(f"spec {self.name}: top_k must be in 1..experts ({self.experts}), got {self.top_k}")
        if self.dense_layers > self.layers:
            raise PlanError(f"spec {self.name}: dense_layers {self.dense_layers} > layers {self.layers}")

    # -- derived shape ----------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Key/value heads (GQA); equals heads for multi-head attention."""
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        """Width of the dense MLP's hidden layer."""
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.mlp == "gelu":
            return 4 * self.hidden
        return 256 * -(-(8 * self.hidden // 3) // 256)

    @property
    def moe_ffn(self) -> int:
        """Width of one expert's hidden layer."""
        return self.moe_ffn_hidden or self.ffn

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP (SwiGLU: gate, up, down)."""
        return 3 if self.mlp == "swiglu" else 2

    # -- parameter counts -----------------------------------------------------
    def attention_params(self) -> int:
        """Parameters of one attention block (QKV and output projections)."""
        h, kvd = self.hidden, self.kv * self.head_dim
        return h * (h + 2 * kvd) + h * h + ((h + 2 * kvd) + h if self.bias else 0)

    def mlp_params(self, width: int) -> int:
        """Parameters of one MLP of hidden width `width`."""
        bias = (width * (self.mlp_matrices - 1) + self.hidden) if self.bias else 0
        return self.mlp_matrices * self.hidden * width + bias

    def norm_params(self) -> int:
        """Parameters of one normalisation layer."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def dense_layer_params(self) -> int:
        """Parameters of one layer with a dense MLP."""
        return self.attention_params() + self.mlp_params(self.ffn) + 2 * self.norm_params()

    def moe_layer_params(self) -> tuple[int, int]:
        """(expert parameters, the rest) of one MoE layer: experts shard over EP, the rest does not."""
        expert = self.experts * self.mlp_params(self.moe_ffn)
        rest = (self.attention_params() + self.shared_experts * self.mlp_params(self.moe_ffn)
                + self.hidden * self.experts + 2 * self.norm_params())  # router: hidden x experts
        return expert, rest

    def embedding_params(self) -> int:
        """Token (and position) embedding parameters, on the first pipeline stage."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    def head_params(self) -> int:
        """Output projection and final norm, on the last stage (a tied head is still stored there when pp > 1)."""
        return self.vocab * self.hidden + self.norm_params()

    def params(self) -> int:
        """Total parameters (tied embeddings counted once)."""
        dense = (self.layers - self.moe_layers) * self.dense_layer_params()
        moe = self.moe_layers * sum(self.moe_layer_params())
        head = self.norm_params() if self.tied_embeddings else self.head_params()
        return dense + moe + self.embedding_params() + head

    def active_params(self) -> int:
        """Parameters a token passes through (top_k + shared experts of each MoE layer)."""
        if not self.is_moe:
            return self.params()
        expert, _ = self.moe_layer_params()
        idle = expert * (self.experts - self.top_k) // self.experts
        return self.params() - self.moe_layers * idle


@dataclass(frozen=True)
class GenericSpec:
    """Any model given as parameters and forward FLOPs per sample (CNNs, detectors): data parallel only."""

    name: str
    params: int
    flops_per_sample: float  # forward pass FLOPs of one sample (1 multiply-add = 2 FLOPs)
    activation_bytes_per_sample: float = 0.0  # kept for backward, mixed precision; 0: flops_per_sample/100
    efficiency: float = 0.35  # fraction of dense bf16 peak the model's kernels reach (convnets: 0.3-0.5)
    global_batch: int = 0

    def __post_init__(self) -> None:
        if self.params < 1 or self.flops_per_sample <= 0:
            raise PlanError(f"spec {self.name}: params and flops_per_sample must be > 0")
        if not 0 < self.efficiency <= 1:
            raise PlanError(f"spec {self.name}: efficiency must be in (0, 1], got {self.efficiency}")

    @property
    def activation_bytes(self) -> float:
        """Activation bytes per sample; unknown: FLOPs/100, a rough rule for convnets under AMP."""
        return self.activation_bytes_per_sample or self.flops_per_sample / 100


ModelSpec = TransformerSpec | GenericSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200,
         global_batch: int = 0) -> TransformerSpec:
    # GPT-3 / Megatron shape: GELU MLP of 4h, biases, LayerNorm, learned positions, tied head, dropout.
    return TransformerSpec(name=name, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq,
                           mlp="gelu", bias=True, norm="layernorm", learned_positions=True,
                           tied_embeddings=True, dropout=True, global_batch=global_batch)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, global_batch: int) -> TransformerSpec:
    # Llama 3: SwiGLU, GQA, RMSNorm, RoPE, untied head, 128,256-token vocabulary (Dubey et al. 2024, Table 3).
    return TransformerSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                           vocab=128256, seq=8192, global_batch=global_batch)


PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 512),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 1024),
        # 405B trained at 16M tokens per step: 2,048 sequences of 8,192 tokens.
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 2048),
        _gpt("gpt3-175b", 96, 12288, 96, global_batch=1536),
        TransformerSpec(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                        vocab=32000, seq=4096, experts=8, top_k=2, global_batch=1024),
        # Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 3 shapes.
        _gpt("gpt-1.7b", 24, 2304, 24, global_batch=512),
        _gpt("gpt-3.6b", 30, 3072, 32, global_batch=512),
        _gpt("gpt-7.5b", 36, 4096, 32, global_batch=512),
        _gpt("gpt-18.4b", 40, 6144, 48, global_batch=1024),
        _gpt("gpt-22b", 48, 6144, 64, global_batch=4),
        _gpt("gpt-39.1b", 48, 8192, 64, global_batch=1536),
        _gpt("gpt-76.1b", 60, 10240, 80, global_batch=1792),
        _gpt("gpt-145.6b", 80, 12288, 96, global_batch=2304),
        _gpt("gpt-310.1b", 96, 16384, 128, global_batch=2160),
        _gpt("gpt-530b", 105, 20480, 128, global_batch=2520),
        _gpt("gpt-1t", 128, 25600, 160, global_batch=3072),
        GenericSpec("resnet50", params=25_557_032, flops_per_sample=8.2e9,
                    activation_bytes_per_sample=110e6, global_batch=1024),
        GenericSpec("yolov8m", params=25_900_000, flops_per_sample=78.9e9,
                    activation_bytes_per_sample=900e6, global_batch=128),
    )
}


def preset(name: str) -> ModelSpec:
    """A named model spec; the error lists the names and suggests the nearest."""
    if name in PRESETS:
        return PRESETS[name]
    lowered = {k.lower(): v for k, v in PRESETS.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name, list(PRESETS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise PlanError(f"unknown model {name!r}{hint}; known: {', '.join(PRESETS)} (or --spec MODEL.yaml)")


def spec_from_dict(raw: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A spec from YAML-like fields; `params` + `flops_per_sample` make a generic spec."""
    generic = "params" in raw or "flops_per_sample" in raw
    cls: type[TransformerSpec] | type[GenericSpec] = GenericSpec if generic else TransformerSpec
    allowed = [f.name for f in fields(cls)]
    data = {"name": name, **raw}
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise PlanError(f"spec field {key!r} is unknown{hint}; allowed: {', '.join(allowed[1:])}")
    if not generic:
        missing = [k for k in ("layers", "hidden", "heads", "vocab", "seq") if k not in data]
        if missing:
            raise PlanError(f"spec {name}: missing {', '.join(missing)} (a generic spec needs params and "
                            "flops_per_sample instead)")
    types = {f.name: f.type for f in fields(cls)}
    return cls(**{key: _coerce(name, key, value, str(types[key])) for key, value in data.items()})


def _coerce(spec: str, key: str, value: Any, kind: str) -> Any:
    """A YAML value as the field's type (YAML 1.1 reads 7.9e10 as a string); the error names the field."""
    try:
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind == "int":
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
                raise ValueError
            return int(number)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
    except (TypeError, ValueError):
        raise PlanError(f"spec {spec}: {key} must be {'a whole number' if kind == 'int' else kind}, "
                        f"got {value!r}") from None
    return str(value)


def load_spec(path: Path) -> ModelSpec:
    """Read a model spec YAML (layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq, experts, ...)."""
    if not path.is_file():
        raise PlanError(f"spec file {path} does not exist")
    from musubi.config.load import MAX_CONFIG_BYTES, SAFE_LOADER, check_document
    from musubi.contract.errors import ConfigError

    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise PlanError(f"spec file {path}: larger than {MAX_CONFIG_BYTES} bytes; a model spec is a few lines")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # plain data only
        check_document(raw, f"spec file {path}")
    except yaml.YAMLError as e:
        raise PlanError(f"spec file {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise PlanError(f"spec file {path}: not UTF-8 text; save it as UTF-8") from None
    except ConfigError as e:
        raise PlanError(str(e)) from None
    if not isinstance(raw, dict):
        raise PlanError(f"spec file {path}: expected a mapping of fields, got {type(raw).__name__}")
    name = str(raw.pop("name", path.stem))
    return spec_from_dict(raw, name)


def with_seq(spec: ModelSpec, seq: int | None) -> ModelSpec:
    """The spec trained at another sequence length (transformers only; positions follow)."""
    if seq is None or isinstance(spec, GenericSpec):
        return spec
    if seq < 1:
        raise PlanError(f"--seq {seq}: must be >= 1")
    return replace(spec, seq=seq)
