"""Spec knowledge for the preflight: tensor-name patterns, each role's dimensions
as spec expressions, which spec field decides whether a tensor exists, and which
spec field each config.json key comes from."""

from __future__ import annotations

import re
from collections import defaultdict
from functools import cache

from onboard import components
from onboard.arch import ArchPlan
from onboard.components.base import spec_dim
from onboard.components.qk_norm import QkNorm
from onboard.spec.layouts import (
    EXPERT_ROLES,
    FUSED_ROLES,
    ROLES,
    STACKED_EXPERT_ROLES,
    gpt_oss_param,
    required_placeholders,
)
from onboard.spec.model import ModelSpec
from onboard.spec.module_tree import used_roles
from onboard.templating import index_ranges

PLACEHOLDERS = ("{layer}", "{expert}")


def abstract(name: str) -> tuple[str, tuple[int, ...]]:
    """``model.layers.3.mlp.experts.7.w1`` -> (``model.layers.{layer}.mlp.experts.
    {expert}.w1``, (3, 7)): the first numeric component is the layer, the second the
    expert, further ones ``{n}``."""
    parts = name.split(".")
    idx: list[int] = []
    for i, part in enumerate(parts):
        if part.isdigit():
            parts[i] = PLACEHOLDERS[len(idx)] if len(idx) < 2 else "{n}"
            idx.append(int(part))
    return ".".join(parts), tuple(idx)


def describe(pattern: str, names: list[str]) -> str:
    """The pattern with the indices it covers: ``... (layers 1-2, experts 0-7)``."""
    idx = [abstract(n)[1] for n in names]
    parts = []
    for pos, label in ((0, "layers"), (1, "experts")):
        values = {i[pos] for i in idx if len(i) > pos}
        if values:
            parts.append(f"{label} {index_ranges(values)}")
    if len(names) > 1:
        parts.append(f"{len(names)} tensors")
    return f"{pattern} ({', '.join(parts)})" if parts else pattern


def by_pattern(names: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names, key=natural):
        groups[abstract(name)[0]].append(name)
    return groups


def natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def split_name(name: str) -> tuple[str, str]:
    module, _, param = name.rpartition(".")
    return module, param


def _roles_spec_first(plan: ArchPlan) -> list[str]:
    """Every role, those the spec uses first."""
    used = used_roles(plan.spec)
    return [*used, *(role for role in ROLES if role not in used)]


def role_index(plan: ArchPlan) -> dict[str, str]:
    """Module path -> role, for every module the spec's layout can name (a path
    two roles share, e.g. the attention module of the sinks and of KDA, is the
    spec's own role's)."""
    total = plan.checkpoint_layers
    experts = plan.moe.num_experts if plan.moe else 0
    out: dict[str, str] = {}
    for role in _roles_spec_first(plan):
        path = plan.layout_path(role)
        holes = required_placeholders(role)
        if not holes:
            out.setdefault(path, role)
        elif "expert" in holes:
            for layer in range(total):
                for e in range(experts):
                    out.setdefault(path.format(layer=layer, expert=e), role)
        else:
            for layer in range(total):
                out.setdefault(path.format(layer=layer), role)
    return out


def canonical_roles(plan: ArchPlan) -> dict[str, str]:
    """Abstract module pattern -> role (as :func:`abstract` writes patterns)."""
    out: dict[str, str] = {}
    for role in _roles_spec_first(plan):
        out.setdefault(
            abstract(plan.layout_path(role).format(layer=0, expert=0))[0], role
        )
    return out


def placeholders(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in (*PLACEHOLDERS, "{n}") if p in pattern)


