"""The generated Hugging Face reference earns trust independently of vLLM.

Per feature: a small random model of a transformers family that has the feature is
saved by transformers itself; the spec is inferred from its config.json
(:func:`onboard.spec.hf.spec_from_hf_config`), the reference is generated and
installed into the same directory, loaded with ``trust_remote_code``, and its
logits must match transformers' own class on the same weights (float32, within
1e-4 relative to the largest logit). What no transformers family has is checked
directly: a KV-sharing layer's own K/V tensors must not matter while its target's
do (property test), and each MTP head must equal its formula computed in this file.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.reference import generate_hf_reference, install_reference
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.loader import parse_spec_text
from onboard.spec.model import ModelSpec

RTOL = 1e-4
VOCAB = 256
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def load_reference(ckpt: Path) -> torch.nn.Module:
    model, info = AutoModelForCausalLM.from_pretrained(
        ckpt, trust_remote_code=True, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    return model.eval()


def check_against_transformers(
    tmp_path: Path,
    hf_model: torch.nn.Module,
    seq: int = 24,
    spec: ModelSpec | None = None,
) -> ModelSpec:
    """Save ``hf_model``, install the reference next to it, compare logits."""
    ckpt = tmp_path / "ckpt"
    hf_model.eval().save_pretrained(ckpt)
    if spec is None:
        config = json.loads((ckpt / "config.json").read_text())
        spec = spec_from_hf_config(config)
    else:  # a spec of a new model type: its own config.json replaces the family's
        (ckpt / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    # The class really is the generated one, not transformers' own.
    assert type(ref).__name__ == spec.architecture
    assert type(ref).__module__.startswith("transformers_modules.")
    assert type(ref).__module__.endswith(f"modeling_{spec.module_name}")

    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(ids).logits
        got = ref(ids).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < RTOL, f"logits differ by {rel:.2e} of the largest logit"
    return spec


def randomize(model: torch.nn.Module, names: tuple[str, ...], std: float) -> None:
    """Give zero-initialised tensors (router biases) random values."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(names):
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


# ---- dense attention families --------------------------------------------------------


