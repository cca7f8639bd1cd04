"""Model presets, spec YAML loading and the hardware catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from musubi.plan import PlanError, get_gpu, gpu_names, load_catalog, load_spec, preset
from musubi.plan.spec import GenericSpec, TransformerSpec, with_seq

CATALOG_GPUS = ("A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "GB200-NVL72",
                "RTX-PRO-6000-Blackwell", "RTX-A6000", "L40S")


@pytest.mark.parametrize(("name", "billions"), [
    ("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3-405b", 405.85), ("gpt3-175b", 174.6),
    ("mixtral-8x7b", 46.7), ("gpt-1t", 1008.0),
])
def test_preset_parameter_counts(name: str, billions: float) -> None:
    assert preset(name).params() / 1e9 == pytest.approx(billions, rel=0.002)


def test_moe_active_parameters() -> None:
    mixtral = preset("mixtral-8x7b")
    assert isinstance(mixtral, TransformerSpec) and mixtral.is_moe
    assert mixtral.active_params() / 1e9 == pytest.approx(12.9, rel=0.01)


def test_unknown_preset_suggests() -> None:
    with pytest.raises(PlanError, match="did you mean llama3-8b"):
        preset("llama3-8")


def test_load_spec_yaml(tmp_path: Path) -> None:
    path = tmp_path / "moe.yaml"
    path.write_text("layers: 24\nhidden: 2048\nheads: 16\nkv_heads: 4\nffn_hidden: 5632\nvocab: 32000\n"
                    "seq: 4096\nexperts: 64\ntop_k: 6\nshared_experts: 2\nmoe_ffn_hidden: 1408\n")
    spec = load_spec(path)
    assert isinstance(spec, TransformerSpec) and spec.name == "moe" and spec.experts == 64 and spec.kv == 4
    assert spec.active_params() < spec.params()
    generic = tmp_path / "det.yaml"
    generic.write_text("name: detector\nparams: 25900000\nflops_per_sample: 7.89e10\n")
    assert isinstance(load_spec(generic), GenericSpec)


@pytest.mark.parametrize(("text", "needle"), [
    ("layers: 2\nhiden: 8\n", "'hiden' is unknown (did you mean hidden?)"),
    ("layers: 2\nhidden: 8\n", "missing heads, vocab, seq"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("layers: 2\nhidden: 10\nheads: 3\nvocab: 8\nseq: 8\n", "not divisible by heads"),
])
def test_spec_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PlanError) as e:
        load_spec(path)
    assert needle in str(e.value)


def test_with_seq() -> None:
    assert with_seq(preset("llama3-8b"), 131072).seq == 131072  # type: ignore[union-attr]


def test_catalog_has_every_gpu_with_sources() -> None:
    assert set(CATALOG_GPUS) <= set(gpu_names())
    for gpu in load_catalog().values():
        assert gpu.sources, f"{gpu.name} cites no source"
        assert gpu.peak("bf16") > 0 and gpu.memory_gib > 0 and gpu.hbm_gbps > 0 and gpu.nic_gbps > 0
        assert gpu.nvlink_domain >= 1 and gpu.gpus_per_node >= 1
    assert get_gpu("h100").name == "H100-SXM" and get_gpu("GB200").nvlink_domain == 72
    assert get_gpu("H100-SXM").peak("bf16") == pytest.approx(989.5e12)
    with pytest.raises(PlanError, match="did you mean"):
        get_gpu("H1000-SXM")
    with pytest.raises(PlanError, match="no fp8 peak"):
        get_gpu("A100-80GB").peak("fp8")
