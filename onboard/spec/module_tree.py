"""Module names of the generated reference, read from the spec's tensor layout.

``from_pretrained`` matches checkpoint tensors to parameters by name, and custom
code gets no renaming from transformers, so the reference's module tree *is* the
checkpoint layout: ``model.layers.{layer}.self_attn.q_proj`` becomes attribute
``self_attn`` of a decoder layer holding attribute ``q_proj``. This module splits
each role's path (:meth:`ModelSpec.tensor_path`) into those attribute names and
rejects, with the role named, a path that does not fit the tree. ``spec check``
runs it (onboard.spec.rules): a path of the newer features' roles (indexer,
linear attention, the components' roles such as attention sinks) that does not
fit is refused there; for the other roles ``spec check`` warns, and generate
writes ``hf/README.md`` with the reason instead of a reference (the vLLM model
renames what it loads).
"""

from __future__ import annotations

from onboard import components
from onboard.components import dense_mlp
from onboard.components.residual_stream import NORM_ROLES
from onboard.errors import InputError
from onboard.spec.layouts import (
    ATTENTION_LINEARS,
    ROUTED_EXPERT_ROLES,
    SHARED_EXPERT_ROLES,
    STACKED_EXPERT_ROLES,
)
from onboard.spec.model import ModelSpec


class TensorTreeError(InputError):
    """A tensor path that does not fit the reference's module tree."""

    def __init__(self, role: str | None, reason: str):
        self.path: tuple[str, ...] = ("checkpoint", "tensor_names") + (
            (role,) if role else ()
        )
        self.reason = reason
        super().__init__(f"{'.'.join(self.path)}: {reason}")


# Where each role sits in the tree, below a decoder layer ("model.layers.{layer}").
# A tuple names the containers, then the leaf: ("attn", None) means the path is
# "<attn container>.<leaf>"; () means the leaf sits directly on the layer.
_LAYER_SLOTS: dict[str, tuple[str, ...]] = {
    "input_norm": (),
    "post_attention_norm": (),
    "attention_output_norm": (),
    "mlp_output_norm": (),
    "mlp_input_norm": (),
    **dict.fromkeys((*ATTENTION_LINEARS, "q_a_norm", "kv_a_norm"), ("attn",)),
    "router": ("moe",),
    "shared_expert_gate": ("moe",),
    **dict.fromkeys(
        ("expert_gate_proj", "expert_up_proj", "expert_down_proj"),
        ("moe", "experts", "{expert}"),
    ),
    # `experts` in checkpoint.fused: the stacked tensors sit on the MoE block
    # (experts_format gpt_oss: both roles are one module there).
    **dict.fromkeys(STACKED_EXPERT_ROLES, ("moe",)),
    # The shared expert sits in the MoE block, or beside it on the layer
    # (Granite-MoE-Shared's shared_mlp: module_names reads it from the path).
    **dict.fromkeys(
        ("shared_gate_proj", "shared_up_proj", "shared_down_proj"), ("moe", "shared")
    ),
    "shared_gate_up_proj": ("moe", "shared"),
    # the module roles components add (onboard.components; a parameter role
    # sits on its container, checked by _check_param_paths)
    **{role: r.slot for role, r in components.roles().items() if r.param is None},
}


# Plain attributes the generated modules set, which a module name may not shadow.
RESERVED = frozenset(
    {
        "layer_idx", "window", "kv_source", "head_dim", "num_heads", "nope_dim",
        "rope_dim", "v_dim", "kv_lora_rank", "scale", "is_moe", "top_k",
        "num_groups", "topk_groups", "scaling_factor", "eps", "weight", "bias",
        "e_score_correction_bias", "config", "lm_head_name",
        "residual_multiplier", "act_fn", "sinks", "topk", "interleaved",
        # a linear-attention mixer's own parameters (Gated DeltaNet, KDA): a
        # module of that name would be replaced by the parameter, and the vLLM
        # model's rename of it would take the parameter's tensors too
        "A_log", "dt_bias",
    }
)  # fmt: skip
# ... and those the components' reference code sets.
RESERVED |= {name for c in components.every() for name in c.attributes}


