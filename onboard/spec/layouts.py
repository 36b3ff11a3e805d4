"""Checkpoint tensor-name layouts.

A layout maps each *role* (a module of the architecture, e.g. ``q_proj`` or
``expert_gate_proj``) to the module path the checkpoint stores it under. Tensor
names are that path plus the parameter name (``.weight``, ``.bias``,
``.e_score_correction_bias``). Paths may use ``{layer}`` and, for routed experts,
``{expert}``. MTP heads live at ``model.layers.{num_hidden_layers + i}`` in every
preset, as DeepSeek-V3 checkpoints store them.
"""

from __future__ import annotations

from collections.abc import Mapping

from onboard import components

_LAYER = "model.layers.{layer}"

# Roles shared by every preset (the Llama/DeepSeek naming).
_BASE: dict[str, str] = {
    "embed": "model.embed_tokens",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "input_norm": f"{_LAYER}.input_layernorm",
    "post_attention_norm": f"{_LAYER}.post_attention_layernorm",
    # norm.placement post: the norms of attention's and the MLP's outputs. OLMo-2
    # and EXAONE-4 store the first where Llama keeps its pre-MLP norm.
    "attention_output_norm": f"{_LAYER}.post_attention_layernorm",
    "mlp_output_norm": f"{_LAYER}.post_feedforward_layernorm",
    # norm.placement sandwich: the MLP's input norm beside the two output norms
    # (Gemma-2/3; GLM-4 names the four otherwise, by checkpoint.tensor_names).
    "mlp_input_norm": f"{_LAYER}.pre_feedforward_layernorm",
    # GQA / MHA attention
    "q_proj": f"{_LAYER}.self_attn.q_proj",
    "k_proj": f"{_LAYER}.self_attn.k_proj",
    "v_proj": f"{_LAYER}.self_attn.v_proj",
    "o_proj": f"{_LAYER}.self_attn.o_proj",
    # checkpoint.fused: q, k and v stored as one tensor (Phi-3)
    "qkv_proj": f"{_LAYER}.self_attn.qkv_proj",
    # MLA attention
    "q_a_proj": f"{_LAYER}.self_attn.q_a_proj",
    "q_a_norm": f"{_LAYER}.self_attn.q_a_layernorm",
    "q_b_proj": f"{_LAYER}.self_attn.q_b_proj",
    "kv_a_proj": f"{_LAYER}.self_attn.kv_a_proj_with_mqa",
    "kv_a_norm": f"{_LAYER}.self_attn.kv_a_layernorm",
    "kv_b_proj": f"{_LAYER}.self_attn.kv_b_proj",
    # MoE
    "router": f"{_LAYER}.mlp.gate",
    # The module holding the router's e_score_correction_bias: the router itself
    # unless the checkpoint keeps it elsewhere (EXAONE-MoE: the MoE block).
    "router_bias": f"{_LAYER}.mlp.gate",
    "expert_gate_proj": f"{_LAYER}.mlp.experts.{{expert}}.gate_proj",
    "expert_up_proj": f"{_LAYER}.mlp.experts.{{expert}}.up_proj",
    "expert_down_proj": f"{_LAYER}.mlp.experts.{{expert}}.down_proj",
    "shared_gate_proj": f"{_LAYER}.mlp.shared_experts.gate_proj",
    "shared_up_proj": f"{_LAYER}.mlp.shared_experts.up_proj",
    "shared_down_proj": f"{_LAYER}.mlp.shared_experts.down_proj",
    "shared_expert_gate": f"{_LAYER}.mlp.shared_expert_gate",
    # checkpoint.fused: the shared expert's gate and up projections as one
    # tensor; a layer's routed experts as two stacked tensors (`experts`).
    "shared_gate_up_proj": f"{_LAYER}.mlp.shared_experts.gate_up_proj",
    "experts_gate_up_proj": f"{_LAYER}.mlp.input_linear",
    "experts_down_proj": f"{_LAYER}.mlp.output_linear",
}