def test_llama_gqa_llama3_rope_tied_embeddings(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **SMALL,
        num_hidden_layers=2,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    spec = check_against_transformers(tmp_path, LlamaForCausalLM(config))
    assert spec.tie_word_embeddings and spec.rope.scaling.type == "llama3"
    assert spec.num_kv_heads < spec.attention.num_heads


def test_llama_linear_rope_and_all_biases(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **SMALL,
        num_hidden_layers=2,
        attention_bias=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    )
    model = LlamaForCausalLM(config)
    randomize(model, ("proj.bias",), 0.1)  # biases start at zero
    spec = check_against_transformers(tmp_path, model)
    assert spec.attention.qkv_bias and spec.attention.o_bias
    assert spec.rope.scaling.type == "linear"


def test_qwen3_qk_norm_and_yarn_rope(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        **SMALL,
        num_hidden_layers=2,
        head_dim=16,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    model = Qwen3ForCausalLM(config)
    randomize(model, ("q_norm.weight", "k_norm.weight"), 1.0)  # norms start at one
    spec = check_against_transformers(tmp_path, model)
    assert spec.attention.qk_norm and spec.rope.scaling.type == "yarn"


def test_exaone4_post_norms_and_qk_norm(tmp_path):
    """Post-norm blocks (norm.placement post): x + norm(attn(x)), x + norm(mlp(x))."""
    from transformers import Exaone4Config, Exaone4ForCausalLM

    torch.manual_seed(0)
    config = Exaone4Config(
        **SMALL,
        num_hidden_layers=2,
        head_dim=16,
        sliding_window=None,  # with a window its full layers are NoPE
        layer_types=["full_attention"] * 2,
    )
    model = Exaone4ForCausalLM(config)
    # Norms start at one, where a misplaced norm can hide: make them matter.
    randomize(model, ("layernorm.weight", "q_norm.weight", "k_norm.weight"), 1.0)
    spec = check_against_transformers(tmp_path, model)
    assert spec.norm.placement == "post" and spec.attention.qk_norm
    ref = load_reference(tmp_path / "ckpt")
    layer = ref.model.layers[0]
    assert not hasattr(layer, "input_layernorm")
    assert hasattr(layer, "post_feedforward_layernorm")


def test_qwen2_qkv_bias_and_mixed_sliding_window(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        **SMALL,
        num_hidden_layers=3,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
    model = Qwen2ForCausalLM(config)
    randomize(model, ("proj.bias",), 0.1)
    spec = check_against_transformers(tmp_path, model, seq=24)  # 24 > window
    assert spec.attention.qkv_bias and not spec.attention.o_bias
    assert spec.layer_attention_types() == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
    ]


def test_mistral_sliding_window_on_every_layer(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=6)
    spec = check_against_transformers(tmp_path, MistralForCausalLM(config), seq=20)
    assert set(spec.layer_attention_types()) == {"sliding_attention"}


def test_partial_rotary_and_layernorm_against_stablelm(tmp_path):
    """No verified family has partial rope, so the spec is a new model type with
    StableLM's block (LayerNorm with bias, rope on part of each head, q/k/v bias)
    and its checkpoint names; transformers' StableLM computes the expected logits."""
    from transformers import StableLmConfig, StableLmForCausalLM

    torch.manual_seed(0)
    config = StableLmConfig(
        **SMALL,
        num_hidden_layers=2,
        hidden_act="silu",
        layer_norm_eps=1e-5,
        partial_rotary_factor=0.5,
        use_qkv_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = StableLmForCausalLM(config)
    randomize(model, ("proj.bias", "layernorm.bias", "norm.bias"), 0.1)
    spec = ModelSpec.model_validate(
        {
            "name": "partial-ref",
            "architecture": "PartialRefForCausalLM",
            "model_type": "partial_ref",
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "max_position_embeddings": 256,
            "norm": {"type": "layernorm", "eps": 1e-5},
            "attention": {
                "num_heads": 4,
                "num_kv_heads": 2,
                "qkv_bias": True,
                "partial_rotary_factor": 0.5,
            },
            "rope": {"theta": 10000.0},
            "mlp": {"intermediate_size": 96},
        }
    )
    check_against_transformers(tmp_path, model, spec=spec)


def _gemma3_model():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        **SMALL,
        num_hidden_layers=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
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
    )
    model = Gemma3ForCausalLM(config)
    # Gemma's norms start at zero (they scale by 1 + weight): make them matter.
    randomize(model, ("norm.weight", "layernorm.weight"), 0.5)
    return model


def test_gemma3_sandwich_norms_and_a_rope_per_layer_kind(tmp_path):
    """Gemma-3's block read from its config: sandwich norms that scale by
    1 + weight, per-head q/k norms, scaled embeddings, its softmax scale, final
    soft-cap, and the sliding layers rotating with their own theta."""
    model = _gemma3_model()
    spec = check_against_transformers(tmp_path, model, seq=24)  # 24 > window
    assert spec.norm.placement == "sandwich" and spec.norm.unit_offset
    assert spec.rope.sliding.theta == 10000.0
    layer = load_reference(tmp_path / "ckpt").model.layers[0]
    assert hasattr(layer, "pre_feedforward_layernorm")
    assert hasattr(layer, "post_feedforward_layernorm")


@pytest.mark.parametrize(
    "drop",
    [
        None,
        "rope.sliding",
        "norm.unit_offset",
        "scale_embedding",
        "final_logit_softcap",
    ],
)
def test_gemma3_block_as_a_new_model_type(tmp_path, drop):
    """The same block under a new model type: its own config.json states every
    part (scale_embedding, norm_unit_offset, rope_parameters per layer type, ...)
    and the reference reads them there. Each part matters: without it the logits
    are not Gemma-3's."""
    model = _gemma3_model()
    config = json.loads(json.dumps(model.config.to_dict()))
    data = spec_from_hf_config(config).model_dump(mode="json")
    data.update(name="gemma-like", architecture="GemmaLikeForCausalLM")
    data["model_type"] = "gemma_like"
    data["checkpoint"] = {}
    if drop is not None:
        *parents, leaf = drop.split(".")
        target = data
        for key in parents:
            target = target[key]
        target[leaf] = False if isinstance(target[leaf], bool) else None
    spec = ModelSpec.model_validate(data)
    written = hf_config_from_spec(spec)
    assert written["norm_placement"] == "sandwich"
    assert ("scale_embedding" in written) == (drop != "scale_embedding")
    if drop is None:
        check_against_transformers(tmp_path, model, seq=24, spec=spec)
    else:
        with pytest.raises(AssertionError, match="logits differ"):
            check_against_transformers(tmp_path, model, seq=24, spec=spec)


# ---- mixture of experts --------------------------------------------------------------


def test_mixtral_softmax_topk_renormalised(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(
        **SMALL, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2
    )
    spec = check_against_transformers(tmp_path, MixtralForCausalLM(config))
    assert spec.checkpoint.layout == "mixtral"
    assert spec.mlp.moe.router.norm_topk_prob


def test_qwen3_moe_norm_topk_and_dense_layer(tmp_path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        **SMALL,
        num_hidden_layers=3,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    )
    spec = check_against_transformers(tmp_path, Qwen3MoeForCausalLM(config))
    assert spec.mlp.moe.router.norm_topk_prob and spec.mlp.moe.dense_layers == [1]


def test_qwen2_moe_gated_shared_expert_every_other_layer(tmp_path):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        **SMALL,
        num_hidden_layers=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
        norm_topk_prob=False,
    )
    model = Qwen2MoeForCausalLM(config)
    randomize(model, ("proj.bias",), 0.1)
    spec = check_against_transformers(tmp_path, model)
    moe = spec.mlp.moe
    assert moe.shared_expert_gate and moe.layer_frequency == 2
    assert not moe.router.norm_topk_prob


# ---- multi-head latent attention (DeepSeek) ------------------------------------------

MLA = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    max_position_embeddings=256,
)


def test_granite_multipliers_fused_experts_and_shared_mlp(tmp_path):
    # Granite-MoE-Shared: embeddings, residual branches and logits scaled, its own
    # softmax scale, each layer's experts stacked in two tensors and a fused
    # shared expert beside the MoE block. Once as its transformers family, once
    # as a new model type (the canonical keys, written where not neutral).
    from transformers import GraniteMoeSharedConfig, GraniteMoeSharedForCausalLM

    torch.manual_seed(0)
    config = GraniteMoeSharedConfig(
        **SMALL,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=48,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        logits_scaling=16.0,
        attention_multiplier=0.0625,
    )
    model = GraniteMoeSharedForCausalLM(config)
    spec = check_against_transformers(tmp_path / "family", model)
    assert spec.checkpoint.fused == ["shared_gate_up_proj", "experts"]
    assert spec.mlp.moe.num_shared_experts == 1
    data = spec.model_dump(mode="json") | {
        "name": "novel-granite",
        "model_type": "novel_granite",
        "architecture": "NovelGraniteForCausalLM",
    }
    novel = ModelSpec.model_validate(data)
    written = hf_config_from_spec(novel)
    assert written["attention_multiplier"] == 0.0625
    assert written["shared_expert_intermediate_size"] == 48
    check_against_transformers(tmp_path / "novel", model, spec=novel)


def test_deepseek_v3_mla_yarn_grouped_sigmoid_router(tmp_path):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(
        **MLA,
        q_lora_rank=24,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    )
    model = DeepseekV3ForCausalLM(config)
    # The correction bias starts at zero; give it the scores' spread so it changes
    # which experts are chosen.
    randomize(model, ("e_score_correction_bias",), 0.05)
    spec = check_against_transformers(tmp_path, model)
    router = spec.mlp.moe.router
    assert (router.scoring, router.bias_correction, router.num_groups) == (
        "sigmoid",
        True,
        4,
    )
    assert spec.attention.mla.q_lora_rank == 24 and spec.rope.interleaved


def _gpt_oss(swiglu_limit: float = 7.0):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(
        **SMALL | dict(intermediate_size=32),
        num_hidden_layers=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        swiglu_limit=swiglu_limit,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 16,
        },
    )
    model = GptOssForCausalLM(config)
    # Sinks and expert biases start near zero; the gate/up weights are scaled so
    # that the clamp of the clamped SwiGLU cuts many gate and up values.
    randomize(model, ("sinks",), 1.0)
    randomize(model, ("_bias", ".bias"), 0.1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(40.0)
    return model


def test_gpt_oss_sinks_stacked_experts_clamped_swiglu(tmp_path):
    """Sinks in every softmax, sliding and full layers alternating, yarn with an
    unrounded correction range, a biased router, and stacked experts with biases
    whose gate and up columns interleave, through the clamped SwiGLU: the
    reference, with the sinks and the clamp acting, gives transformers' logits."""
    model = _gpt_oss()
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        unclamped = _gpt_oss(swiglu_limit=1e9).eval()(ids).logits
        clamped = model.eval()(ids).logits
    # The clamp acts on these weights (else the test would not see it).
    assert (unclamped - clamped).abs().max() > 1e-2 * clamped.abs().max()
    # So do the sinks: without them (a logit of -1e4 takes no share of any
    # softmax) the logits move.
    sinkless = _gpt_oss()
    with torch.no_grad():
        for layer in sinkless.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        no_sinks = sinkless.eval()(ids).logits
    assert (no_sinks - clamped).abs().max() > 1e-2 * clamped.abs().max()
    spec = check_against_transformers(tmp_path, model)
    moe = spec.mlp.moe
    assert spec.attention.sinks and spec.rope.scaling.truncate is False
    assert moe.expert_bias and moe.router.bias and moe.swiglu_limit == 7.0
    assert spec.checkpoint.experts_format == "gpt_oss"
    assert spec.layer_attention_types() == [
        "sliding_attention",
        "full_attention",
    ]


@pytest.mark.parametrize("topk_method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_mla_without_q_lora_softmax_router(tmp_path, topk_method):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(0)
    groups = {"n_group": 4, "topk_group": 2} if topk_method != "greedy" else {}
    config = DeepseekV2Config(
        **MLA,
        q_lora_rank=None,
        n_shared_experts=2,
        topk_method=topk_method,
        routed_scaling_factor=1.5,
        **groups,
    )
    spec = check_against_transformers(tmp_path, DeepseekV2ForCausalLM(config))
    router = spec.mlp.moe.router
    assert spec.attention.mla.q_lora_rank is None and router.scoring == "softmax"
    assert not router.norm_topk_prob and not router.bias_correction


# ---- sparse MLA: the lightning indexer (DeepSeek-V3.2, GLM-5) ------------------------

TOPK = 8


def _sparse_mla(model_type: str, seed: int = 0, **overrides):
    """A tiny transformers model of a sparse-MLA family: index rope on 8 of 24 dims,
    the correction bias and the k_norm's bias randomised."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type,
        **{**MLA, **overrides},
        q_lora_rank=24,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        index_n_heads=4,
        index_head_dim=24,
        index_topk=TOPK,
        pad_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, ("e_score_correction_bias",), 0.05)
    randomize(model, ("indexer.k_norm.bias",), 0.1)
    return model


@pytest.mark.parametrize("seq", [6, 8, 24])
@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_mla_indexer_against_transformers(tmp_path, model_type, seq):
    # Contexts shorter than, equal to and longer than the indexer's top-k; index
    # rope in NeoX halves (DeepSeek-V3.2) or interleaved pairs (GLM-5).
    spec = check_against_transformers(tmp_path, _sparse_mla(model_type), seq=seq)
    indexer = spec.attention.indexer
    assert (indexer.num_heads, indexer.head_dim, indexer.topk) == (4, 24, TOPK)
    assert indexer.rope_interleave == (model_type == "glm_moe_dsa")


def test_glm_shared_indexer_layers_against_transformers(tmp_path):
    # Layers 1 and 2 run no indexer: they attend to layer 0's picks.
    model = _sparse_mla("glm_moe_dsa", indexer_types=["full", "shared", "shared"])
    spec = check_against_transformers(tmp_path, model)
    assert spec.attention.indexer.shared_layers == [1, 2]


def test_sparse_mla_caches_its_index_keys(tmp_path):
    """Cached decoding past the top-k equals a full recompute: the index keys of
    earlier tokens come from the cache."""
    ckpt = tmp_path / "ckpt"
    # A shared layer between two indexers: its top-k is the first one's.
    kinds = ["full", "shared", "full"]
    _sparse_mla("glm_moe_dsa", indexer_types=kinds).save_pretrained(ckpt)
    spec = spec_from_hf_config(json.loads((ckpt / "config.json").read_text()))
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :12], use_cache=True)
        rest = ref(ids[:, 12:], past_key_values=first.past_key_values, use_cache=True)
    assert (rest.logits - full[:, 12:]).abs().max() / full.abs().max() < RTOL


def test_sparse_mla_within_topk_is_exactly_dense_mla(tmp_path):
    """On the same weights, a context no longer than the top-k gives every layer
    the dense MLA reference's attention output bit for bit (every key is picked);
    a longer one differs."""
    from safetensors.torch import load_file

    sparse = tmp_path / "sparse"
    # Dense MLPs below the last layer: every attention sees the same input.
    _sparse_mla("deepseek_v32", first_k_dense_replace=2).save_pretrained(sparse)
    spec = spec_from_hf_config(json.loads((sparse / "config.json").read_text()))
    install_reference(spec, sparse)
    data = spec.model_dump(mode="json")
    data["attention"]["indexer"] = None
    data.update(model_type="dense_mla", architecture="DenseMlaForCausalLM")
    dense_spec = ModelSpec.model_validate(data)
    dense = tmp_path / "dense"
    dense.mkdir()
    weights = {
        k: v
        for k, v in load_file(sparse / "model.safetensors").items()
        if ".indexer." not in k
    }
    save_file(weights, dense / "model.safetensors", metadata={"format": "pt"})
    (dense / "config.json").write_text(json.dumps(hf_config_from_spec(dense_spec)))
    install_reference(dense_spec, dense)

    def attention_outputs(model, ids) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        hooks = [
            layer.self_attn.register_forward_hook(lambda m, i, o: outs.append(o))
            for layer in model.model.layers
        ]
        with torch.no_grad():
            model(ids)
        for hook in hooks:
            hook.remove()
        return outs

    with_indexer, without = load_reference(sparse), load_reference(dense)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    short = zip(
        attention_outputs(with_indexer, ids[:, :TOPK]),
        attention_outputs(without, ids[:, :TOPK]),
        strict=True,
    )
    assert all(torch.equal(a, b) for a, b in short)
    long = attention_outputs(with_indexer, ids)[0] - attention_outputs(without, ids)[0]
    assert long[:, TOPK:].abs().max() > 1e-3
    assert torch.equal(long[:, :TOPK], torch.zeros_like(long[:, :TOPK]))


# ---- what no transformers family has: the novel-launch architecture ------------------


@pytest.fixture(scope="module")
def novel(tmp_path_factory) -> tuple[ModelSpec, Path]:
    """The bundled novel-launch spec's tiny float32 checkpoint, reference installed."""
    from onboard.spec import load_spec

    spec = load_spec(Path(__file__).parents[1] / "model_specs/novel-launch.yaml")
    ckpt = tmp_path_factory.mktemp("novel") / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    return spec, ckpt


def test_novel_reference_loads_every_tensor_and_generates(novel):
    spec, ckpt = novel
    ref = load_reference(ckpt)  # also asserts no missing or unexpected tensors
    config = json.loads((ckpt / "config.json").read_text())
    assert any(t is not None for t in config["kv_sharing_target_layers"])
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(3))
    start = time.monotonic()
    out = ref.generate(prompt, max_new_tokens=40, do_sample=False)
    elapsed = time.monotonic() - start
    assert out.shape == (1, 48)
    assert elapsed < 10, f"generate took {elapsed:.1f}s"
    # The KV cache (sliding layers crop theirs) gives the same logits as full
    # recompute, past the 16-token window.
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :30], use_cache=True)
        rest = ref(ids[:, 30:], past_key_values=first.past_key_values, use_cache=True)
    rel = (rest.logits - full[:, 30:]).abs().max() / full.abs().max()
    assert rel < RTOL