# The attributes of torch.nn.Module (and the ones it sets in __init__), kept here so
# `spec check` needs no torch (smart_apply: transformers adds it to every module);
# tests/test_spec_robustness.py compares it with torch.
NN_MODULE_ATTRIBUTES = frozenset(
    {
        "T_destination", "add_module", "apply", "bfloat16", "buffers",
        "call_super_init",
        "children", "compile", "cpu", "cuda", "double", "dump_patches", "eval",
        "extra_repr", "float", "forward", "get_buffer", "get_extra_state",
        "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules",
        "mtia", "named_buffers", "named_children", "named_modules",
        "named_parameters", "parameters", "register_backward_hook",
        "register_buffer", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook",
        "register_module", "register_parameter", "register_state_dict_post_hook",
        "register_state_dict_pre_hook", "requires_grad_", "set_extra_state",
        "set_submodule", "share_memory", "smart_apply", "state_dict", "to",
        "to_empty", "train",
        "training", "type", "xpu", "zero_grad",
    }
)  # fmt: skip


def used_roles(spec: ModelSpec) -> list[str]:
    """The tensor roles a checkpoint of ``spec`` has (in a stable order)."""
    att = spec.attention
    roles = ["embed", "final_norm", *NORM_ROLES[spec.norm.placement]]
    if not spec.tie_word_embeddings:
        roles.append("lm_head")
    if att.type == "mla":
        assert att.mla is not None
        if att.mla.q_lora_rank is None:
            roles.append("q_proj")
        else:
            roles += ["q_a_proj", "q_a_norm", "q_b_proj"]
        roles += ["kv_a_proj", "kv_a_norm", "kv_b_proj", "o_proj"]
    else:
        if "qkv_proj" in spec.checkpoint.fused:
            roles += ["qkv_proj", "o_proj"]
        else:
            roles += ["q_proj", "k_proj", "v_proj", "o_proj"]
    moe = spec.mlp.moe
    fused = spec.checkpoint.fused
    if moe is not None:
        stacked = "experts" in fused
        roles += ["router", *(STACKED_EXPERT_ROLES if stacked else ROUTED_EXPERT_ROLES)]
        if moe.router.bias_correction:
            roles.append("router_bias")
        if moe.num_shared_experts:
            if "shared_gate_up_proj" in fused:
                roles += ["shared_gate_up_proj", "shared_down_proj"]
            else:
                roles += SHARED_EXPERT_ROLES
            if moe.shared_expert_gate:
                roles.append("shared_expert_gate")
    for component in components.present(spec):
        roles += component.checkpoint_roles(spec)
    return roles


def gpt_oss_experts(spec: ModelSpec) -> bool:
    """The routed experts are stacked as gpt-oss stores them: one module whose
    parameters are named after the stacked roles (checkpoint.experts_format)."""
    return (
        spec.mlp.moe is not None
        and "experts" in spec.checkpoint.fused
        and spec.checkpoint.experts_format == "gpt_oss"
    )


def experts_in_one_module(spec: ModelSpec) -> bool:
    """The stacked experts are parameters of one module, named after the stacked
    roles (checkpoint.experts_format gpt_oss or parameters)."""
    return (
        spec.mlp.moe is not None
        and "experts" in spec.checkpoint.fused
        and spec.checkpoint.experts_format != "linear"
    )


def parameter_experts(spec: ModelSpec) -> bool:
    """checkpoint.experts_format parameters: linear's stacks, output dim first,
    as parameters of one module (Mistral-4); or parameters_transposed, the same
    input dim first (Llama-4)."""
    return experts_in_one_module(spec) and spec.checkpoint.experts_format in (
        "parameters",
        "parameters_transposed",
    )


def transposed_experts(spec: ModelSpec) -> bool:
    """checkpoint.experts_format parameters_transposed: the stacks of one module's
    parameters, input dim first (transformers' Llama-4)."""
    return experts_in_one_module(spec) and spec.checkpoint.experts_format == (
        "parameters_transposed"
    )


def has_dense_mlp(spec: ModelSpec) -> bool:
    """Some block is dense (a decoder layer or the MTP block)."""
    return dense_mlp.COMPONENT.present(spec)


