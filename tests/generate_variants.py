"""Specs for generation tests: the bundled ones plus variants that switch on (or
off) each feature a template can express, so every template branch is rendered,
linted and AST-checked, not only those the bundled specs happen to use."""

from __future__ import annotations

from pathlib import Path

from onboard.spec import load_spec, parse_spec_text
from onboard.spec.model import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p.stem for p in (ROOT / "model_specs").glob("*.yaml"))


def bundled(name: str) -> ModelSpec:
    return load_spec(ROOT / "model_specs" / f"{name}.yaml")


_BASE = """
name: {name}
architecture: {arch}
model_type: {model_type}
vocab_size: 1024
hidden_size: 256
num_hidden_layers: 4
max_position_embeddings: 4096
"""

# name -> (architecture, YAML body after the base fields)
_VARIANTS: dict[str, tuple[str, str]] = {
    # LayerNorm, GELU (tanh), MHA without head_dim, biases, partial rotary,
    # linear rope scaling, tied embeddings, every layer sliding, a dense MTP head.
    "var-layernorm-mha": (
        "VarLayernormMhaForCausalLM",
        """
tie_word_embeddings: true
activation: gelu_pytorch_tanh
norm: {type: layernorm, eps: 1.0e-05}
attention:
  num_heads: 4
  qkv_bias: true
  o_bias: true
  partial_rotary_factor: 0.5
  sliding_window: 128
rope: {theta: 10000.0, scaling: {type: linear, factor: 2.0}}
mlp: {intermediate_size: 512}
mtp: {num_heads: 1, mlp: dense}
""",
    ),
    # Interleaved rope, yarn, explicit layer types, qwen layout with a gated
    # shared expert, softmax routing without renormalisation, MoE every 2nd layer,
    # an MoE MTP head.
    "var-qwen-gated": (
        "VarQwenGatedForCausalLM",
        """
activation: gelu
attention:
  num_heads: 4
  num_kv_heads: 1
  head_dim: 64
  layer_types: [sliding_attention, full_attention, sliding_attention,
                full_attention]
  sliding_window: 64
rope:
  theta: 10000.0
  interleaved: true
  scaling: {type: yarn, factor: 4.0, original_max_position_embeddings: 1024}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    shared_expert_intermediate_size: 128
    shared_expert_gate: true
    layer_frequency: 2
    router: {scoring: softmax, norm_topk_prob: false}
mtp: {num_heads: 1, mlp: moe}
checkpoint: {layout: qwen}
""",
    ),
    # MLA without q_lora, plain rope, grouped softmax routing, explicit dense
    # layers, Mixtral expert names.
    "var-mla-nolora": (
        "VarMlaNoloraForCausalLM",
        """
attention:
  type: mla
  num_heads: 4
  mla: {kv_lora_rank: 512, qk_nope_head_dim: 32, qk_rope_head_dim: 64,
        v_head_dim: 32}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    dense_layers: [2]
    router: {scoring: softmax, num_groups: 4, topk_groups: 2}
checkpoint: {layout: mixtral}
""",
    ),
    # MLA layers reading an earlier MLA layer's latent cache (vLLM's MLAAttention
    # called directly; the plugin's runtime patch), beside MoE layers.
    "var-mla-share": (
        "VarMlaShareForCausalLM",
        """
attention:
  type: mla
  num_heads: 4
  mla: {kv_lora_rank: 512, qk_nope_head_dim: 32, qk_rope_head_dim: 64,
        v_head_dim: 32}
  kv_sharing: {2: 0, 3: 1}
rope: {theta: 10000.0, interleaved: true}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    first_k_dense: 1
    router: {scoring: softmax}
""",
    ),
    # ... with low-rank queries: a sharing layer loads q_a_proj alone.
    "var-mla-share-qlora": (
        "VarMlaShareQloraForCausalLM",
        """
attention:
  type: mla
  num_heads: 4
  mla: {q_lora_rank: 64, kv_lora_rank: 512, qk_nope_head_dim: 32,
        qk_rope_head_dim: 64, v_head_dim: 32}
  kv_sharing: {3: 1}
rope: {theta: 10000.0, interleaved: true}
mlp: {intermediate_size: 512}
""",
    ),
    # Post-norm blocks with LayerNorm (the un-fused residual path), a Mixtral MoE
    # after a dense first layer, sliding layers, and a renamed post-MLP norm.
    "var-post-norm": (
        "VarPostNormForCausalLM",
        """
norm: {type: layernorm, eps: 1.0e-05, placement: post}
attention:
  num_heads: 4
  num_kv_heads: 2
  layer_types: [sliding_attention, full_attention, sliding_attention,
                full_attention]
  sliding_window: 64
mlp:
  intermediate_size: 512
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    first_k_dense: 1
    router: {scoring: softmax, norm_topk_prob: true}
checkpoint:
  layout: mixtral
  tensor_names:
    mlp_output_norm: model.layers.{layer}.post_mlp_layernorm
""",
    ),
    # Gated DeltaNet layers with Qwen3.5's split projections and a renamed gated
    # norm beside a sliding and a full attention layer, a dense MLP, bfloat16
    # states, a dense MTP head.
    "var-hybrid-split": (
        "VarHybridSplitForCausalLM",
        """
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 64
  output_gate: true
  layer_types: [linear_attention, sliding_attention, linear_attention,
                full_attention]
  sliding_window: 64
linear_attention:
  num_key_heads: 2
  num_value_heads: 4
  key_head_dim: 64
  value_head_dim: 64
  projections: split
  state_dtype: bfloat16
mlp: {intermediate_size: 512}
mtp: {num_heads: 1, mlp: dense}
checkpoint:
  tensor_names:
    linear_norm: model.layers.{layer}.linear_attn.out_norm
""",
    ),
    # Parallel blocks with weight-only LayerNorms, q/k norms with a weight per
    # head and scaled logits (Cohere), q/k/v and gate/up stored fused (Phi-3),
    # interleaved partial rope (GLM), sliding layers whose full-attention layers
    # use no rope (Cohere-2).
    "var-parallel-fused": (
        "VarParallelFusedForCausalLM",
        """
tie_word_embeddings: true
logit_scale: 0.0625
norm: {type: layernorm, eps: 1.0e-05, placement: parallel, bias: false}
attention:
  num_heads: 4
  num_kv_heads: 2
  qk_norm: true
  qk_norm_scope: head_weights
  qkv_bias: true
  partial_rotary_factor: 0.5
  sliding_window: 64
  sliding_window_pattern: 2
rope: {theta: 10000.0, interleaved: true, nope_layers: [1, 3]}
mlp: {intermediate_size: 512}
checkpoint: {layout: llama, fused: [qkv_proj, gate_up_proj]}
""",
    ),
    # Sigmoid routing with a bias and no expert groups (one group on vLLM's CPU),
    # the bias a parameter of the MoE block itself (MiniMax-M2's
    # block_sparse_moe.e_score_correction_bias).
    "var-bias-block": (
        "VarBiasBlockForCausalLM",
        """
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    router: {scoring: sigmoid, norm_topk_prob: true, bias_correction: true}
checkpoint:
  layout: mixtral
  tensor_names:
    router_bias: model.layers.{layer}.block_sparse_moe
""",
    ),
    # Softmax routing with a bias kept on a module of its own as [1, num_experts]
    # (ERNIE-4.5-MoE's mlp.moe_statics), a dense first layer, an MoE MTP head.
    "var-bias-2d": (
        "VarBias2dForCausalLM",
        """
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    first_k_dense: 1
    router: {scoring: softmax, norm_topk_prob: true, bias_correction: true}
mtp: {num_heads: 1, mlp: moe}
checkpoint:
  layout: deepseek
  tensor_names:
    router_bias: model.layers.{layer}.mlp.moe_statics
  router_bias_2d: true
""",
    ),
    # gpt-oss's parts on a new model type: attention sinks, alternating sliding and
    # full layers, yarn with an unrounded correction range, a dense first layer,
    # then a biased router and stacked experts with biases and the clamped SwiGLU,
    # the experts under a name of their own (renamed to vLLM's `experts`).
    "var-sinks-stacked": (
        "VarSinksStackedForCausalLM",
        """
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 64
  sinks: true
  qkv_bias: true
  o_bias: true
  sliding_window: 64
  sliding_window_pattern: 2
rope:
  theta: 150000.0
  scaling: {type: yarn, factor: 32.0, original_max_position_embeddings: 1024,
            beta_fast: 32.0, beta_slow: 1.0, truncate: false}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 8
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    first_k_dense: 1
    expert_bias: true
    swiglu_alpha: 1.702
    swiglu_limit: 7.0
    router: {scoring: softmax, norm_topk_prob: true, bias: true}
checkpoint:
  layout: gpt_oss
  fused: [experts]
  experts_format: gpt_oss
  tensor_names:
    experts_gate_up_proj: model.layers.{layer}.mlp.moe_experts
    experts_down_proj: model.layers.{layer}.mlp.moe_experts
""",
    ),
    # Gemma-3's parts: sandwich norms scaling by 1 + weight, scaled embeddings,
    # q/k norms, its softmax scale, both soft-caps, and the sliding layers with
    # their own rope (the full layers' scaled).
    "var-sandwich": (
        "VarSandwichForCausalLM",
        """
tie_word_embeddings: true
activation: gelu_pytorch_tanh
scale_embedding: true
final_logit_softcap: 30.0
norm: {eps: 1.0e-06, placement: sandwich, unit_offset: true}
attention:
  num_heads: 4
  num_kv_heads: 2
  head_dim: 64
  qk_norm: true
  query_pre_attn_scalar: 256
  logit_softcap: 50.0
  sliding_window: 64
  sliding_window_pattern: 2
rope:
  theta: 1000000.0
  scaling: {type: linear, factor: 8.0}
  sliding: {theta: 10000.0}
mlp: {intermediate_size: 512}
""",
    ),
    # Sandwich norms under GLM-4's names (its pre-MLP norm is Llama's
    # post_attention_layernorm), with MoE layers after a dense one.
    "var-sandwich-glm": (
        "VarSandwichGlmForCausalLM",
        """
norm: {placement: sandwich}
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    first_k_dense: 1
checkpoint:
  tensor_names:
    attention_output_norm: model.layers.{layer}.post_self_attn_layernorm
    mlp_input_norm: model.layers.{layer}.post_attention_layernorm
    mlp_output_norm: model.layers.{layer}.post_mlp_layernorm
""",
    ),
    # Granite-MoE-Shared: the four multipliers (un-fused residual), experts stored
    # stacked (renamed to the fused MoE layer's own names), the router one module
    # down and a shared expert beside the MoE block, its gate and up in one tensor.
    # (Its long name makes the plugin's MODEL_CLASS string longer than a line.)
    "var-granite-moe-shared-fused": (
        "VarGraniteForCausalLM",
        """
embedding_multiplier: 12.0
residual_multiplier: 0.22
logits_scaling: 16.0
attention: {num_heads: 4, num_kv_heads: 2, softmax_scale: 0.015625}
mlp:
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    shared_expert_intermediate_size: 96
checkpoint: {layout: granite, fused: [shared_gate_up_proj, experts]}
""",
    ),
    # Stacked experts under the Llama names, beside dense layers, with the shared
    # expert (split) inside the MoE block.
    "var-stacked-experts": (
        "VarStackedExpertsForCausalLM",
        """
attention: {num_heads: 4, num_kv_heads: 2}
mlp:
  intermediate_size: 512
  moe:
    num_experts: 4
    num_experts_per_tok: 2
    expert_intermediate_size: 64
    num_shared_experts: 1
    first_k_dense: 1
checkpoint: {fused: [experts]}
""",
    ),
    # Checkpoint names that need renaming: overridden roles (MTP ones too).
    "var-renamed": (
        "VarRenamedForCausalLM",
        """
attention: {num_heads: 4, num_kv_heads: 2, qk_norm: true}
mlp: {intermediate_size: 512}
mtp: {num_heads: 2, mlp: dense}
checkpoint:
  layout: llama
  tensor_names:
    q_proj: model.layers.{layer}.attn.wq
    o_proj: model.layers.{layer}.attn.wo
    embed: model.tok_embeddings
    q_norm: model.layers.{layer}.attn.q_layernorm
    mtp_eh_proj: model.layers.{layer}.mtp_proj
    mtp_head_norm: model.layers.{layer}.mtp_head.norm
""",
    ),
    # Phi-3's LongRoPE with a stated attention factor (passed to vLLM's rotary
    # embedding as short/long mscale) on half of each head.
    "var-longrope": (
        "VarLongropeForCausalLM",
        """
tie_word_embeddings: false
attention: {num_heads: 4, num_kv_heads: 2, partial_rotary_factor: 0.5}
mlp: {intermediate_size: 512}
rope:
  scaling:
    type: longrope
    original_max_position_embeddings: 1024
    attention_factor: 1.19
    short_factor: [
      1.0, 1.0312, 1.0625, 1.0938, 1.125, 1.1562, 1.1875, 1.2188, 1.25, 1.2812,
      1.3125, 1.3438, 1.375, 1.4062, 1.4375, 1.4688
    ]
    long_factor: [
      1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5,
      15.5, 16.5
    ]
""",
    ),
}

VARIANTS = sorted(_VARIANTS)


def variant(name: str) -> ModelSpec:
    arch, body = _VARIANTS[name]
    text = _BASE.format(name=name, arch=arch, model_type=name.replace("-", "_")) + body
    return parse_spec_text(text, file=f"<{name}>")


def any_spec(name: str) -> ModelSpec:
    return bundled(name) if name in BUNDLED else variant(name)


ALL = BUNDLED + VARIANTS
