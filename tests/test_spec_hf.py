"""Hugging Face config <-> spec mapping, on configs written by transformers itself."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
from transformers import AutoConfig

from onboard.errors import InputError
from onboard.spec import load_spec
from onboard.spec.hf import (
    ALIASES,
    IGNORED,
    accepted_keys,
    hf_config_from_spec,
    hf_fields,
    spec_from_hf_config,
    spec_from_hf_config_file,
)
from onboard.spec.model import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = ROOT / ".venv" / "bin" / "onboard"

SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
MLA = dict(
    num_key_value_heads=4,
    kv_lora_rank=512,  # the CPU MLA kernel's latent (docs/vllm-cpu-notes.md)
    qk_rope_head_dim=64,
    qk_nope_head_dim=16,
    v_head_dim=16,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# Gated DeltaNet: more value heads than key heads, each key head's group shows.
LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)
# Granite's multipliers away from 1, its softmax scale away from 1/sqrt(head_dim).
GRANITE = dict(
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    logits_scaling=16.0,
    attention_multiplier=0.0625,
)

# Each family at small dims, with the features its config class can state.
FAMILIES = {
    "llama": dict(
        attention_bias=True,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    ),
    "mistral": dict(sliding_window=128, head_dim=32),
    "qwen2": dict(use_sliding_window=True, sliding_window=64, max_window_layers=2),
    "qwen3": dict(
        head_dim=32,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    ),
    "qwen3_moe": dict(
        num_experts=8, mlp_only_layers=[0], norm_topk_prob=True, head_dim=16, **MOE
    ),
    "qwen2_moe": dict(
        num_experts=8,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
        qkv_bias=True,
        **MOE,
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "exaone4": dict(
        head_dim=16, sliding_window=None, layer_types=["full_attention"] * 4
    ),
    # Sinks, alternating sliding and full layers, yarn with an unrounded range,
    # stacked experts with biases and the clamped SwiGLU.
    "gpt_oss": dict(
        head_dim=32,
        sliding_window=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 128,
        },
    ),
    # Mistral-4: MLA whose queries grow with the position (llama_4_scaling), yarn
    # on the same original context, experts stacked as parameters of one module.
    "mistral4": dict(
        n_routed_experts=8,
        q_lora_rank=32,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
        **MLA,
        **MOE,
    ),
    # Gemma: scaled embeddings, 1 + weight norms (facts of the family).
    "gemma": dict(head_dim=16),
    # Gemma-2: sandwich norms, its own softmax scale, both soft-caps (small, so
    # that on a tiny model they change the logits), alternating sliding layers.
    "gemma2": dict(
        head_dim=16,
        sliding_window=8,
        query_pre_attn_scalar=8,
        attn_logit_softcapping=0.25,
        final_logit_softcapping=3.0,
    ),
    # Gemma-3: q/k norms and a rope per layer type (the full layers' scaled).
    "gemma3_text": dict(
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        query_pre_attn_scalar=16,
        final_logit_softcapping=3.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "linear",
                "rope_theta": 1000000.0,
                "factor": 8.0,
            },
        },
    ),
    # GLM-4: sandwich norms under its own names, gate and up in one tensor,
    # interleaved partial rope (its class's default 0.5). Its default pad token
    # is beyond a tiny vocabulary.
    "glm4": dict(head_dim=32, pad_token_id=None),
    # VaultGemma: Gemma-2's block without the output norms.
    "vaultgemma": dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
    "granite": dict(attention_bias=True, **GRANITE),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, **GRANITE),
    "granitemoeshared": dict(
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=48,
        tie_word_embeddings=True,
        **GRANITE,
    ),
    # KDA layers between MLA layers without rope, DeepSeek-V3's MoE.
    "kimi_linear": dict(
        num_local_experts=4,
        n_shared_experts=1,
        q_lora_rank=None,
        linear_num_heads=2,
        linear_head_dim=32,
        layer_types=[
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention",
        ],
        routed_scaling_factor=2.5,
        # Its class defaults are Kimi's token ids, outside a tiny vocabulary.
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **MLA,
        **MOE,
    ),
    # Gated DeltaNet layers (grouped projections) on three of four layers, gated
    # attention with q/k norms on the fourth, a gated shared expert, 1 + weight
    # norms (the gated DeltaNet norm plain).
    "qwen3_next": dict(
        head_dim=16,
        num_experts=4,
        shared_expert_intermediate_size=48,
        **LINEAR,
        **MOE,
    ),
    # Qwen3.5's language models: Qwen3-Next's block with split projections.
    "qwen3_5_text": dict(head_dim=16, **LINEAR),
    "qwen3_5_moe_text": dict(
        head_dim=16,
        num_experts=4,
        shared_expert_intermediate_size=48,
        **LINEAR,
        **MOE,
    ),
    "deepseek_v2": dict(
        n_routed_experts=8,
        n_shared_experts=2,
        q_lora_rank=None,
        first_k_dense_replace=1,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        **MLA,
        **MOE,
    ),
    "deepseek_v3": dict(
        n_routed_experts=8,
        n_shared_experts=1,
        q_lora_rank=32,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        **MLA,
        **MOE,
    ),
    # Sparse MLA: DeepSeek-V3's block with a lightning indexer in every layer
    # (index rope in NeoX halves); a top-k below the proof's context.
    "deepseek_v32": dict(
        n_routed_experts=8,
        n_shared_experts=1,
        q_lora_rank=32,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        index_n_heads=4,
        index_head_dim=96,
        index_topk=8,
        **MLA,
        **MOE,
    ),
    # GLM-5: the same with an interleaved index rope, ungrouped routing.
    "glm_moe_dsa": dict(
        n_routed_experts=8,
        n_shared_experts=1,
        q_lora_rank=32,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        index_n_heads=4,
        index_head_dim=96,
        index_topk=8,
        pad_token_id=None,
        **MLA,
        **MOE,
    ),
}


def transformers_config(model_type: str, **overrides):
    return AutoConfig.for_model(model_type, **{**SMALL, **FAMILIES[model_type],
                                               **overrides})  # fmt: skip


@pytest.fixture(params=sorted(FAMILIES))
def family(request, tmp_path) -> tuple[str, Path]:
    """A family's config.json, written by transformers' own config class."""
    transformers_config(request.param).save_pretrained(tmp_path)
    return request.param, tmp_path


def test_family_round_trip_through_transformers(family):
    model_type, path = family
    original = json.loads((path / "config.json").read_text())
    spec = spec_from_hf_config_file(path)
    assert spec.model_type == model_type
    assert spec.name == model_type.replace("_", "-")

    written = hf_config_from_spec(spec)
    assert written["model_type"] == model_type
    assert written["dtype"] == "bfloat16"
    reloaded = type(AutoConfig.for_model(model_type)).from_dict(written)
    # Every key that can change the forward pass reads back the same.
    for key, value in original.items():
        if key in IGNORED or key == "architectures":
            continue
        if key == "head_dim" and value is None:  # null means hidden / heads
            value = original["hidden_size"] // original["num_attention_heads"]
        assert getattr(reloaded, key) == value, key
    # And the spec itself survives the trip.
    assert hf_fields(spec_from_hf_config(written)) == hf_fields(spec)


def test_family_specific_facts():
    specs = {
        mt: spec_from_hf_config(transformers_config(mt).to_dict()) for mt in FAMILIES
    }
    llama = specs["llama"]
    assert llama.attention.qkv_bias and llama.attention.o_bias
    assert llama.tie_word_embeddings
    assert llama.rope.scaling.type == "llama3" and llama.rope.theta == 500000.0
    assert specs["mistral"].layer_attention_types() == ["sliding_attention"] * 4
    assert specs["mistral"].attention.sliding_window == 128
    # Qwen2: bias on q/k/v only (hard-coded by the family), sliding from layer 2 on.
    qwen2 = specs["qwen2"]
    assert (qwen2.attention.qkv_bias, qwen2.attention.o_bias) == (True, False)
    assert (
        qwen2.layer_attention_types()
        == ["full_attention"] * 2 + ["sliding_attention"] * 2
    )
    assert specs["qwen3"].attention.qk_norm and specs["qwen3_moe"].attention.qk_norm
    assert specs["qwen3"].rope.scaling.type == "yarn"
    qwen3_moe = specs["qwen3_moe"]
    assert [qwen3_moe.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
    assert qwen3_moe.checkpoint.layout == "qwen"
    qwen2_moe = specs["qwen2_moe"].mlp.moe
    assert qwen2_moe.num_shared_experts == 1 and qwen2_moe.shared_expert_gate
    assert qwen2_moe.shared_expert_intermediate_size == 48
    assert [specs["qwen2_moe"].is_moe_layer(i) for i in range(4)] == [
        False, True, False, True,
    ]  # fmt: skip
    mixtral = specs["mixtral"]
    assert mixtral.mlp.moe.expert_intermediate_size == 96
    assert mixtral.mlp.moe.router.norm_topk_prob
    assert mixtral.checkpoint.layout == "mixtral"
    v2 = specs["deepseek_v2"]
    assert v2.attention.type == "mla" and v2.attention.mla.q_lora_rank is None
    assert v2.rope.interleaved and not v2.mlp.moe.router.bias_correction
    assert v2.mlp.moe.router.num_groups == 2 and v2.mtp is None
    oss = specs["gpt_oss"]
    assert oss.attention.sinks and oss.attention.qkv_bias and oss.attention.o_bias
    assert oss.layer_attention_types() == ["sliding_attention", "full_attention"] * 2
    assert oss.rope.scaling.type == "yarn" and oss.rope.scaling.truncate is False
    moe = oss.mlp.moe
    assert (moe.swiglu_alpha, moe.swiglu_limit) == (1.702, 7.0)
    assert moe.expert_bias and moe.router.bias and moe.router.norm_topk_prob
    assert moe.expert_intermediate_size == 96  # the class's intermediate_size
    assert oss.checkpoint.layout == "gpt_oss" and oss.checkpoint.fused == ["experts"]
    assert oss.checkpoint.experts_format == "gpt_oss"
    v3 = specs["deepseek_v3"]
    router = v3.mlp.moe.router
    assert (router.scoring, router.bias_correction) == ("sigmoid", True)
    assert v3.mtp is not None and v3.mtp.num_heads == 1 and v3.mtp.mlp == "moe"
    assert v3.rope.scaling.mscale_all_dim == 1.0
    assert v3.checkpoint.layout == "deepseek"
    for gemma in ("gemma", "gemma2", "gemma3_text", "vaultgemma"):
        spec = specs[gemma]
        assert spec.scale_embedding and spec.norm.unit_offset, gemma
        assert spec.activation == "gelu_pytorch_tanh", gemma
    assert specs["gemma"].norm.placement == "pre"
    assert specs["gemma"].attention.query_pre_attn_scalar is None
    gemma2 = specs["gemma2"]
    assert gemma2.norm.placement == "sandwich"
    assert gemma2.attention.logit_softcap == 0.25 and gemma2.final_logit_softcap == 3.0
    assert gemma2.attention.query_pre_attn_scalar == 8
    assert gemma2.layer_attention_types() == ["sliding_attention", "full_attention"] * 2
    gemma3 = specs["gemma3_text"]
    assert gemma3.attention.qk_norm and gemma3.norm.placement == "sandwich"
    assert gemma3.attention.logit_softcap is None
    assert (gemma3.rope.theta, gemma3.rope.scaling.type) == (1e6, "linear")
    assert gemma3.rope.sliding.theta == 10000.0 and gemma3.rope.sliding.scaling is None
    glm4 = specs["glm4"]
    assert glm4.norm.placement == "sandwich" and glm4.rope.interleaved
    assert glm4.attention.partial_rotary_factor == 0.5
    assert (glm4.attention.qkv_bias, glm4.attention.o_bias) == (True, False)
    assert glm4.checkpoint.fused == ["gate_up_proj"]
    assert [
        glm4.tensor_path(role).rsplit(".", 1)[1]
        for role in ("attention_output_norm", "mlp_input_norm", "mlp_output_norm")
    ] == ["post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"]
    vault = specs["vaultgemma"]
    assert vault.norm.placement == "pre"
    assert vault.tensor_path("post_attention_norm").endswith(
        "pre_feedforward_layernorm"
    )
    for mt in ("granite", "granitemoe", "granitemoeshared"):
        granite = specs[mt]
        assert (granite.embedding_multiplier, granite.residual_multiplier) == (
            12.0,
            0.22,
        )
        assert granite.logits_scaling == 16.0
        assert granite.attention.softmax_scale == 0.0625
    assert specs["granite"].checkpoint == specs["llama"].checkpoint
    for mt in ("granitemoe", "granitemoeshared"):
        moe = specs[mt]
        assert moe.checkpoint.layout == "granite"
        assert "experts" in moe.checkpoint.fused
        assert moe.mlp.moe.router.norm_topk_prob  # softmax of the top-k logits
        assert moe.mlp.moe.expert_intermediate_size == 96  # intermediate_size
    assert specs["granitemoe"].checkpoint.fused == ["experts"]
    assert specs["granitemoeshared"].checkpoint.fused == [
        "shared_gate_up_proj",
        "experts",
    ]
    shared = specs["granitemoeshared"].mlp.moe
    assert shared.num_shared_experts == 1
    assert shared.shared_expert_intermediate_size == 48
    assert specs["granitemoe"].mlp.moe.num_shared_experts == 0


def test_a_default_softmax_scale_reads_as_null_and_is_written_out():
    # Granite's class defaults attention_multiplier to 1.0, not 1/sqrt(head_dim).
    config = transformers_config("granite", attention_multiplier=16**-0.5)
    spec = spec_from_hf_config(config.to_dict())
    assert spec.attention.softmax_scale is None  # hidden 64 / 4 heads
    written = hf_config_from_spec(spec)
    assert written["attention_multiplier"] == 0.25
    # A new model type writes nothing where a multiplier is neutral.
    data = spec.model_dump(mode="json") | {"model_type": "novel_granite"}
    data["architecture"] = "NovelGraniteForCausalLM"
    written = hf_config_from_spec(ModelSpec.model_validate(data))
    assert "attention_multiplier" not in written
    assert written["embedding_multiplier"] == 12.0


def test_a_softmax_scale_is_refused_for_mla():
    config = transformers_config("deepseek_v2").to_dict()
    config.update(model_type="novel_mla", attention_multiplier=0.1)
    message = refusal(config)
    assert "attention_multiplier=0.1: not expressible for MLA" in message


def test_deepseek_v3_config_tells_vllm_about_the_router_bias():
    spec = spec_from_hf_config(transformers_config("deepseek_v3").to_dict())
    written = hf_config_from_spec(spec)
    # transformers 5 writes neither key; without them vLLM builds no
    # e_score_correction_bias and routes by softmax (docs/vllm-cpu-notes.md).
    assert written["topk_method"] == "noaux_tc"
    assert written["scoring_func"] == "sigmoid"


def test_qwen3_moe_expresses_first_k_dense_as_mlp_only_layers():
    spec = spec_from_hf_config(transformers_config("qwen3_moe").to_dict())
    moe = spec.mlp.moe.model_copy(update={"first_k_dense": 2, "dense_layers": []})
    spec = spec.model_copy(update={"mlp": spec.mlp.model_copy(update={"moe": moe})})
    written = hf_config_from_spec(spec)
    assert written["mlp_only_layers"] == [0, 1]
    assert "first_k_dense_replace" not in written


def test_bundled_specs_round_trip():
    for path in sorted((ROOT / "model_specs").glob("*.yaml")):
        spec = load_spec(path)
        back = spec_from_hf_config(hf_config_from_spec(spec), name=spec.name)
        assert hf_fields(back) == hf_fields(spec), path.name


def test_new_model_type_uses_canonical_names():
    spec = load_spec(ROOT / "model_specs" / "novel-launch.yaml")
    written = hf_config_from_spec(spec)
    canonical = {aliases[0] for aliases in ALIASES.values()}
    generic = {"architectures", "model_type", "dtype"}
    assert set(written) <= canonical | generic
    assert written["kv_sharing_target_layers"][40] == 36
    assert written["kv_sharing_target_layers"][:40] == [None] * 40
    assert written["n_routed_experts"] == 128
    assert written["topk_method"] == "noaux_tc"
    assert written["num_nextn_predict_layers"] == 2
    assert written["layer_types"][:4] == ["sliding_attention"] * 3 + ["full_attention"]
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}


# ---- reading configs from elsewhere ------------------------------------------------


def deepseek_v3_as_published() -> dict:
    """A DeepSeek-V3 config in the layout of the published checkpoint (legacy rope,
    remote-code keys, FP8 quantization_config), at small dims."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        "model_type": "deepseek_v3",
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "kv_lora_rank": 512,
        "max_position_embeddings": 512,
        "moe_intermediate_size": 32,
        "moe_layer_freq": 1,
        "n_group": 2,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 64,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 128,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1",
        "use_cache": True,
        "v_head_dim": 16,
        "vocab_size": 256,
    }