def test_left_padded_batch_generates_like_each_prompt_alone(novel):
    _, ckpt = novel
    ref = load_reference(ckpt)
    gen = torch.Generator().manual_seed(6)
    long, short = (
        torch.randint(3, 512, (1, 20), generator=gen),
        torch.randint(3, 512, (1, 12), generator=gen),
    )
    alone = [
        ref.generate(p, max_new_tokens=8, do_sample=False)[0, p.shape[1] :]
        for p in (long, short)
    ]
    padded = torch.cat((torch.zeros(1, 8, dtype=torch.long), short), dim=1)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :8] = 0
    batch = ref.generate(
        torch.cat((long, padded)),
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(batch[0, 20:], alone[0])
    assert torch.equal(batch[1, 20:], alone[1])


def test_mla_reference_with_mtp_caches_and_generates(tmp_path):
    """The bundled DeepSeek-V3-style spec (MLA with yarn, grouped sigmoid routing,
    one MTP head): tiny checkpoint, cached decoding equals full recompute."""
    from onboard.spec import load_spec

    spec = load_spec(Path(__file__).parents[1] / "model_specs/deepseek-v3-style.yaml")
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :16], use_cache=True)
        rest = ref(ids[:, 16:], past_key_values=first.past_key_values, use_cache=True)
        heads = ref.mtp_forward(ids)
    assert (rest.logits - full[:, 16:]).abs().max() / full.abs().max() < RTOL
    assert [h.shape for h in heads] == [(2, 23, 512)]
    assert ref.generate(ids[:1, :8], max_new_tokens=16).shape == (1, 24)