# The roles components add (onboard.components), at the same path in every preset.
_BASE.update({role: r.path for role, r in components.roles().items()})

LAYOUT_PRESETS: dict[str, dict[str, str]] = {
    "llama": dict(_BASE),
    "deepseek": dict(_BASE),
    # Qwen2-MoE / Qwen3-MoE: a single (optionally gated) shared expert.
    "qwen": {
        **_BASE,
        "shared_gate_proj": f"{_LAYER}.mlp.shared_expert.gate_proj",
        "shared_up_proj": f"{_LAYER}.mlp.shared_expert.up_proj",
        "shared_down_proj": f"{_LAYER}.mlp.shared_expert.down_proj",
        "shared_gate_up_proj": f"{_LAYER}.mlp.shared_expert.gate_up_proj",
    },
    "mixtral": {
        **_BASE,
        "router": f"{_LAYER}.block_sparse_moe.gate",
        "router_bias": f"{_LAYER}.block_sparse_moe.gate",
        "expert_gate_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.w1",
        "expert_down_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.w2",
        "expert_up_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.w3",
        "experts_gate_up_proj": f"{_LAYER}.block_sparse_moe.input_linear",
        "experts_down_proj": f"{_LAYER}.block_sparse_moe.output_linear",
    },
    # Granite-MoE (-Shared): Mixtral's block with the router one module down, the
    # experts stacked (checkpoint.fused: experts) and the shared expert beside the
    # MoE block. Per expert, the names vLLM's fused MoE layer gives its experts.
    "granite": {
        **_BASE,
        "router": f"{_LAYER}.block_sparse_moe.router.layer",
        "expert_gate_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.gate_proj",
        "expert_up_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.up_proj",
        "expert_down_proj": f"{_LAYER}.block_sparse_moe.experts.{{expert}}.down_proj",
        "experts_gate_up_proj": f"{_LAYER}.block_sparse_moe.input_linear",
        "experts_down_proj": f"{_LAYER}.block_sparse_moe.output_linear",
        "shared_gate_proj": f"{_LAYER}.shared_mlp.gate_proj",
        "shared_up_proj": f"{_LAYER}.shared_mlp.up_proj",
        "shared_gate_up_proj": f"{_LAYER}.shared_mlp.input_linear",
        "shared_down_proj": f"{_LAYER}.shared_mlp.output_linear",
    },
    # gpt-oss: the router is mlp.router; its experts are stacked in one module,
    # mlp.experts (checkpoint.fused: experts, checkpoint.experts_format: gpt_oss).
    "gpt_oss": {
        **_BASE,
        "router": f"{_LAYER}.mlp.router",
        "experts_gate_up_proj": f"{_LAYER}.mlp.experts",
        "experts_down_proj": f"{_LAYER}.mlp.experts",
    },
}

ROLES: tuple[str, ...] = tuple(_BASE)

# Roles that are one parameter of their module, which may hold another role's
# parameters too (the router's bias on the router's module, by default; a
# component's, e.g. the attention's sinks on the attention module).
PARAM_ROLES: dict[str, str] = {
    "router_bias": "e_score_correction_bias",
    **{role: r.param for role, r in components.roles().items() if r.param},
}

# Roles whose default path is another role's, wherever that one is (an override of
# the router moves its bias with it).
FOLLOWS: dict[str, str] = {"router_bias": "router"}


def role_path(layout: str, tensor_names: Mapping[str, str], role: str) -> str:
    """Module path of ``role`` in ``layout`` with the ``tensor_names`` overrides."""
    if role in tensor_names:
        return tensor_names[role]
    if role in FOLLOWS:
        return role_path(layout, tensor_names, FOLLOWS[role])
    return LAYOUT_PRESETS[layout][role]


