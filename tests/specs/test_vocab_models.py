"""Model shapes, the GPU catalog and units, checked against hand-computed and published numbers."""

from __future__ import annotations

import json

import pytest

from hetprof.errors import SpecError
from hetprof.specs import catalog
from hetprof.specs.models import PRESETS, from_hf_config, resolve_model
from hetprof.specs.units import parse_duration, parse_rate, parse_size


@pytest.mark.parametrize("name, billions", [
    ("qwen3-0.6b", 0.6), ("qwen3-1.7b", 1.7), ("qwen3-4b", 4.0), ("qwen3-8b", 8.2), ("qwen3-14b", 14.8),
    ("qwen3-32b", 32.8), ("llama3-8b", 8.0), ("llama3-70b", 70.6),
])
def test_preset_parameter_counts_match_published_sizes(name, billions):
    assert PRESETS[name].params / 1e9 == pytest.approx(billions, rel=0.03)


def test_qwen3_8b_layer_by_hand():
    m = PRESETS["qwen3-8b"]
    attn = 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 32 * 128 * 4096 + 2 * 128
    mlp = 3 * 4096 * 12288
    assert m.params_per_layer == attn + mlp + 2 * 4096
    # 2 FLOPs per multiply-accumulate over the weight matmuls (norm weights excluded)
    assert m.matmul_flops_per_token_per_layer() == 2 * (attn - 2 * 128 + mlp)
    # KV cache: K and V, 36 layers, 8 KV heads of 128, bf16
    assert m.kv_bytes_per_token("bf16") == 2 * 36 * 8 * 128 * 2 == 147456
    # Training is forward + backward (twice the forward)
    assert m.training_flops(2, 128) == pytest.approx(3 * m.forward_flops(2, 128))


def test_attention_flops_grow_with_context():
    m = PRESETS["qwen3-4b"]
    assert m.forward_flops_per_token(context=2048) > m.forward_flops_per_token(context=128)
    assert m.forward_flops_per_token(0) == pytest.approx(
        36 * m.matmul_flops_per_token_per_layer() + 2 * m.vocab * m.hidden)


def test_hf_config_round_trip(tmp_path):
    for name in ("qwen3-4b", "llama3-8b", "tiny"):
        shape = PRESETS[name]
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(shape.to_hf_config()))
        back = resolve_model(str(tmp_path / name))
        assert (back.params, back.kv_bytes_per_token(), back.family) == (
            shape.params, shape.kv_bytes_per_token(), shape.family)


def test_bad_hf_config_names_the_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": "big"}))
    with pytest.raises(SpecError, match="hidden_size"):
        from_hf_config(path)
    with pytest.raises(KeyError):
        resolve_model("no-such-model")


def test_catalog_covers_the_fleet_and_marks_sources():
    names = set(catalog.CATALOG)
    for needed in ("H200", "H100-SXM", "H100-PCIe", "H800", "H20", "A100-40GB", "A100-80GB", "A10G", "L40S",
                   "L40", "L4", "T4", "V100-32GB", "MI300X"):
        assert needed in names
    gpus = [g for g in catalog.CATALOG.values() if g.name != "cpu"]
    assert len(gpus) >= 12
    assert all(g.source == catalog.DATASHEET and g.price_source == catalog.EDITABLE_DEFAULT for g in gpus)
    assert catalog.lookup("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert catalog.lookup("t4").peak_flops("bf16") == catalog.lookup("t4").peak_flops("fp16")  # no bf16 units
    assert catalog.lookup("H100").peak_flops("bf16") == 989e12


@pytest.mark.parametrize("text, value", [
    ("5Gbps", 5e9 / 8), ("1 Gbps", 1.25e8), ("25GB/s", 25e9), ("100Mbit", 1.25e7), (1000, 1000.0),
])
def test_rates(text, value):
    assert parse_rate(text) == pytest.approx(value)


def test_sizes_and_durations():
    assert parse_size("24GiB") == 24 * 1024**3 and parse_size("40GB") == 40e9
    assert parse_duration("10ms") == pytest.approx(0.01) and parse_duration(2) == 2.0
    with pytest.raises(ValueError, match="unit"):
        parse_duration("10 parsecs")


def test_a_model_name_no_file_system_holds_is_an_unknown_model():
    """A name too long for a path (found by the spec fuzz campaign) is refused like any unknown
    model, not with the file system's OSError."""
    from hetprof.specs.models import resolve_model

    with pytest.raises(KeyError):
        resolve_model("x" * 5000)