def role_hint(
    plan: ArchPlan, role: str, param: str, default: str, *, missing: bool
) -> tuple[str, list[str]]:
    """The spec field that decides whether a role's tensor exists, and its fix."""
    att, moe = plan.attention, plan.moe
    want = "false" if missing else "true"
    field = getattr(components.roles().get(role), "spec_field", None)
    if field is not None:
        return f"set {field}: {want} in the spec", [field]
    if role == "router" and param == "bias":
        return (
            f"set mlp.moe.router.bias: {want} in the spec",
            ["mlp.moe.router.bias"],
        )
    if role in STACKED_EXPERT_ROLES and param != "weight":
        if param.endswith("_bias"):
            return (
                f"set mlp.moe.expert_bias: {want} in the spec",
                ["mlp.moe.expert_bias"],
            )
        return (
            "check checkpoint.experts_format (the spec says "
            f"{plan.spec.checkpoint.experts_format}): gpt-oss and Mistral-4 store "
            "each layer's experts as one module of stacked parameters",
            ["checkpoint.experts_format"],
        )
    if param == "bias" and role in ("q_proj", "k_proj", "v_proj", "qkv_proj"):
        return f"set attention.qkv_bias: {want} in the spec", ["attention.qkv_bias"]
    if param == "bias" and role == "o_proj":
        return f"set attention.o_bias: {want} in the spec", ["attention.o_bias"]
    if param == "bias" and role.endswith("norm"):
        if missing:
            return (
                "set norm.type: rmsnorm in the spec, or norm.bias: false for a "
                "LayerNorm without bias",
                ["norm.type", "norm.bias"],
            )
        return (
            "set norm.type: layernorm (and norm.bias: true) in the spec",
            ["norm.type", "norm.bias"],
        )
    if role == "post_attention_norm" and missing and param == "weight":
        return (
            "set norm.placement: parallel in the spec if attention and the MLP "
            "both read the layer's one input norm (Cohere)",
            ["norm.placement"],
        )
    if role in FUSED_ROLES and param != "bias":
        parts = " / ".join(FUSED_ROLES[role])
        if missing:
            return (
                f"remove {role} from checkpoint.fused in the spec if the checkpoint "
                f"stores {parts} apart",
                ["checkpoint.fused"],
            )
        return (
            f"add {role} to checkpoint.fused in the spec: the checkpoint stores "
            f"{parts} as one tensor",
            ["checkpoint.fused"],
        )
    if param == "e_score_correction_bias":
        return (
            "set mlp.moe.router.bias_correction: true in the spec and "
            '"topk_method": "noaux_tc" in config.json',
            ["mlp.moe.router.bias_correction"],
        )
    for component in components.every():
        if role in component.roles and (
            hint := component.checkpoint_hint(plan.spec, role)
        ):
            return hint
    if role == "lm_head":
        return (
            "set tie_word_embeddings: true in the spec if the model ties its output "
            "head to the embedding; otherwise the checkpoint lacks lm_head",
            ["tie_word_embeddings"],
        )
    if role in ("q_a_proj", "q_a_norm", "q_b_proj") or (
        role == "q_proj" and att.kind == "mla"
    ):
        return (
            "set attention.mla.q_lora_rank in the spec (null: one q_proj; a rank: "
            "q_a_proj, q_a_layernorm and q_b_proj)",
            ["attention.mla.q_lora_rank"],
        )
    mla_roles = ("kv_a_proj", "kv_a_norm", "kv_b_proj")
    if role in mla_roles or (role in ("k_proj", "v_proj") and att.kind == "mla"):
        return (
            f"check attention.type (the spec says {att.kind}; MLA checkpoints have "
            "kv_a_proj_with_mqa / kv_b_proj, GQA ones k_proj / v_proj)",
            ["attention.type"],
        )
    if role in (
        "shared_gate_proj",
        "shared_up_proj",
        "shared_gate_up_proj",
        "shared_down_proj",
    ):
        n = moe.num_shared_experts if moe else 0
        return (
            f"check mlp.moe.num_shared_experts (the spec says {n}) and the layout's "
            "shared-expert name (deepseek: shared_experts, qwen: shared_expert)",
            ["mlp.moe.num_shared_experts", "checkpoint.layout"],
        )
    if role == "shared_expert_gate":
        return (
            f"set mlp.moe.shared_expert_gate: {want} in the spec",
            ["mlp.moe.shared_expert_gate"],
        )
    placement = [
        "mlp.moe.first_k_dense",
        "mlp.moe.layer_frequency",
        "mlp.moe.dense_layers",
    ]
    if role in (
        "router",
        *EXPERT_ROLES,
        *STACKED_EXPERT_ROLES,
        "gate_proj",
        "up_proj",
        "down_proj",
    ):
        return (
            "the checkpoint's dense and MoE layers differ from the spec's: check "
            + ", ".join(placement)
            + (" (the spec has no mlp.moe)" if moe is None else ""),
            placement,
        )
    return default, ["checkpoint.tensor_names"]


# The norms over the hidden size (one weight of hidden_size each).
HIDDEN_NORMS = (
    "input_norm",
    "post_attention_norm",
    "attention_output_norm",
    "mlp_input_norm",
    "mlp_output_norm",
    "final_norm",
)