@pytest.mark.parametrize(
    "name",
    [
        "mla-no-q-lora",
        "layernorm-partial-biases",
        "mixtral-layout-with-dense-layers",
        "qwen-layout-gated-shared-expert",
        "sinks-stacked-experts",
        "granite-multipliers-fused-experts",
        "fused-experts-with-dense-layers",
    ],
)
def test_feature_variants_load_their_tiny_checkpoints(tmp_path, name):
    """The module tree matches the tensor names onboard's checkpoint writer uses
    for layouts and features no family above has (every tensor loads, none is
    left over), and cached decoding equals full recompute."""
    from test_reference_ast import variant

    spec = variant(name)
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    ids = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :12], use_cache=True)
        rest = ref(ids[:, 12:], past_key_values=first.past_key_values, use_cache=True)
    assert torch.isfinite(full).all()
    assert (rest.logits - full[:, 12:]).abs().max() / full.abs().max() < RTOL


@pytest.mark.parametrize("name", ["var-sandwich", "var-sandwich-glm"])
def test_sandwich_variants_load_their_tiny_checkpoints(tmp_path, name):
    """Gemma-3's parts (1 + weight norms start at zero, embeddings scaled, a rope
    per layer kind) and sandwich norms under GLM-4's names: every tensor of
    onboard's tiny checkpoint loads, and cached decoding, past the window, equals
    full recompute."""
    from generate_variants import variant

    spec = variant(name)
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :30], use_cache=True)
        rest = ref(ids[:, 30:], past_key_values=first.past_key_values, use_cache=True)
    assert torch.isfinite(full).all()
    assert (rest.logits - full[:, 30:]).abs().max() / full.abs().max() < RTOL


