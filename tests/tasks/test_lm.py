"""LM task: the GPT model (causality, tying, FSDP units), spec checks, a step, exact metrics."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from musubi.config.job import JobSpec
from musubi.contract.errors import ConfigError
from musubi.tasks.gpt import GPT, GPTConfig
from musubi.tasks.lm import LMMetric, LMTask


def make_job(**overrides: Any) -> JobSpec:
    """A tiny synthetic LM job."""
    fields: dict[str, Any] = {
        "name": "lm",
        "task": "lm",
        "model": "gpt",
        "model_args": {"layers": 2, "hidden": 32, "heads": 4},
        "data": {"synthetic": {"train_size": 32, "val_size": 8, "seq_len": 16, "vocab": 48}},
    }
    fields.update(overrides)
    return JobSpec(**fields)


def text_job(tmp_path, content: bytes = b"the quick brown fox jumps over the lazy dog. " * 4) -> JobSpec:
    (tmp_path / "train.txt").write_bytes(content)
    data = {"train": {"path": str(tmp_path / "train.txt")}, "seq_len": 8}
    return make_job(data=data)


# -- model ----------------------------------------------------------------------
def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=2, hidden=32, heads=4, vocab=50, seq_len=12)).eval()
    idx = torch.randint(50, (2, 12))
    t = 5
    changed = idx.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % 50  # only tokens after t differ
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 12, 50)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])
    with pytest.raises(ValueError, match="longer"):
        model(torch.zeros(1, 13, dtype=torch.long))


def test_gpt_structure() -> None:
    cfg = GPTConfig(layers=3, hidden=16, heads=2, vocab=20, seq_len=8, ffn_hidden=24)
    model = GPT(cfg)
    assert model.lm_head.weight is model.tok_emb.weight  # tied head
    units = model.fsdp_units()
    assert units == list(model.blocks) and len(units) == 3
    assert model.blocks[0].mlp.fc.out_features == 24
    assert (
        GPT(GPTConfig(layers=1, hidden=16, heads=2, vocab=20, seq_len=8)).blocks[0].mlp.fc.out_features == 64
    )
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(layers=1, hidden=30, heads=4, vocab=10, seq_len=4)


# -- spec -----------------------------------------------------------------------
def test_task_shapes_from_data(tmp_path) -> None:
    task = LMTask(make_job(model_args={}))
    task.validate()
    cfg = task.config()
    assert (cfg.vocab, cfg.seq_len, cfg.layers, cfg.hidden, cfg.heads) == (48, 16, 2, 128, 4)
    assert task.primary_metric == "val_acc"
    text_task = LMTask(text_job(tmp_path))
    text_task.validate()
    assert (text_task.config().vocab, text_task.config().seq_len) == (256, 8)
    ds = text_task.train_dataset()
    assert len(ds) == 180 // 9 and ds[0][0].shape == (8,)
    assert text_task.val_dataset() is None
    assert LMTask(make_job()).val_dataset() is not None


def test_spec_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="did you mean gpt"):
        LMTask(make_job(model="gtp")).validate()
    with pytest.raises(ConfigError, match=r"model_args.layer: unknown for gpt \(did you mean layers"):
        LMTask(make_job(model_args={"layer": 2})).validate()
    with pytest.raises(ConfigError, match="divisible"):
        LMTask(make_job(model_args={"hidden": 30, "heads": 4})).validate()
    with pytest.raises(ConfigError, match="expected a number"):
        LMTask(make_job(model_args={"layers": "two"})).validate()
    with pytest.raises(ConfigError, match="not UTF-8"):
        LMTask(text_job(tmp_path, b"\xff" * 64)).validate()
    with pytest.raises(ConfigError, match="shorter than one sample"):
        LMTask(text_job(tmp_path, b"tiny")).validate()
    missing = make_job(data={"train": {"path": str(tmp_path / "none.txt")}})
    with pytest.raises(ConfigError, match="no such text file"):
        LMTask(missing).validate()


def test_weights_round_trip_and_mismatch(tmp_path) -> None:
    torch.manual_seed(0)
    source = LMTask(make_job()).build_model()
    path = tmp_path / "gpt.pt"
    torch.save(source.state_dict(), path)
    task = LMTask(make_job(weights=str(path)))
    task.validate()
    loaded = task.build_model()
    assert torch.equal(loaded.tok_emb.weight, source.tok_emb.weight)
    assert loaded.lm_head.weight is loaded.tok_emb.weight  # still tied after loading
    wider = make_job(weights=str(path), model_args={"layers": 2, "hidden": 64, "heads": 4})
    with pytest.raises(ConfigError, match="shape mismatch"):
        LMTask(wider).validate()
    deeper = make_job(weights=str(path), model_args={"layers": 3, "hidden": 32, "heads": 4})
    with pytest.raises(ConfigError, match=r"missing \(blocks\.2\."):
        LMTask(deeper).build_model()


# -- step -----------------------------------------------------------------------
def test_training_steps_are_finite_and_learn() -> None:
    torch.manual_seed(0)
    task = LMTask(make_job())
    model = task.build_model()
    ds = task.train_dataset()
    batch = task.collate([ds[i] for i in range(8)])
    assert batch[0].shape == (8, 16) and task.batch_size_of(batch) == 8
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss, parts = task.loss(model, batch)
        assert torch.isfinite(loss) and set(parts) == {"ce"}
        opt.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert model.pos_emb.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(48), rel=0.1)  # uniform guess at init
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        assert task.predict(model, batch).shape == (8, 16, 48)


def test_device_batch_on_cpu() -> None:
    task = LMTask(make_job())
    x, y = task.device_batch(3, torch.device("cpu"), torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (3, 16) and int(x.max()) < 48
    assert torch.equal(x[:, 1:], y[:, :-1])


# -- metric ---------------------------------------------------------------------
def _fake_batches() -> list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for b in (1, 2, 3):  # ranks may hold different numbers of sequences
        logits = torch.randn(b, 5, 11, generator=g)
        y = torch.randint(11, (b, 5), generator=g)
        out.append((logits, (torch.zeros_like(y), y)))
    return out


def test_metric_exact_on_one_rank() -> None:
    batches = _fake_batches()
    m = LMMetric(torch.device("cpu"))
    for logits, batch in batches:
        m.update(logits, batch)
    got = m.compute(lambda t: t)
    logits = torch.cat([b[0].flatten(0, 1) for b in batches])
    y = torch.cat([b[1][1].flatten() for b in batches])
    ce = torch.nn.functional.cross_entropy(logits.double(), y).item()
    assert got["val_loss"] == pytest.approx(ce, rel=1e-6)
    assert got["val_ppl"] == pytest.approx(math.exp(got["val_loss"]), rel=1e-12)
    assert got["val_acc"] == pytest.approx((logits.argmax(1) == y).double().mean().item(), abs=0)


def test_metric_two_simulated_ranks_match_one() -> None:
    batches = _fake_batches()
    whole, rank0, rank1 = (LMMetric(torch.device("cpu")) for _ in range(3))
    for i, (logits, batch) in enumerate(batches):
        whole.update(logits, batch)
        (rank0 if i == 0 else rank1).update(logits, batch)  # 5 tokens vs 25

    def reduce_sum(t: torch.Tensor) -> torch.Tensor:
        return rank0.state + rank1.state  # what an all-reduce SUM over two ranks returns

    two, one = rank0.compute(reduce_sum), whole.compute(lambda t: t)
    assert two == rank1.compute(reduce_sum)
    assert two["val_acc"] == one["val_acc"]
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-12)
    assert math.isnan(LMMetric(torch.device("cpu")).compute(lambda t: t)["val_acc"])


def test_plan_spec_counts_the_parameters_the_model_has() -> None:
    # The planner's memory prediction starts from this count: it must be the real model's, exactly.
    from musubi.config.load import job_from_dict
    from musubi.tasks.registry import build_task

    for args in ({"layers": 2, "hidden": 64, "heads": 4}, {"layers": 3, "hidden": 96, "heads": 3, "ffn_hidden": 200}):
        spec = job_from_dict({"name": "lm", "task": "lm", "model": "gpt", "model_args": args,
                              "data": {"synthetic": {"seq_len": 48, "vocab": 301}}, "train": {"batch": 2}})
        task = build_task(spec)
        real = sum(p.numel() for p in task.build_model().parameters())  # tied head counted once
        assert task.plan_spec().params() == real
