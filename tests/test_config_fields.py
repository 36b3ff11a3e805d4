"""The config fields the generated model reads: MoE placement by each family's own
arithmetic, and Qwen3-MoE's own head_dim. No engine: vLLM's model sources are the
ground truth for what vLLM reads."""

from __future__ import annotations

from pathlib import Path

import vllm

from onboard.arch import build_plan
from onboard.arch.config_keys import MOE_FREQUENCY_RULES, ConfigKeys
from onboard.generate.context import _moe_layer_expr
from onboard.spec import load_spec
from onboard.spec.config_aliases import ALIASES
from onboard.spec.hf import (
    hf_config_from_spec,
    spec_from_hf_config,
    spec_from_hf_config_file,
)

MODELS = Path(vllm.__file__).parent / "model_executor" / "models"
# A family that gives no key another meaning: the keys read are the alias table's.
DENSE = Path(__file__).parents[1] / "model_specs" / "dense-gqa.yaml"


def _plan(expr: str, config: dict, n: int) -> list[bool]:
    from types import SimpleNamespace

    cfg = SimpleNamespace(**config)
    return [eval(expr, {}, {"config": cfg, "layer_idx": i}) for i in range(n)]  # noqa: S307


def test_each_frequency_field_keeps_its_familys_arithmetic():
    # vLLM's own reading of each field, in its model files.
    deepseek = (MODELS / "deepseek_v2.py").read_text()
    assert "layer_idx % moe_layer_freq == 0" in deepseek
    assert 'getattr(config, "moe_layer_freq", 1)' in deepseek
    qwen = (MODELS / "qwen3_moe.py").read_text()
    assert "(layer_idx + 1) % config.decoder_sparse_step == 0" in qwen
    assert MOE_FREQUENCY_RULES == {
        "decoder_sparse_step": "(layer_idx + 1) % config.{name} == 0",
        "moe_layer_freq": "layer_idx % config.{name} == 0",
    }
    # Two concepts, never aliases of each other (ERNIE-4.5's moe_layer_interval
    # counts like Qwen's: its decoder layer tests (layer_idx + 1) % interval;
    ernie = (MODELS / "ernie45_moe.py").read_text()
    assert "(layer_idx + 1) % moe_layer_interval == 0" in ernie
    # Llama-4's interleave_moe_layer_step too.
    llama4 = (MODELS / "llama4.py").read_text()
    assert "(self.layer_idx + 1) % config.interleave_moe_layer_step == 0" in llama4
    assert ALIASES["decoder_sparse_step"] == (
        "decoder_sparse_step",
        "moe_layer_interval",
        "interleave_moe_layer_step",
    )
    assert ALIASES["moe_layer_freq"] == ("moe_layer_freq",)
    # Each field the config carries is read, at 1 too (the config decides).
    dense = load_spec(DENSE)
    both = ConfigKeys(dense, hf={"decoder_sparse_step": 1, "moe_layer_freq": 2})
    assert both.moe_layer_terms("layer_idx") == [
        "(layer_idx + 1) % config.decoder_sparse_step == 0",
        "layer_idx % config.moe_layer_freq == 0",
    ]
    assert both.need("decoder_sparse_step") == "decoder_sparse_step"
    qwen_step = ConfigKeys(dense, hf={"decoder_sparse_step": 2})
    assert qwen_step.moe_layer_terms("i") == [
        "(i + 1) % config.decoder_sparse_step == 0"
    ]
    assert qwen_step.find("moe_layer_freq") is None
    # A per-layer list decides alone where the config has one.
    kinds = ConfigKeys(
        dense, hf={"mlp_layer_types": ["dense", "sparse"], "first_k_dense_replace": 1}
    )
    assert kinds.moe_layer_terms("i") == ['config.mlp_layer_types[i] == "sparse"']


def _qwen2_moe_config(**changes) -> dict:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        architectures=["Qwen2MoeForCausalLM"],
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        **changes,
    ).to_dict()


def test_qwen_decoder_sparse_step_counts_from_one():
    config = _qwen2_moe_config(decoder_sparse_step=2)
    spec = spec_from_hf_config(config)
    want = [False, True, False, True, False, True]  # (i + 1) % 2 == 0
    assert [spec.is_moe_layer(i) for i in range(6)] == want
    for hf in (config, hf_config_from_spec(spec)):
        expr = _moe_layer_expr(spec, build_plan(spec), ConfigKeys(spec, hf))
        # Qwen2-MoE's config also carries mlp_only_layers (empty): read too.
        assert expr == (
            "(layer_idx + 1) % config.decoder_sparse_step == 0"
            " and layer_idx not in config.mlp_only_layers"
        )
        assert _plan(expr, hf, 6) == want


def test_deepseek_moe_layer_freq_counts_from_zero():
    """A config carrying DeepSeek's moe_layer_freq is read with DeepSeek's rule
    (a new model type: from-hf refuses it for deepseek_v3, whose transformers
    class ignores the key)."""
    config = {
        "model_type": "acme_moe",
        "architectures": ["AcmeMoeForCausalLM"],
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 2,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    spec = spec_from_hf_config(config)
    want = [False, False, True, False, True, False]  # i >= 1 and i % 2 == 0
    assert [spec.is_moe_layer(i) for i in range(6)] == want
    expr = _moe_layer_expr(spec, build_plan(spec), ConfigKeys(spec, config))
    assert expr == (
        "layer_idx >= config.first_k_dense_replace and "
        "layer_idx % config.moe_layer_freq == 0"
    )
    assert _plan(expr, config, 6) == want
    # The config onboard writes for the spec says the same with explicit layers.
    written = hf_config_from_spec(spec)
    assert (
        _plan(
            _moe_layer_expr(spec, build_plan(spec), ConfigKeys(spec, written)),
            written,
            6,
        )
        == want
    )


def test_qwen3_moe_with_its_own_head_dim_is_accepted(tmp_path):
    """Qwen3-MoE configs may carry a head_dim other than hidden / heads (the
    published 30B-A3B: 2048 / 32 = 64, head_dim 128); vLLM's qwen3_moe reads it,
    and so do the spec and the generated model."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from onboard.checkpoint.preflight import preflight
    from onboard.pipeline.generate import generate_all

    qwen = (MODELS / "qwen3_moe.py").read_text()
    assert 'head_dim=getattr(config, "head_dim", None)' in qwen
    config = Qwen3MoeConfig(
        architectures=["Qwen3MoeForCausalLM"],
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # hidden / heads would be 16
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "ckpt")
    spec = spec_from_hf_config_file(tmp_path / "ckpt" / "config.json")
    assert spec.attention.head_dim == 32 and spec.head_dim == 32
    assert hf_config_from_spec(spec)["head_dim"] == 32
    # The checkpoint's q/k/v shapes (4 x 32, 2 x 32) are what the spec expects.
    report = preflight(spec, tmp_path / "ckpt")
    assert report.ok, "\n".join(report.lines())
    generate_all(spec, tmp_path / "gen")
    model_file = next((tmp_path / "gen" / "plugin").glob("*/qwen3_moe.py"))
    assert "config.head_dim" in model_file.read_text()