def _shard_of(ckpt: Path, name: str) -> Path:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    return ckpt / index["weight_map"][name]


def _logits_with(ckpt: Path, tmp: Path, changes: dict[str, str], seed: int):
    """Logits of a copy of ``ckpt`` whose tensors ``changes`` names are set to
    zero or have random noise added."""
    copy = tmp / f"ckpt-{len(list(tmp.iterdir()))}"
    shutil.copytree(ckpt, copy)
    gen = torch.Generator().manual_seed(seed)
    for name, how in changes.items():
        shard = _shard_of(copy, name)
        tensors = load_file(shard)
        t = tensors[name]
        noise = torch.randn(t.shape, generator=gen)
        tensors[name] = torch.zeros_like(t) if how == "zero" else t + noise
        save_file(tensors, shard, metadata={"format": "pt"})
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return load_reference(copy)(ids).logits


_UNPERTURBED: dict[str, torch.Tensor] = {}


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    pair=st.integers(min_value=0, max_value=10),
    role=st.sampled_from(["k_proj", "v_proj", "k_norm"]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_kv_sharing_layer_ignores_its_own_kv_and_reads_its_targets(
    novel, tmp_path_factory, pair, role, seed
):
    spec, ckpt = novel
    targets = json.loads((ckpt / "config.json").read_text())["kv_sharing_target_layers"]
    pairs = [(layer, t) for layer, t in enumerate(targets) if t is not None]
    layer, target = pairs[pair % len(pairs)]
    tmp = tmp_path_factory.mktemp("perturbed")

    def tensor(r: str, i: int) -> str:
        return spec.tensor_path(r).format(layer=i) + ".weight"

    def logits(changes: dict[str, str]) -> torch.Tensor:
        key = json.dumps(changes, sort_keys=True)
        if "noise" in key:
            return _logits_with(ckpt, tmp, changes, seed)
        if key not in _UNPERTURBED:  # no noise: the same for every example
            _UNPERTURBED[key] = _logits_with(ckpt, tmp, changes, seed)
        return _UNPERTURBED[key]

    own = logits({tensor(role, layer): "noise"})
    assert torch.equal(own, logits({})), "a KV-sharing layer used its own K/V"

    # With the target's output projection zeroed, its K/V reach the logits only
    # through the layers that read its cache.
    silent = {tensor("o_proj", target): "zero"}
    before = logits(silent)
    after = logits({**silent, tensor(role, target): "noise"})
    change = ((after - before).abs().max() / before.abs().max()).item()
    assert change > 1e-3, "the sharing layer did not read its target layer's K/V"


# ---- MLA with cross-layer KV sharing: no transformers family has it ----------------

MLA_SHARING_SPEC = """
name: mla-share
architecture: MlaShareForCausalLM
model_type: mla_share
vocab_size: 512
hidden_size: 64
num_hidden_layers: 3
max_position_embeddings: 256
norm: {type: rmsnorm, eps: 1.0e-06}
attention:
  type: mla
  num_heads: 4
  mla:
    q_lora_rank: 32
    kv_lora_rank: 32
    qk_nope_head_dim: 16
    qk_rope_head_dim: 8
    v_head_dim: 16
  kv_sharing: {2: 0}
rope: {theta: 10000.0}
mlp: {intermediate_size: 96}
"""


@pytest.fixture(scope="module")
def mla_sharing(tmp_path_factory) -> tuple[ModelSpec, Path]:
    spec = parse_spec_text(MLA_SHARING_SPEC, "mla-share.yaml")
    ckpt = tmp_path_factory.mktemp("mla-share") / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    return spec, ckpt


def test_mla_sharing_layer_has_no_latent_path_and_its_cache_matches(mla_sharing):
    spec, ckpt = mla_sharing
    ref = load_reference(ckpt)  # the sharing layers' kv_a tensors: ignored
    attn = [layer.self_attn for layer in ref.model.layers]
    assert json.loads((ckpt / "config.json").read_text())[
        "kv_sharing_target_layers"
    ] == [None, None, 0]
    assert not hasattr(attn[2], "kv_a_proj_with_mqa")
    assert not hasattr(attn[2], "kv_a_layernorm")
    assert hasattr(attn[1], "kv_a_proj_with_mqa")
    assert attn[2].kv_b_proj.weight.shape == attn[0].kv_b_proj.weight.shape
    assert not torch.equal(attn[2].kv_b_proj.weight, attn[0].kv_b_proj.weight)
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ref(ids).logits
        first = ref(ids[:, :30], use_cache=True)
        rest = ref(ids[:, 30:], past_key_values=first.past_key_values, use_cache=True)
    assert torch.isfinite(full).all()
    assert (rest.logits - full[:, 30:]).abs().max() / full.abs().max() < RTOL


def test_mla_sharing_layer_reads_its_targets_latent(mla_sharing, tmp_path):
    spec, ckpt = mla_sharing
    layer, target = 2, 0

    def tensor(r: str, i: int) -> str:
        return spec.tensor_path(r).format(layer=i) + ".weight"

    base = _logits_with(ckpt, tmp_path, {}, 0)
    for role in ("kv_a_proj", "kv_a_norm"):
        own = _logits_with(ckpt, tmp_path, {tensor(role, layer): "noise"}, 1)
        assert torch.equal(own, base), f"layer {layer} used its own {role}"
    # With the target's output projection zeroed, its latent reaches the logits only
    # through the layer that reads it.
    silent = {tensor("o_proj", target): "zero"}
    before = _logits_with(ckpt, tmp_path, silent, 0)
    after = _logits_with(
        ckpt, tmp_path, {**silent, tensor("kv_a_proj", target): "noise"}, 2
    )
    change = ((after - before).abs().max() / before.abs().max()).item()
    assert change > 1e-3, f"layer {layer} did not read layer {target}'s latent"
    # And its own kv_b_proj expands that latent.
    own_b = _logits_with(ckpt, tmp_path, {tensor("kv_b_proj", layer): "noise"}, 3)
    assert (own_b - base).abs().max() / base.abs().max() > 1e-3


# ---- MTP heads against their formula -------------------------------------------------

MTP_SPEC = """
name: mtp-ref
architecture: MtpRefForCausalLM
model_type: mtp_ref
vocab_size: 512
hidden_size: 64
num_hidden_layers: 2
max_position_embeddings: 256
norm: {type: rmsnorm, eps: 1.0e-06}
attention: {num_heads: 4, num_kv_heads: 2, head_dim: 16, qk_norm: true}
rope: {theta: 10000.0}
mlp: {intermediate_size: 96}
mtp: {num_heads: 2, mlp: dense}
"""


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """NeoX rope on [heads, seq, dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, dim, 2).float() / dim)
    angles = positions[:, None].float() * inv_freq
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _block(w: dict, spec: ModelSpec, layer: int, x: torch.Tensor, positions):
    """One decoder block on a single sequence x [seq, hidden], from the weights."""

    def p(role: str) -> torch.Tensor:
        return w[spec.tensor_path(role).format(layer=layer) + ".weight"]

    seq, heads, kv_heads, hd = x.shape[0], 4, 2, 16
    h = _rms(x, p("input_norm"))
    q = _rms((h @ p("q_proj").T).view(seq, heads, hd), p("q_norm")).transpose(0, 1)
    k = _rms((h @ p("k_proj").T).view(seq, kv_heads, hd), p("k_norm")).transpose(0, 1)
    v = (h @ p("v_proj").T).view(seq, kv_heads, hd).transpose(0, 1)
    q, k = _rope(q, positions), _rope(k, positions)
    k, v = k.repeat_interleave(2, dim=0), v.repeat_interleave(2, dim=0)
    scores = q @ k.transpose(-1, -2) / hd**0.5
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(seq, heads * hd)
    x = x + attn @ p("o_proj").T
    h = _rms(x, p("post_attention_norm"))
    mlp = torch.nn.functional.silu(h @ p("gate_proj").T) * (h @ p("up_proj").T)
    return x + mlp @ p("down_proj").T


def test_mtp_heads_match_their_formula(tmp_path):
    spec = parse_spec_text(MTP_SPEC, "mtp-ref.yaml")
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    ref = load_reference(ckpt)
    w = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        w.update(load_file(shard))

    def name(role: str, layer: int | None = None) -> str:
        return spec.tensor_path(role).format(layer=layer) + ".weight"

    seq = 12
    tokens = torch.randint(0, 512, (seq,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        heads = ref.mtp_forward(tokens[None])
        main_logits = ref(tokens[None]).logits[0]

    # The main model: h_{-1} is its last hidden state after the final norm.
    x = w[name("embed")][tokens]
    for layer in range(spec.num_hidden_layers):
        x = _block(w, spec, layer, x, torch.arange(seq))
    previous = _rms(x, w[name("final_norm")])
    rel = (previous @ w[name("lm_head")].T - main_logits).abs().max()
    assert rel / main_logits.abs().max() < RTOL

    assert len(heads) == spec.mtp.num_heads
    for i, got in enumerate(heads):
        layer = spec.num_hidden_layers + i
        length = seq - i - 1
        # Head i at slot t reads token t + i + 1 (at position t + i; the embedding
        # at position 0 is zeroed, as vLLM does) and h_{i-1} at slot t.
        embeds = w[name("embed")][tokens[i + 1 :]].clone()
        if i == 0:
            embeds[0] = 0
        joined = torch.cat(
            (
                _rms(embeds, w[name("mtp_enorm", layer)]),
                _rms(previous[:length], w[name("mtp_hnorm", layer)]),
            ),
            dim=-1,
        )
        h = _block(
            w, spec, layer, joined @ w[name("mtp_eh_proj", layer)].T,
            torch.arange(i, i + length),
        )  # fmt: skip
        previous = _rms(h, w[name("mtp_head_norm", layer)])
        want = previous @ w[name("mtp_head", layer)].T
        assert got.shape == (1, length, 512)
        rel = ((got[0] - want).abs().max() / want.abs().max()).item()
        assert rel < RTOL, f"MTP head {i} differs from its formula by {rel:.2e}"


def test_mtp_heads_use_their_own_weights(tmp_path):
    """Changing head 1's projection changes head 1's logits only."""
    spec = parse_spec_text(MTP_SPEC, "mtp-ref.yaml")
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0, dtype="float32")
    install_reference(spec, ckpt)
    tokens = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = load_reference(ckpt).mtp_forward(tokens)
    name = spec.tensor_path("mtp_eh_proj").format(layer=spec.num_hidden_layers + 1)
    after = _logits_after(ckpt, tmp_path, name + ".weight", tokens)
    assert torch.equal(before[0], after[0])
    assert not torch.allclose(before[1], after[1])


def _logits_after(ckpt: Path, tmp: Path, name: str, tokens) -> list[torch.Tensor]:
    shard = _shard_of(ckpt, name)
    tensors = load_file(shard)
    tensors[name] = torch.randn_like(tensors[name])
    save_file(tensors, shard, metadata={"format": "pt"})
    with torch.no_grad():
        return load_reference(ckpt).mtp_forward(tokens)


# ---- the installer -------------------------------------------------------------------


def test_install_refuses_a_checkpoint_of_another_model_type(tmp_path, novel):
    spec, _ = novel
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InputError, match="model_type is 'llama'"):
        install_reference(spec, tmp_path)
    with pytest.raises(InputError, match="no such file"):
        install_reference(spec, tmp_path / "missing")


def test_install_writes_auto_map(novel):
    spec, ckpt = novel
    config = json.loads((ckpt / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_novel_launch.NovelLaunchConfig",
        "AutoModelForCausalLM": "modeling_novel_launch.NovelLaunchForCausalLM",
    }


def test_generate_writes_both_files(tmp_path, novel):
    spec, ckpt = novel
    written = generate_hf_reference(spec, tmp_path)
    assert [p.name for p in written] == [
        "configuration_novel_launch.py",
        "modeling_novel_launch.py",
    ]
    for path in written:  # the installed copies are the same files
        assert path.read_text() == (ckpt / path.name).read_text()