def module_names(spec: ModelSpec) -> dict[str, str]:
    """Attribute names of the reference's modules, keyed by role and container.

    Keys: every used role (its leaf name), plus the containers ``base`` (the
    ``PreTrainedModel`` base prefix, e.g. ``model``), ``layers``, ``attn``,
    ``mlp``, ``moe``, ``experts``, ``shared`` and ``shared_head`` where used, and
    ``shared_parent``: ``moe`` or ``layer``, where the shared expert sits.
    """
    names: dict[str, str] = {}
    roles = used_roles(spec)

    def bad(role: str, shape: str) -> InputError:
        return TensorTreeError(
            role,
            "the generated Hugging Face reference needs this path shaped like "
            f"{shape!r}, got {spec.tensor_path(role)!r}",
        )

    claimed_by: dict[str, str] = {}

    def claim(key: str, value: str, role: str, shape: str) -> None:
        if not value.isidentifier():
            raise bad(role, shape)
        if names.setdefault(key, value) != value:
            # Blame the role the spec overrides, where one of the two is.
            other = claimed_by[key]
            overrides = spec.checkpoint.tensor_names
            if other in overrides and role not in overrides:
                role, other = other, role
            raise TensorTreeError(
                role,
                f"{spec.tensor_path(role)!r} puts this role beside {other} "
                f"({spec.tensor_path(other)!r}) in different modules; the Hugging "
                "Face reference needs one module per block",
            )
        claimed_by.setdefault(key, role)

    embed = spec.tensor_path("embed").split(".")
    if len(embed) != 2:
        raise bad("embed", "model.embed_tokens")
    claim("base", embed[0], "embed", "model.embed_tokens")
    names["embed"] = embed[1]
    final = spec.tensor_path("final_norm").split(".")
    if len(final) != 2:
        raise bad("final_norm", "model.norm")
    claim("base", final[0], "final_norm", "model.norm")
    claim("final_norm", final[1], "final_norm", "model.norm")
    if "lm_head" in roles:
        claim("lm_head", spec.tensor_path("lm_head"), "lm_head", "lm_head")

    for role in roles:
        slots = _LAYER_SLOTS.get(role)
        if slots is None:
            continue
        shape = ".".join(
            ("model", "layers", "{layer}")
            + tuple(s if s == "{expert}" else f"<{s}>" for s in slots)
            + ("<name>",)
        )
        parts = spec.tensor_path(role).split(".")
        if slots == ("moe", "shared") and len(parts) == 5:
            # The shared expert beside the MoE block, on the layer.
            slots = ("shared",)
        if slots and slots[-1] == "shared":
            parent = "moe" if len(slots) == 2 else "layer"
            claim("shared_parent", parent, role, shape)
        if role == "router" and len(parts) == 5 + len(slots):
            # The router's weight one module down (HunYuan's mlp.gate.wg): the
            # reference nests it in a plain container of that name.
            claim("router_box", parts[-2], role, shape)
            parts[-2:] = [f"{parts[-2]}.{parts[-1]}"]
            if not all(p.isidentifier() for p in parts[-1].split(".")):
                raise bad(role, shape)
            names[role] = parts[-1]
            parts[-1] = parts[-1].split(".")[1]  # checked below as a plain name
        if len(parts) != 4 + len(slots) or parts[2] != "{layer}":
            raise bad(role, shape)
        claim("base", parts[0], role, shape)
        claim("layers", parts[1], role, shape)
        if role in ("linear_attn", "kda_attn"):
            # The mixer module is also the container of its modules.
            claim("linear", parts[-1], role, shape)
        for slot, part in zip(slots, parts[3:-1], strict=True):
            if slot == "{expert}":
                if part != "{expert}":
                    raise bad(role, shape)
            else:
                claim(slot, part, role, shape)
        if role == "router" and "router_box" in names:
            continue
        claim(role, parts[-1], role, shape)

    _check_param_paths(spec, names, roles)
    if experts_in_one_module(spec):
        _check_gpt_oss_experts_path(spec)
    if names.get("shared_parent") == "layer" and has_dense_mlp(spec):
        role = next(r for r in roles if _LAYER_SLOTS.get(r, ())[-1:] == ("shared",))
        raise TensorTreeError(
            role,
            f"{spec.tensor_path(role)!r} puts the shared expert beside the MoE block; "
            "the Hugging Face reference does so only when every layer is MoE",
        )
    if "router_bias" in roles:
        _router_bias_names(spec, names)
    _check_distinct(spec, names, roles)
    for key, value in names.items():
        if key == "shared_parent":
            continue  # a place, not a module name
        if value in RESERVED or value in NN_MODULE_ATTRIBUTES:
            raise TensorTreeError(
                key if key in roles else None,
                f"module name {value!r} clashes with an attribute of the generated "
                "Hugging Face reference (torch.nn.Module or the reference's own); "
                "rename it",
            )
    return names