def test_published_deepseek_v3_layout_maps():
    spec = spec_from_hf_config(deepseek_v3_as_published(), name="dsv3")
    assert spec.name == "dsv3"
    assert spec.rope.scaling.type == "yarn" and spec.rope.scaling.factor == 40
    assert spec.mlp.moe.router.bias_correction
    assert spec.mlp.moe.router.num_groups == 2 and spec.mtp.num_heads == 1


def test_deepseek_moe_layer_freq_becomes_dense_layers():
    config = {**deepseek_v3_as_published(), "moe_layer_freq": 2, "num_hidden_layers": 6}
    # transformers' DeepseekV3 ignores moe_layer_freq; vLLM honours it: refused.
    with pytest.raises(InputError, match="dense_layers"):
        spec_from_hf_config(config)
    # A new model type states what it means: layer i >= first_k is MoE when
    # i % moe_layer_freq == 0 (DeepSeek's rule), written as dense layers.
    spec = spec_from_hf_config({**config, "model_type": "acme_moe"})
    assert [spec.is_moe_layer(i) for i in range(6)] == [
        False, False, True, False, True, False,
    ]  # fmt: skip


def test_new_model_type_with_legacy_rope_and_aliases():
    config = {
        "model_type": "acme_lm",
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "hidden_act": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-5,
        "intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 64,
        "norm_topk_prob": False,
        "rope_theta": 50000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "router_aux_loss_coef": 0.01,
        "attention_dropout": 0.1,
        "use_cache": True,
    }
    spec = spec_from_hf_config(config)
    assert spec.name == "acme-lm" and spec.architecture == "AcmeLmForCausalLM"
    assert spec.mlp.moe.num_experts == 4 and spec.attention.qk_norm
    assert spec.rope.theta == 50000.0 and spec.rope.scaling.factor == 2.0
    assert spec.attention.partial_rotary_factor == 0.5
    assert spec.activation == "gelu_pytorch_tanh" and spec.num_kv_heads == 1