def dims(plan: ArchPlan, role: str | None, param: str) -> list[tuple[str, int]] | None:
    """Each dimension of a role's tensor as (spec expression, value): the values
    are the plan's, the expressions name the spec fields they come from."""
    spec = plan.spec
    att, mla, moe = plan.attention, plan.attention.mla, plan.moe
    set_in_spec = spec.attention  # which fields the spec sets, for the expressions
    h = ("hidden_size", spec.hidden_size)
    vocab = ("vocab_size", spec.vocab_size)
    nh = att.num_heads
    table: dict[str, tuple[tuple[str, int], ...]] = {
        "embed": (vocab, h),
        "lm_head": (vocab, h),
    }
    for norm in HIDDEN_NORMS:
        table[norm] = (h,)
    if att.kind == "gqa":
        assert att.head_dim is not None and att.num_kv_heads is not None
        hd = (
            "attention.head_dim"
            if set_in_spec.head_dim
            else "hidden_size / attention.num_heads",
            att.head_dim,
        )
        kvh = (
            "attention.num_kv_heads"
            if set_in_spec.num_kv_heads
            else "attention.num_heads"
        )
        q = (f"attention.num_heads × {hd[0]}", nh * hd[1])
        kv = (f"{kvh} × {hd[0]}", att.num_kv_heads * hd[1])
        # With the output gate, q_proj also holds each head's gate.
        n = att.query_slices
        q_rows = (f"{n} × {q[0]}", n * q[1]) if n > 1 else q
        qkv = (
            f"({q_rows[0]} + 2 × {kvh} × {hd[0]})",
            q_rows[1] + 2 * att.num_kv_heads * hd[1],
        )
        table |= {
            "q_proj": (q_rows, h),
            "k_proj": (kv, h),
            "v_proj": (kv, h),
            "qkv_proj": (qkv, h),
            "o_proj": (h, q),
            "q_norm": (hd,),
            "k_norm": (hd,),
        }
        scope = None if (norm := att.part(QkNorm)) is None else norm.scope
        if scope == "projection":
            table |= {"q_norm": (q,), "k_norm": (kv,)}
        elif scope == "head_weights":
            table |= {
                "q_norm": (("attention.num_heads", nh), hd),
                "k_norm": ((kvh, att.num_kv_heads), hd),
            }
    elif mla is not None:
        m = "attention.mla."
        qk = (
            f"attention.num_heads × ({m}qk_nope_head_dim + {m}qk_rope_head_dim)",
            nh * (mla.qk_nope_head_dim + mla.qk_rope_head_dim),
        )
        kvr = (f"{m}kv_lora_rank", mla.kv_lora_rank)
        table |= {
            "q_proj": (qk, h),
            "kv_a_proj": (
                (
                    f"{m}kv_lora_rank + {m}qk_rope_head_dim",
                    mla.kv_lora_rank + mla.qk_rope_head_dim,
                ),
                h,
            ),
            "kv_a_norm": (kvr,),
            "kv_b_proj": (
                (
                    f"attention.num_heads × ({m}qk_nope_head_dim + {m}v_head_dim)",
                    nh * (mla.qk_nope_head_dim + mla.v_head_dim),
                ),
                kvr,
            ),
            "o_proj": (
                h,
                (f"attention.num_heads × {m}v_head_dim", nh * mla.v_head_dim),
            ),
        }
        if mla.q_lora_rank is not None:
            qr = (f"{m}q_lora_rank", mla.q_lora_rank)
            table |= {"q_a_proj": (qr, h), "q_a_norm": (qr,), "q_b_proj": (qk, qr)}
    if moe is not None:
        ne = ("mlp.moe.num_experts", moe.num_experts)
        ei = ("mlp.moe.expert_intermediate_size", moe.expert_intermediate_size)
        moe_spec = spec.mlp.moe
        assert moe_spec is not None
        table |= {
            "router": (ne, h),
            "expert_gate_proj": (ei, h),
            "expert_up_proj": (ei, h),
            "expert_down_proj": (h, ei),
            "experts_gate_up_proj": (ne, (f"2 × {ei[0]}", 2 * ei[1]), h),
            "experts_down_proj": (ne, h, ei),
            "shared_expert_gate": (("1", 1), h),
        }
        if moe.num_shared_experts:
            si = (
                "mlp.moe.shared_expert_intermediate_size"
                if moe_spec.shared_expert_intermediate_size
                else "mlp.moe.num_shared_experts × mlp.moe.expert_intermediate_size",
                moe.shared_intermediate_size,
            )
            table |= {
                "shared_gate_proj": (si, h),
                "shared_up_proj": (si, h),
                "shared_gate_up_proj": ((f"2 × {si[0]}", 2 * si[1]), h),
                "shared_down_proj": (h, si),
            }
    if moe is not None and role in STACKED_EXPERT_ROLES and param != "weight":
        if plan.spec.checkpoint.experts_format == "parameters":
            both = (f"2 × {ei[0]}", 2 * ei[1])
            return {"gate_up_proj": [ne, both, h], "down_proj": [ne, h, ei]}.get(param)
        if plan.spec.checkpoint.experts_format == "parameters_transposed":
            both = (f"2 × {ei[0]}", 2 * ei[1])
            return {"gate_up_proj": [ne, h, both], "down_proj": [ne, ei, h]}.get(param)
        return _gpt_oss_dims(h, ne, ei, param)
    for component in components.present(plan.spec):
        if role in component.roles and (
            own := component.param_dims(plan.spec, role, param)
        ):
            return own
    table |= _component_dims(plan.spec)
    dims = table.get(role or "")
    if dims is None:
        return None
    if param == "bias":
        # A linear's bias has its output size, a norm's its size.
        return [dims[0]]
    return list(dims)