def _check_param_paths(spec: ModelSpec, names: dict[str, str], roles: list) -> None:
    """A component's parameter role (the attention sinks) is a parameter of its
    container: its path is that module's (the attention's: where q_proj is)."""
    for role, r in components.roles().items():
        if r.param is None or role not in roles:
            continue
        module = ".".join(
            [names["base"], names["layers"], "{layer}", *(names[s] for s in r.slot)]
        )
        if spec.tensor_path(role) != module:
            raise TensorTreeError(
                role,
                f"{role} is a parameter of the module {module!r}, got "
                f"{spec.tensor_path(role)!r}",
            )


def _check_gpt_oss_experts_path(spec: ModelSpec) -> None:
    """experts_format gpt_oss or parameters: both stacked roles name the one
    module that holds their parameters."""
    gate_up, down = (spec.tensor_path(r) for r in STACKED_EXPERT_ROLES)
    if gate_up != down:
        raise TensorTreeError(
            "experts_down_proj",
            f"with checkpoint.experts_format {spec.checkpoint.experts_format} the "
            "stacked experts are one "
            f"module: its path must be experts_gate_up_proj's ({gate_up!r}), got "
            f"{down!r}",
        )


def router_bias_at(spec: ModelSpec) -> str:
    """Where the reference keeps the router's bias: on the router (``router``),
    on the MoE block itself (``moe``: EXAONE-MoE, MiniMax-M2), or on a
    parameter-only module of the block (``module``, named by
    ``module_names(spec)["router_bias"]``: ERNIE-4.5-MoE's ``moe_statics``)."""
    path = spec.tensor_path("router_bias")
    if path == spec.tensor_path("router"):
        return "router"
    parts = path.split(".")
    return "moe" if len(parts) == 4 else "module"


def _router_bias_names(spec: ModelSpec, names: dict[str, str]) -> None:
    """Checks the router bias's path against the module tree; names its own
    module where it has one."""
    at = router_bias_at(spec)
    if at == "router":
        return
    path = spec.tensor_path("router_bias")
    block = f"{names['base']}.{names['layers']}.{{layer}}.{names['moe']}"
    leaf = path.removeprefix(block + ".")
    taken = {
        names[k]
        for k in ("router", "router_box", "experts", "shared", "shared_expert_gate")
        if k in names
    }
    if path != block and (
        at != "module"
        or path == leaf
        or not leaf.isidentifier()
        or leaf in taken
        or leaf in RESERVED
        or leaf in NN_MODULE_ATTRIBUTES
    ):
        raise TensorTreeError(
            "router_bias",
            "the generated Hugging Face reference needs the router's bias on the "
            f"router ({spec.tensor_path('router')!r}), on the MoE block ({block!r}) "
            f"or on a module of its own in the block ({block + '.<name>'!r}), got "
            f"{path!r}",
        )
    if at == "module":
        names["router_bias"] = leaf


def _check_distinct(spec: ModelSpec, names: dict[str, str], roles: list[str]) -> None:
    """Two modules of one parent may not share an attribute name."""
    seen: dict[tuple[str, ...], str] = {}
    for role in roles:
        slots = _LAYER_SLOTS.get(role)
        if slots is None or (
            role == "experts_down_proj" and experts_in_one_module(spec)
        ):
            continue  # (gpt-oss: experts_gate_up_proj's module, checked above)
        if slots == ("moe", "shared") and names.get("shared_parent") == "layer":
            slots = ("shared",)
        key = slots + (names[role],)
        if seen.setdefault(key, role) != role:
            raise TensorTreeError(
                role, f"{spec.tensor_path(role)!r} is also the path of {seen[key]}"
            )
    # What hangs directly off a decoder layer: the dense MLP and the MoE block may
    # share a name (a layer has one or the other), nothing else may.
    on_layer = [
        names[r]
        for r in roles
        if _LAYER_SLOTS.get(r) == () and r not in ("linear_attn", "kda_attn")
    ]
    on_layer += [names[c] for c in ("shared_head",) if c in names]
    # Attention and linear attention may share a name too (Kimi Linear's self_attn).
    on_layer += sorted({names[c] for c in ("attn", "linear") if c in names})
    if names.get("shared_parent") == "layer":
        on_layer.append(names["shared"])
    on_layer += sorted({names[c] for c in ("mlp", "moe") if c in names})
    twice = sorted({n for n in on_layer if on_layer.count(n) > 1})
    if twice:
        raise TensorTreeError(
            None, f"{', '.join(twice)} names two different modules of one decoder layer"
        )
