"""The one config-alias table.

For each concept (its canonical key), every config.json key that model families
use for it, the canonical key first: ``spec from-hf`` reads a config through it
(:mod:`onboard.spec.hf`), the config onboard writes uses the canonical keys, and the
generated files name the key each setting is read from
(:mod:`onboard.arch.config_keys`, :func:`read_keys`).
"""

from __future__ import annotations

from onboard import components

ALIASES: dict[str, tuple[str, ...]] = {
    # identity and dimensions
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size",),
    "num_hidden_layers": ("num_hidden_layers",),
    # Kimi Linear's config maps max_position_embeddings to model_max_length
    # (CLASS_MAPPED: an alias only where the config class maps it so).
    "max_position_embeddings": ("max_position_embeddings", "model_max_length"),
    # attention
    "num_attention_heads": ("num_attention_heads",),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "attention_bias": ("attention_bias",),  # q, k, v and o projections
    "qkv_bias": ("qkv_bias",),  # q, k, v only (overrides attention_bias)
    "o_bias": ("o_bias", "attention_out_bias"),  # o only (overrides attention_bias)
    "partial_rotary_factor": ("partial_rotary_factor",),
    "rope_parameters": ("rope_parameters",),
    "rope_theta": ("rope_theta",),  # legacy (transformers 4)
    "rope_scaling": ("rope_scaling",),  # legacy (transformers 4)
    # Phi-3 keeps it beside rope_parameters; only a scaling reads it.
    "original_max_position_embeddings": ("original_max_position_embeddings",),
    "rope_interleave": ("rope_interleave",),
    "no_rope_layers": ("no_rope_layers",),  # per layer: 1 rotates, 0 is NoPE
    "no_rope_layer_interval": ("no_rope_layer_interval",),  # SmolLM3's default
    # Llama-4: the chunk of its chunked_attention layers
    "attention_chunk_size": ("attention_chunk_size",),
    "sliding_window": ("sliding_window",),
    "use_sliding_window": ("use_sliding_window",),
    "layer_types": ("layer_types",),
    "sliding_window_pattern": ("sliding_window_pattern",),
    "max_window_layers": ("max_window_layers",),
    # the MLA latent norms' eps where it is not rms_norm_eps
    "mla_norm_eps": ("mla_norm_eps",),
    # multi-head latent attention
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "qk_head_dim": ("qk_head_dim",),  # derived: nope + rope
    # MLP and mixture of experts
    "n_routed_experts": (
        "n_routed_experts",
        "num_experts",
        "num_local_experts",
        "moe_num_experts",
    ),
    "num_experts_per_tok": (
        "num_experts_per_tok",
        "moe_k",
        "moe_topk",
        "num_experts_per_token",  # Kimi Linear
    ),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "n_shared_experts": (
        "n_shared_experts",
        "num_shared_experts",
        "moe_num_shared_experts",
    ),
    "shared_expert_intermediate_size": (
        "shared_expert_intermediate_size",
        "shared_intermediate_size",  # Granite-MoE-Shared (0: none)
    ),
    "shared_expert_gate": ("shared_expert_gate",),
    "first_k_dense_replace": ("first_k_dense_replace", "moe_layer_start_index"),
    # MoE when (i + 1) % N == 0
    "decoder_sparse_step": (
        "decoder_sparse_step",
        "moe_layer_interval",
        "interleave_moe_layer_step",  # Llama-4
    ),
    "moe_layers": ("moe_layers",),  # Llama-4: the MoE layers, listed
    "moe_layer_freq": ("moe_layer_freq",),  # DeepSeek: MoE when i % N == 0
    "mlp_only_layers": ("mlp_only_layers",),
    "mlp_layer_types": ("mlp_layer_types",),  # "dense" / "sparse" per layer
    "moe_layer_end_index": ("moe_layer_end_index",),  # ERNIE: dense after it
    "moe_expert_bias": ("moe_expert_bias",),  # biases on the experts' projections
    "swiglu_alpha": ("swiglu_alpha",),  # the experts' clamped SwiGLU (gpt-oss)
    "swiglu_limit": ("swiglu_limit",),
}

# The concepts components add (onboard.components), each with its keys.
ALIASES.update(components.config_aliases())

# Where a family keeps a concept under another concept's key, the generated files
# may read it there: Llama's one attention_bias for all four projections,
# Mixtral's expert width in intermediate_size (it has no dense layers), a norm's
# eps under the other norm kind's key.
STAND_INS: dict[str, tuple[str, ...]] = {
    "qkv_bias": ("attention_bias",),
    "o_bias": ("attention_bias",),
    "moe_intermediate_size": ("intermediate_size",),
    "rms_norm_eps": ("layer_norm_eps",),
    "layer_norm_eps": ("rms_norm_eps",),
}


# Aliases that name the concept only in a family whose transformers config class
# maps the canonical key to them (its attribute_map): Kimi Linear's
# model_max_length is its max_position_embeddings, while Command R's (and a
# tokenizer's) is the longest input a runtime accepts, which the forward pass does
# not read. Elsewhere `spec from-hf` reads such a key as no alias.
CLASS_MAPPED: frozenset[str] = frozenset({"model_max_length"})


def family_aliases(attribute_map: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The alias table as one family reads it: :data:`CLASS_MAPPED` keys kept
    only where ``attribute_map`` (transformers' config class's) maps the concept's
    canonical key to them."""
    return {
        concept: tuple(
            k for k in keys if k not in CLASS_MAPPED or attribute_map.get(keys[0]) == k
        )
        for concept, keys in ALIASES.items()
    }


def read_keys(concept: str) -> tuple[str, ...]:
    """The keys the generated files may read ``concept`` from, preferred first:
    its aliases, then those of the concepts standing in for it. A concept the
    table does not list is its own one key (``mlp_bias``)."""
    keys = list(ALIASES.get(concept, (concept,)))
    for other in STAND_INS.get(concept, ()):
        keys += [key for key in ALIASES[other] if key not in keys]
    return tuple(keys)