def test_model_max_length_is_the_context_only_where_the_class_maps_it():
    """Kimi Linear's class maps max_position_embeddings to model_max_length;
    Cohere's config keeps it as the tokenizer's length (Command R v01: 8192 and
    131072), which the forward pass does not read: accepted, not an alias."""
    cohere = AutoConfig.for_model("cohere", **SMALL).to_dict()
    cohere.update(max_position_embeddings=8192, model_max_length=131072)
    spec = spec_from_hf_config(cohere)
    assert spec.max_position_embeddings == 8192
    assert any(k.startswith("model_max_length (") for k in accepted_keys(cohere))
    kimi = transformers_config("kimi_linear").to_dict()
    assert "max_position_embeddings" not in kimi
    kimi["model_max_length"] = 4096
    assert spec_from_hf_config(kimi).max_position_embeddings == 4096


# ---- refusals ------------------------------------------------------------------------


def refusal(config: dict, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        spec_from_hf_config(config, source="cfg.json", **kwargs)
    message = str(info.value)
    assert message.startswith("cfg.json")
    return message


def test_unmapped_fields_are_all_named():
    config = transformers_config("llama").to_dict()
    config.update(
        attn_logit_softcapping=30.0,
        mlp_bias=True,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
        hidden_act="relu",
        router_aux_loss_coef=0.5,  # training only: ignored
    )
    message = refusal(config)
    for name in ("attn_logit_softcapping", "mlp_bias", "rope_type='dynamic'", "relu"):
        assert name in message
    assert "router_aux_loss_coef" not in message


def test_a_family_without_known_facts_is_read_but_only_the_proof_accepts_it():
    # OLMo-2's config does not say its blocks are post-norm: read as Llama's
    # naming the spec is pre-norm, which its proof refuses (infer finds "post",
    # tests/test_prove.py). No list of families refuses it before the proof.
    from onboard.reference.prove import ProofFailed, prove_spec

    config = AutoConfig.for_model("olmo2", **SMALL).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.norm.placement == "pre"
    with pytest.raises(ProofFailed):
        prove_spec(spec, config)


@pytest.mark.parametrize(
    ("model_type", "override", "named"),
    [
        # transformers' DeepseekV3 always adds the bias; vLLM would not.
        ("deepseek_v3", {"topk_method": "greedy"}, "bias_correction"),
        ("deepseek_v3", {"scoring_func": "softmax"}, "scoring"),
        # transformers' DeepseekV2 never renormalises; vLLM would.
        ("deepseek_v2", {"norm_topk_prob": True}, "norm_topk_prob"),
    ],
)
def test_config_contradicting_its_family_is_refused(model_type, override, named):
    config = {**transformers_config(model_type).to_dict(), **override}
    message = refusal(config)
    assert named in message and "computes" in message


def test_a_router_method_the_family_lacks_is_refused():
    # transformers' DeepseekV2 router has greedy and group_limited_greedy only
    # (noaux_tc leaves it without weights); vLLM would add a bias correction.
    config = {**transformers_config("deepseek_v2").to_dict(), "topk_method": "noaux_tc"}
    message = refusal(config)
    assert "topk_method='noaux_tc'" in message
    assert "implements only greedy, group_limited_greedy" in message


def test_new_model_type_must_state_what_has_no_default():
    config = {
        "model_type": "acme_lm",
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "intermediate_size": 128,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 64,
        "max_window_layers": 1,
        "sliding_window": 16,
    }
    message = refusal(config)
    for name in ("tie_word_embeddings", "hidden_act", "norm_topk_prob",
                 "max_window_layers"):  # fmt: skip
        assert name in message


def test_unsafe_strings_are_refused_with_the_source_named():
    config = transformers_config("llama").to_dict()
    config["architectures"] = ["os.system('x')"]
    assert "architecture" in refusal(config)
    assert "name" in refusal(transformers_config("llama").to_dict(), name="Bad Name")
    new = {**deepseek_v3_as_published(), "model_type": "x; import os"}
    assert "model_type" in refusal(new)


def test_writer_refuses_what_the_family_cannot_express():
    spec = spec_from_hf_config(transformers_config("llama").to_dict())
    att = spec.attention.model_copy(update={"qk_norm": True})
    with pytest.raises(InputError) as info:
        hf_config_from_spec(spec.model_copy(update={"attention": att}))
    assert "attention.qk_norm" in str(info.value)
    assert "cannot express" in str(info.value)


# ---- vLLM reads what we write --------------------------------------------------------

_PLAIN = re.compile(r"\bconfig\.([a-z_0-9]+)")
_GETATTR = re.compile(
    r"getattr\(\s*(?:self\.)?config,\s*\"([a-z_0-9]+)\",\s*([^()]+?)\)"
)


# Read by vLLM only on a branch these configs do not take (llama.py reads
# sliding_window only when layer_types is set; deepseek_v2.py the indexer's keys
# only when the config has index_topk).
_BRANCH_ONLY = {"sliding_window", "index_n_heads", "index_head_dim", "index_topk"}
# Per family: vLLM's qwen3_5.py (dense and MoE models in one module) reads
# num_experts only when the model_type names a MoE.
_FAMILY_BRANCH_ONLY = {"qwen3_5_text": {"num_experts"}}


# Families vLLM has no in-tree model of.
NOT_IN_VLLM = {"vaultgemma", "mistral4"}
# Families whose in-tree vLLM module does not import on a CPU install (vLLM's
# qwen3_5.py imports its vision model, which needs torchvision): the config is
# read by transformers' class, which vLLM's config loading returns for them, and
# checked against that module's source.
VLLM_MODULE_NEEDS_TORCHVISION = {"qwen3_5_text", "qwen3_5_moe_text"}


def _vllm_model_source(architecture: str) -> str:
    """The source of vLLM's in-tree model module for an architecture."""
    import vllm.model_executor.models as models
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    module = _TEXT_GENERATION_MODELS[architecture][0]
    if module.startswith("vllm."):
        # A hardware-isolated package (vllm/models/kimi_k3): its NVIDIA model,
        # which the package exports on this platform.
        package = Path(models.__file__).parents[2] / Path(*module.split(".")[1:])
        return (package / "nvidia" / "model.py").read_text()
    return (Path(models.__file__).parent / f"{module}.py").read_text()


@pytest.fixture
def vllm_config_classes_undone():
    """vLLM registers its own config class for some model types (Kimi Linear's)
    with transformers' AutoConfig when it reads such a config, and for
    deepseek_v32 registers transformers' DeepseekV3Config, setting its
    model_type to deepseek_v32: undo both, so that later tests build (and save)
    transformers' own classes."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,
        CONFIG_MAPPING_NAMES,
    )

    saved = dict(CONFIG_MAPPING._extra_content)
    yield
    own_type = {name: model_type for model_type, name in CONFIG_MAPPING_NAMES.items()}
    for cls in CONFIG_MAPPING._extra_content.values():
        if cls.__name__ in own_type and cls.__module__.startswith("transformers."):
            cls.model_type = own_type[cls.__name__]
    CONFIG_MAPPING._extra_content.clear()
    CONFIG_MAPPING._extra_content.update(saved)


def test_vllm_reads_every_family_config(family, tmp_path, vllm_config_classes_undone):
    from vllm.config import ModelConfig

    model_type, path = family
    spec = spec_from_hf_config_file(path)
    out = tmp_path / "written"
    out.mkdir()
    written = hf_config_from_spec(spec)
    (out / "config.json").write_text(json.dumps(written))
    if model_type in VLLM_MODULE_NEEDS_TORCHVISION:
        hf_config = AutoConfig.from_pretrained(out)
    else:
        hf_config = ModelConfig(model=str(out), skip_tokenizer_init=True).hf_config
    assert hf_config.architectures == [spec.architecture]
    if model_type in NOT_IN_VLLM:  # served by the generated plugin only
        with pytest.raises(KeyError):
            _vllm_model_source(spec.architecture)
        return

    source = _vllm_model_source(spec.architecture)
    mapped = {key for aliases in ALIASES.values() for key in aliases}
    guarded = set(re.findall(r"hasattr\(config, \"(\w+)\"\)", source))
    # Plain attribute reads must resolve (no AttributeError in vLLM).
    unread = _BRANCH_ONLY | _FAMILY_BRANCH_ONLY.get(model_type, set())
    for key in set(_PLAIN.findall(source)) & mapped - guarded - unread:
        assert hasattr(hf_config, key), f"vLLM reads config.{key}"
    # Where vLLM falls back to a default, that default must mean the same model.
    for key, default in _GETATTR.findall(source):
        if key not in mapped or hasattr(hf_config, key):
            continue
        try:
            value = ast.literal_eval(default.strip())
        except (ValueError, SyntaxError):
            continue
        assumed = {**written, key: value}
        assert hf_fields(spec_from_hf_config(assumed)) == hf_fields(spec), key


# ---- the CLI -------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ONBOARD), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cli_from_hf_writes_a_spec_that_checks(tmp_path):
    transformers_config("deepseek_v3").save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "spec.yaml"
    result = run_cli("spec", "from-hf", tmp_path / "ckpt", "-o", out, "--name", "ds")
    assert result.returncode == 0, result.stderr
    assert "DeepseekV3ForCausalLM" in result.stdout
    assert load_spec(out).name == "ds"
    # config.json states no licence: the spec does not invent one.
    assert load_spec(out).license is None
    assert "set `license:` to the weights' own" in " ".join(
        line.lstrip("# ") for line in out.read_text().splitlines()
    )
    assert run_cli("spec", "check", out).returncode == 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ('{"model_type": "llama",\n  "vocab_size": }', ":2:17: invalid JSON"),
        # Every family is proven: transformers' Llama rotates whole heads,
        # whatever rope_parameters.partial_rotary_factor says.
        (
            json.dumps(
                AutoConfig.for_model(
                    "llama",
                    **SMALL,
                    rope_parameters={
                        "rope_type": "default",
                        "partial_rotary_factor": 0.5,
                    },
                ).to_dict()
            ),
            "first divergence: layer 0, attention",
        ),
        (
            # (DeepSeek-V3's class computes no soft-cap; the spec rule refuses it
            # beside MLA for any config: test_spec_loader)
            json.dumps({**deepseek_v3_as_published(), "attn_logit_softcapping": 3.0}),
            "attention.logit_softcap: the config says 3.0, but transformers' "
            "DeepseekV3Config (deepseek_v3) computes None",
        ),
        # A wrapper around a language model onboard proves, whose checkpoint
        # form is not expressible, is refused naming why.
        (
            json.dumps(AutoConfig.for_model("llama4").to_dict()),
            "model_type 'llama4': a wrapper of a family onboard proves "
            "('llama4_text'), but its checkpoint keeps the language model's "
            "lm_head under the wrapper",
        ),
    ],
)
def test_cli_from_hf_bad_input_exits_2(tmp_path, content, expected):
    config = tmp_path / "config.json"
    if content is not None:
        config.write_text(content)
    out = tmp_path / "spec.yaml"
    result = run_cli("spec", "from-hf", config, "-o", out)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_docs_list_every_alias_family_and_ignored_key():
    from onboard.spec.hf import FAMILIES as VERIFIED
    from onboard.spec.hf import NEUTRAL

    text = (ROOT / "docs" / "hf-mapping.md").read_text()
    keys = {key for aliases in ALIASES.values() for key in aliases}
    for key in sorted(keys | IGNORED | set(NEUTRAL) | set(VERIFIED)):
        assert f"`{key}`" in text or f"| {key} |" in text, key