# Path -> every module role some preset stores there (post_attention_layernorm is
# both the pre-norm block's MLP input norm and the post-norm block's attention
# norm); a parameter role shares its module with another role and is left out.
_PRESET_ROLES: dict[str, frozenset[str]] = {}
for _preset in LAYOUT_PRESETS.values():
    for _role, _path in _preset.items():
        if _role not in PARAM_ROLES:
            _PRESET_ROLES[_path] = _PRESET_ROLES.get(_path, frozenset()) | {_role}


def preset_roles(path: str) -> frozenset[str]:
    """The roles some layout preset names ``path`` for (empty: no preset does).
    A module at such a path is one of those roles, never another role renamed."""
    return _PRESET_ROLES.get(path, frozenset())


# checkpoint.fused: the role a checkpoint stores in one tensor, and the roles it
# stands for (stacked along the output dim in this order).
FUSED_ROLES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "shared_gate_up_proj": ("shared_gate_proj", "shared_up_proj"),
}
# What checkpoint.fused may list, in the order the spec lists them: the fused
# roles, and `experts` (STACKED_EXPERT_ROLES).
FUSED_FORMS = (*FUSED_ROLES, "experts")

# checkpoint.experts_format: gpt_oss. Both stacked roles are one module; each
# role's weight is the parameter named after it (input dim first, gate and up
# columns interleaved), its bias (mlp.moe.expert_bias) that name + "_bias".
STACKED_EXPERT_PARAMS: dict[str, str] = {
    "experts_gate_up_proj": "gate_up_proj",
    "experts_down_proj": "down_proj",
}


def gpt_oss_param(role: str, bias: bool = False) -> str:
    """The parameter that holds a stacked role's weight (or bias) with
    checkpoint.experts_format gpt_oss."""
    name = STACKED_EXPERT_PARAMS[role]
    return f"{name}_bias" if bias else name


# The MLP of one routed expert, and of the shared expert, by role.
ROUTED_EXPERT_ROLES = ("expert_gate_proj", "expert_up_proj", "expert_down_proj")
SHARED_EXPERT_ROLES = ("shared_gate_proj", "shared_up_proj", "shared_down_proj")
# The same with `experts` in checkpoint.fused: all routed experts of a layer in
# two stacked 3-D tensors (each expert's gate rows, then its up rows; down).
STACKED_EXPERT_ROLES = ("experts_gate_up_proj", "experts_down_proj")

# A KV-sharing layer's own K/V projections (MLA: its latent projection), which vLLM
# never loads or runs: they stay 16-bit wherever stored.
SHARING_UNUSED_LINEARS: tuple[str, ...] = ("k_proj", "v_proj", "kv_a_proj")

# The attention module's projections: GQA's, and MLA's (its latent norms
# beside them, "q_a_norm" and "kv_a_norm", are no Linear).
ATTENTION_LINEARS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj",
    "kv_b_proj",
)

# Roles that are Linear layers of the decoder blocks (what quantization may touch;
# embeddings, lm_head, routers, norms and MTP heads are decided elsewhere).
LINEAR_ROLES: tuple[str, ...] = (
    *ATTENTION_LINEARS,
    *ROUTED_EXPERT_ROLES,
    *SHARED_EXPERT_ROLES,
    "shared_gate_up_proj",
    # the components' Linear roles that quantization may compress
    *(role for role, r in components.roles().items() if r.linear and not r.kept),
)
# The components' Linear roles that quantization keeps in 16 bits (Role.kept:
# the indexer's projections, linear attention's rates and gates).
COMPONENT_KEPT = tuple(
    role for role, r in components.roles().items() if r.linear and r.kept
)

# Placeholders each role's path must (and may only) contain.
GLOBAL_ROLES = frozenset({"embed", "final_norm", "lm_head"})
EXPERT_ROLES = frozenset({"expert_gate_proj", "expert_up_proj", "expert_down_proj"})


def required_placeholders(role: str) -> set[str]:
    if role in GLOBAL_ROLES:
        return set()
    if role in EXPERT_ROLES:
        return {"layer", "expert"}
    return {"layer"}
