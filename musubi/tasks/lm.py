"""Built-in language modelling: a small GPT on synthetic tokens or a byte-level text file."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from musubi.contract.errors import ConfigError
from musubi.data import text
from musubi.data.synthetic_classification import TRAIN_STREAM, VAL_STREAM
from musubi.plan.spec import TransformerSpec
from musubi.tasks.base import Metric, Reducer, Task
from musubi.tasks.gpt import GPT, GPTConfig
from musubi.tasks.model_check import check_lm, suggest
from musubi.tasks.weights import check_weights, load_weights

#: The tiny default GPT: fast enough for CPU tests and smoke runs.
DEFAULT_ARGS: dict[str, Any] = {"layers": 2, "hidden": 128, "heads": 4, "ffn_hidden": None, "dropout": 0.0}

MODELS = ["gpt"]


class LMMetric(Metric):
    """Next-token loss, perplexity and accuracy from local sums, reduced exactly across ranks."""

    def __init__(self, device: torch.device):
        # [tokens, correct next-token guesses, loss sum] in float64: counts stay exact up to 2**53.
        self.state = torch.zeros(3, dtype=torch.float64, device=device)

    def update(self, outputs: torch.Tensor, batch: Any) -> None:
        """Add logits [B,T,V] against targets [B,T] (no host sync)."""
        logits = outputs.float().flatten(0, 1)  # [B*T, V]
        targets = batch[1].to(logits.device).flatten()  # [B*T]
        correct = (logits.argmax(dim=1) == targets).sum()
        loss = F.cross_entropy(logits, targets, reduction="sum")
        n = torch.tensor(targets.numel(), device=logits.device)
        self.state += torch.stack([n, correct, loss]).to(self.state)

    def compute(self, reduce_sum: Reducer) -> dict[str, float]:
        """{'val_loss', 'val_ppl', 'val_acc'} over all ranks; NaN when no rank saw a token."""
        n, correct, loss = reduce_sum(self.state.clone()).tolist()
        if n == 0:
            nan = float("nan")
            return {"val_loss": nan, "val_ppl": nan, "val_acc": nan}
        mean = loss / n
        # exp overflows a float past ~709 nats: an untrained huge-vocab model can get there.
        ppl = math.exp(mean) if mean < 700 else float("inf")
        return {"val_loss": mean, "val_ppl": ppl, "val_acc": correct / n}


class LMTask(Task):
    """Causal language modelling: cross-entropy over every next token of (x [B,T], y [B,T]) batches."""

    # Higher is better, unlike loss or perplexity (also reported).
    primary_metric = "val_acc"

    # -- facts from the spec ----------------------------------------------
    def vocab(self) -> int:
        """Vocabulary size: synthetic.vocab, or 256 byte tokens for text files."""
        syn = self.spec.data.synthetic
        return syn.vocab if syn is not None else text.BYTE_VOCAB

    def seq_len(self) -> int:
        """Tokens per sample: synthetic.seq_len or data.seq_len."""
        syn = self.spec.data.synthetic
        return syn.seq_len if syn is not None else self.spec.data.seq_len

    def config(self) -> GPTConfig:
        """The GPT shape from model_args (tiny defaults) and the data's vocab/seq_len."""
        args = dict(DEFAULT_ARGS)
        for key, value in self.spec.model_args.items():
            if key not in DEFAULT_ARGS:
                raise ConfigError(
                    f"model_args.{key}: unknown for gpt{suggest(key, list(DEFAULT_ARGS))}; "
                    f"allowed: {', '.join(DEFAULT_ARGS)}"
                )
            if key == "dropout":
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = (isinstance(value, int) and not isinstance(value, bool)) or (
                    key == "ffn_hidden" and value is None
                )
            if not ok:
                raise ConfigError(f"model_args.{key}: expected a number, got {value!r}")
            args[key] = value
        try:
            return GPTConfig(vocab=self.vocab(), seq_len=self.seq_len(), **args)
        except ValueError as e:
            raise ConfigError(f"model_args: {e}; fix the gpt shape") from None

    def plan_spec(self) -> TransformerSpec:
        """This GPT for the planner: GELU MLP, LayerNorm, biases, learned positions, tied head."""
        cfg = self.config()
        return TransformerSpec(name=f"gpt-{cfg.layers}x{cfg.hidden}", layers=cfg.layers, hidden=cfg.hidden,
                               heads=cfg.heads, vocab=cfg.vocab, seq=cfg.seq_len, ffn_hidden=cfg.ffn, mlp="gelu",
                               tied_embeddings=True, learned_positions=True, bias=True, norm="layernorm",
                               dropout=cfg.dropout > 0)

    # -- checks -----------------------------------------------------------
    def validate(self) -> None:
        """Model name and shape, text files (size, UTF-8) and the weights file, before any worker starts."""
        check_lm(self.spec.model)
        cfg = self.config()
        data = self.spec.data
        for split in (data.train, data.val):
            if split is not None:
                text.ByteTextDataset(split.path, cfg.seq_len)  # exists, not empty, not too big or short
                text.check_utf8(split.path)
        if self.spec.weights:
            with torch.device("meta"):
                probe = GPT(cfg)
            check_weights(self.spec.weights, probe)

    # -- model and data ---------------------------------------------------
    def build_model(self) -> nn.Module:
        """A fresh GPT on the CPU, optionally loaded from the job's local weights file."""
        model = GPT(self.config())
        if self.spec.weights:
            load_weights(model, self.spec.weights)
        return model

    def train_dataset(self) -> Dataset:
        """Synthetic token walks or byte windows of the training text file."""
        syn = self.spec.data.synthetic
        if syn is not None:
            return text.SyntheticTokens(syn.train_size, syn.seq_len, syn.vocab, syn.seed, TRAIN_STREAM)
        assert self.spec.data.train is not None
        return text.ByteTextDataset(self.spec.data.train.path, self.spec.data.seq_len)

    def val_dataset(self) -> Dataset | None:
        """Synthetic validation walks, byte windows of the validation file, or None."""
        syn = self.spec.data.synthetic
        if syn is not None:
            if syn.val_size == 0:
                return None
            return text.SyntheticTokens(syn.val_size, syn.seq_len, syn.vocab, syn.seed, VAL_STREAM)
        if self.spec.data.val is None:
            return None
        return text.ByteTextDataset(self.spec.data.val.path, self.spec.data.seq_len)

    def device_batch(self, batch_size: int, device: torch.device, generator: torch.Generator) -> Any:
        """Synthetic (x [B,T], y [B,T]) made on `device`."""
        syn = self.spec.data.synthetic
        if syn is None:
            raise ConfigError("data.synthetic.on_device needs data.synthetic; text files load from disk")
        return text.device_batch(batch_size, syn.seq_len, syn.vocab, device, generator, syn.seed)

    # -- step ---------------------------------------------------------------
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean next-token cross-entropy over all B*T positions."""
        x, y = batch
        logits = model(x)  # [B,T,V]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return loss, {"ce": loss.detach()}

    def predict(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Logits [B,T,V]."""
        return model(batch[0])

    def metric_names(self) -> frozenset[str]:
        """LMMetric's keys."""
        return frozenset({"val_loss", "val_ppl", "val_acc"})

    def make_metric(self, device: torch.device) -> Metric:
        """A fresh loss/perplexity/accuracy accumulator."""
        return LMMetric(device)