def _gpt_oss_dims(
    h: tuple[str, int], ne: tuple[str, int], ei: tuple[str, int], param: str
) -> list[tuple[str, int]] | None:
    """The dims of the parameters of stacked experts stored as gpt-oss does
    (checkpoint.experts_format), by parameter: both roles are one module."""
    both = (f"2 × {ei[0]}", 2 * ei[1])
    gate_up, down = "experts_gate_up_proj", "experts_down_proj"
    return {
        gpt_oss_param(gate_up): [ne, h, both],
        gpt_oss_param(gate_up, bias=True): [ne, both],
        gpt_oss_param(down): [ne, ei, h],
        gpt_oss_param(down, bias=True): [ne, h],
    }.get(param)


def is_field(text: str) -> bool:
    return re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", text) is not None


def fields_in(text: str) -> list[str]:
    return re.findall(r"[a-z_]+(?:\.[a-z_]+)+|hidden_size|vocab_size", text)


def _component_dims(spec: ModelSpec) -> dict[str, tuple]:
    """The dims of the present components' roles, as each role names them."""
    return {
        name: tuple((d, spec_dim(spec, d)) for d in r.dims)
        for component in components.present(spec)
        for name, r in component.roles.items()
        if r.dims
    }


# config.json concept -> the spec fields it comes from (for the fix).
_CONCEPT_FIELDS: dict[str, tuple[str, ...]] = {
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size",),
    "num_hidden_layers": ("num_hidden_layers",),
    "max_position_embeddings": ("max_position_embeddings",),
    "num_attention_heads": ("attention.num_heads",),
    "num_key_value_heads": ("attention.num_kv_heads",),
    "head_dim": ("attention.head_dim",),
    "attention_bias": ("attention.qkv_bias", "attention.o_bias"),
    "qkv_bias": ("attention.qkv_bias",),
    "o_bias": ("attention.o_bias",),
    "partial_rotary_factor": ("attention.partial_rotary_factor",),
    "rope_parameters": ("rope",),
    "rope_interleave": ("rope.interleaved",),
    "sliding_window": ("attention.sliding_window",),
    "use_sliding_window": ("attention.sliding_window",),
    "layer_types": ("attention.layer_types",),
    "sliding_window_pattern": ("attention.sliding_window_pattern",),
    "max_window_layers": ("attention.layer_types",),
    "q_lora_rank": ("attention.mla.q_lora_rank",),
    "kv_lora_rank": ("attention.mla.kv_lora_rank",),
    "qk_nope_head_dim": ("attention.mla.qk_nope_head_dim",),
    "qk_rope_head_dim": ("attention.mla.qk_rope_head_dim",),
    "v_head_dim": ("attention.mla.v_head_dim",),
    "qk_head_dim": ("attention.mla.qk_nope_head_dim", "attention.mla.qk_rope_head_dim"),
    "n_routed_experts": ("mlp.moe.num_experts",),
    "num_experts_per_tok": ("mlp.moe.num_experts_per_tok",),
    "moe_intermediate_size": ("mlp.moe.expert_intermediate_size",),
    "n_shared_experts": ("mlp.moe.num_shared_experts",),
    "shared_expert_intermediate_size": ("mlp.moe.shared_expert_intermediate_size",),
    "shared_expert_gate": ("mlp.moe.shared_expert_gate",),
    "first_k_dense_replace": ("mlp.moe.first_k_dense",),
    "decoder_sparse_step": ("mlp.moe.layer_frequency",),
    "moe_layer_freq": ("mlp.moe.layer_frequency",),
    "mlp_only_layers": ("mlp.moe.dense_layers",),
    "moe_expert_bias": ("mlp.moe.expert_bias",),
    "swiglu_alpha": ("mlp.moe.swiglu_alpha",),
    "swiglu_limit": ("mlp.moe.swiglu_limit",),
    "mla_norm_eps": ("attention.mla.latent_norm_eps",),
}
_CONCEPT_FIELDS.update(
    {k: v for c in components.every() for k, v in c.concept_fields.items()}
)


@cache
def config_spec_fields() -> dict[str, tuple[str, ...]]:
    """config.json key (every alias) -> the spec fields it comes from."""
    from onboard.spec.hf import ALIASES

    return {
        alias: fields
        for concept, fields in _CONCEPT_FIELDS.items()
        for alias in ALIASES.get(concept, (concept,))
    }
