"""Every decision about the generated reference, made from the spec.

Features (MLA, qk-norm, biases, sliding windows, KV sharing, router kind, MTP ...)
are decided here, so the generated file holds only the code paths the spec uses.
Sizes and per-layer plans are read by the generated code from config.json, under
the key names :func:`onboard.spec.hf.hf_config_from_spec` writes for this spec, so
one generated file serves the full-size checkpoint and its tiny shrunk copy alike.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from onboard import components
from onboard.arch import ArchPlan, GatedDeltaNet, KimiDeltaAttention, build_plan
from onboard.arch.config_keys import ConfigKeys, eps_concept
from onboard.components import linear_attention, residual_stream
from onboard.components.embeddings import Embeddings
from onboard.components.linear_attention import LinearAttentionCode
from onboard.components.logits import Logits
from onboard.components.qk_norm import QkNorm
from onboard.components.residual_stream import ResidualStream
from onboard.errors import InputError
from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.module_tree import (
    gpt_oss_experts,
    module_names,
    parameter_experts,
    router_bias_at,
    transposed_experts,
)

# config.json keys PretrainedConfig handles itself, so not fields of ours.
BASE_KEYS = frozenset(
    {"architectures", "model_type", "dtype", "torch_dtype", "transformers_version"}
)


def _check_layer_plan(
    spec: ModelSpec, hf: dict, expr: str | None, want, what: str = "MoE layer"
) -> None:
    """A reference's per-layer rule (MoE layers, rope layers), run on the config
    it will read, must give the plan's layers (the vLLM model's rules are checked
    the same way)."""
    config = SimpleNamespace(**hf)
    got = (
        None
        if expr is None
        else tuple(
            bool(eval(expr, {}, {"config": config, "i": i}))  # noqa: S307
            for i in range(len(want))
        )
    )
    # None in ``want``: a layer the rule does not concern (any value).
    if got is None or any(
        w is not None and g != w for g, w in zip(got, want, strict=True)
    ):
        rule = expr or "none in the config"
        raise InputError(
            f"{spec.name}: the reference's {what} rule ({rule}) gives "
            f"{got and list(got)} on its config, but the spec's layers are "
            f"{list(want)}"
        )


def _uses_rope(arch) -> bool:
    """Some attention layer or an MTP head rotates q and k."""
    return arch.mtp is not None or True in arch.rope_layers


def _class_names(spec: ModelSpec) -> dict[str, str]:
    prefix = class_prefix(spec.architecture)
    base_model = f"{prefix}Model"
    if base_model == spec.architecture:
        base_model = f"{prefix}BaseModel"
    return {
        "config": f"{prefix}Config",
        "pretrained": f"{prefix}PreTrainedModel",
        "model": base_model,
        "causal_lm": spec.architecture,
    }


def reference_context(spec: ModelSpec) -> dict[str, Any]:
    names = module_names(spec)
    cls = _class_names(spec)
    arch = build_plan(spec)
    keys = arch.config
    hf = keys.hf
    types = arch.attention_types
    att = arch.attention
    f = {
        "mla": att.kind == "mla",
        # Sparse MLA: the lightning indexer and its rope's pairs.
        "indexer": att.indexer is not None,
        "index_interleaved": att.indexer is not None and att.indexer.rope_interleave,
        # Layers that reuse the nearest earlier indexer's top-k (GLM).
        "index_shared": bool(arch.shared_index_layers),
        "q_lora": att.mla is not None and att.mla.q_lora_rank is not None,
        # Mistral-4's position-dependent query scaling.
        "llama_4_scaling": att.llama_4_scaling,
        # Its layers that read another's KV cache leave k's norm (_ignore_unexpected).
        "qk_norm": att.part(QkNorm) is not None,
        "qkv_bias": att.qkv_bias,
        "o_bias": att.o_bias,
        "partial": att.kind == "gqa" and att.partial_rotary_factor != 1.0,
        **_rope_flags(arch, hf, keys),
        # yarn's correction range left unrounded (truncate: false, gpt-oss)
        "yarn_fractional": arch.rope.scaling is not None
        and arch.rope.scaling.truncate is False,
        "interleaved": arch.rope.interleaved,
        "sliding": "sliding_attention" in types,
        "nope": arch.nope,
        "rope": _uses_rope(arch),
        "kv_sharing": bool(arch.kv_sources),
        **_block_form(arch),
        # Gemma's norms scale by 1 + weight (its sandwich norms are the residual
        # stream's, its softmax scale, scaled embeddings and final soft-cap
        # their components').
        "unit_offset": arch.norms.unit_offset,
        "dense": arch.has_dense,
        # Beside the MoE block on the layer (Granite-MoE-Shared's shared_mlp).
        "shared_on_layer": names.get("shared_parent") == "layer",
        "mtp": arch.mtp is not None,
        "mtp_moe": arch.mtp is not None and arch.mtp.block.is_moe,
        **_moe_flags(spec, arch),
        "linear": arch.linear is not None,
    }

    c: dict[str, str | None] = {
        "hidden": keys.need("hidden_size"),
        "vocab": keys.need("vocab_size"),
        "layers": keys.need("num_hidden_layers"),
        "heads": keys.need("num_attention_heads"),
        # Rope's parameters, where some layer (or an MTP head) rotates q and k.
        "rope": keys.need("rope_parameters") if _uses_rope(arch) else None,
    }
    c["rope_interleave"] = keys.find("rope_interleave")
    if f["longrope"] and not (f["longrope_attention_factor"] or f["longrope_factor"]):
        c["max_positions"] = keys.need("max_position_embeddings")
    c["index_interleave"] = (
        keys.find("indexer_rope_interleave") if f["indexer"] else None
    )
    c.update(_eps_keys(spec, arch, keys))
    if f["mla"]:
        for short, concept in (
            ("qk_nope", "qk_nope_head_dim"),
            ("qk_rope", "qk_rope_head_dim"),
            ("v_head", "v_head_dim"),
            ("kv_lora", "kv_lora_rank"),
        ):
            c[short] = keys.need(concept)
        if f["q_lora"]:
            c["q_lora"] = keys.need("q_lora_rank")
        if f["indexer"]:
            c["index_heads"] = keys.need("index_n_heads")
            c["index_dim"] = keys.need("index_head_dim")
            c["index_topk"] = keys.need("index_topk")
        if f["index_shared"]:
            c["indexer_types"] = keys.need("indexer_types")
        c["rotary_dim"] = f"config.{c['qk_rope']}"
    else:
        c["kv_heads"] = keys.find("num_key_value_heads") or c["heads"]
        derived = f"config.{c['hidden']} // config.{c['heads']}"
        head_dim = keys.find("head_dim")
        c["head_dim"] = f"config.{head_dim} or {derived}" if head_dim else derived
        c["rotary_dim"] = c["head_dim"]
        if f["partial"]:
            partial = keys.find("partial_rotary_factor")
            factor = f"config.{partial}" if partial else repr(att.partial_rotary_factor)
            c["rotary_dim"] = f"int(({c['head_dim']}) * {factor})"
        c["qkv_bias"] = keys.find("qkv_bias", att.qkv_bias)
    # A key that says otherwise (GLM: attention_bias, none on o_proj) is not it.
    c["o_bias"] = keys.find("o_bias", att.o_bias)
    if f["dense"]:
        c["inter"] = keys.dense_width()

    per_layer: dict[str, Any] = {}
    if f["sliding"]:
        c["window"] = keys.need("sliding_window")
        if keys.find("layer_types") is not None:
            per_layer["sliding"] = "layer_types"
            c["layer_types"] = keys.need("layer_types")
        elif "full_attention" not in types:
            per_layer["sliding"] = "all"
        else:
            per_layer["sliding"] = "pattern"
            c["window_pattern"] = keys.need("sliding_window_pattern")
    if f["kv_sharing"]:
        c["kv_sharing"] = keys.need("kv_sharing_target_layers")
    if f["nope"]:
        per_layer["rope"] = _rope_rule(spec, keys, arch)
    if arch.moe is not None:
        per_layer["moe"] = _moe_keys(spec, keys, f, c, arch.moe_layers)
    if f["mtp"]:
        c["n_mtp"] = keys.need("num_nextn_predict_layers")
    linear = _linear_code(spec, arch, keys)
    if linear is not None:
        per_layer["linear"] = linear.layer_rule("i")

    mlp_classes, role_class = _mlp_classes(names, f)
    parts = _components_context(spec, arch, keys)
    return {
        **parts,
        "spec": spec,
        # The linear-attention layers' code (None without them).
        "linear": linear,
        "doc": docstring,
        "module": spec.module_name,
        "cls": cls,
        "n": names,
        "f": f,
        "c": c,
        "stream": _stream_reference(arch.layers[0].stream, names, keys),
        "per_layer": per_layer,
        "summary": _summary(spec, arch, f),
        "moe_doc": _moe_doc(f),
        "stacked_doc": _stacked_doc(f),
        "attention_doc": _attention_doc(f, parts["part_docs"]),
        "mlp_classes": mlp_classes,
        "dense_cls": role_class.get("dense", "MLP"),
        "expert_cls": role_class.get("expert", "MLP"),
        "shared_cls": role_class.get("shared", "MLP"),
        "bias_zeros": _bias_zeros(f, c),
        "lm_head": names.get("lm_head", "lm_head"),
        "tied_head": names.get("lm_head", "lm_head"),
        "ignore_unexpected": _ignore_unexpected(spec, names, f),
        **config_class_context(spec, hf),
    }


@dataclass(frozen=True)
class StreamReference:
    """What the residual stream's reference fragments print
    (templates/components/residual_stream/hf_*.py.j2)."""

    form: str  # the placement: pre, post, parallel or sandwich
    # The layer's norm modules the block runs before its mixer, and after it.
    before: tuple[str, ...]
    after: tuple[str, ...]
    # The config key of the multiplier on each sublayer's output (Granite).
    multiplier_key: str | None


def _stream_reference(
    stream: ResidualStream, names: dict[str, str], keys: ConfigKeys
) -> StreamReference:
    first = stream.at("attention_input")
    return StreamReference(
        stream.placement,
        tuple(names[r] for r in stream.roles if r == first),
        tuple(names[r] for r in stream.roles if r != first),
        residual_stream.COMPONENT.multiplier_key(stream, keys),
    )


def _bias_zeros(f: dict[str, Any], c: dict[str, str | None]) -> str | None:
    """The router bias's initial value (None: the router corrects no score)."""
    if not f["bias_at"]:
        return None
    return f"torch.zeros({'1, ' if f['bias_2d'] else ''}config.{c['n_experts']})"


def _components_context(spec: ModelSpec, arch, keys: ConfigKeys) -> dict[str, Any]:
    """The components' fragments by slot, what each prints, and what each says
    of itself in the attention's docstring."""
    parts = components.parts(arch.attention)
    return {
        "hf_slots": components.fragments(spec, "hf"),
        "parts": {
            c.name: c.reference_context(node, keys)
            for c, node in components.code_parts(arch)
        },
        "part_docs": [
            doc for c, node in parts if (doc := c.describe(node)) is not None
        ],
        # What they pass to the softmax core (attend), after the scale.
        "attend_inputs": "".join(
            f", {name}" for c in components.present(spec) for name in c.attend_inputs
        ),
    }


def _linear_code(
    spec: ModelSpec, arch: ArchPlan, keys: ConfigKeys
) -> LinearAttentionCode | None:
    """What the linear-attention layers print (None without them); its rule for
    which layers are linear (of ``config`` and ``i``) is checked against the
    plan's layers."""
    if arch.linear is None:
        return None
    code = linear_attention.COMPONENT.reference_context(arch.linear, keys)
    rule = code.layer_rule("i")
    _check_layer_plan(spec, keys.hf, rule, arch.linear_layers, "linear-attention layer")
    return code


def _eps_keys(spec: ModelSpec, arch: ArchPlan, keys: ConfigKeys) -> dict[str, str]:
    """The norms' eps and the MLA latent norms' (a config key where the config
    has one, else the family's fixed value)."""
    eps = keys.find(eps_concept(spec))
    out = {"eps": f"config.{eps}" if eps else repr(arch.norms.eps)}
    mla = arch.attention.mla
    latent_eps = mla.latent_norm_eps if mla is not None else None
    if latent_eps is None:
        out["latent_eps"] = out["eps"]
    else:
        key = keys.find("mla_norm_eps")
        out["latent_eps"] = f"config.{key}" if key else repr(latent_eps)
    return out


def _rope_flags(arch, hf: dict, keys: ConfigKeys) -> dict[str, Any]:
    """How the reference computes rope: one scaling kind at most, and, where the
    config keys rope_parameters by layer type (Gemma-3, OLMo-3), one rope per
    kind, each layer taking its own kind's (checked against the plan)."""
    if not _uses_rope(arch):  # (Kimi Linear: no layer rotates q and k)
        return {
            "scaling": None,
            "yarn": False,
            "longrope": False,
            "longrope_attention_factor": False,
            "longrope_factor": False,
            "rope_by_kind": False,
            "plain_kind": False,
        }
    params = hf[keys.need("rope_parameters")]
    by_kind = arch.rope_by_kind(params)
    kinds = list(params.values()) if by_kind else [params]
    types = {p.get("rope_type", "default") for p in kinds} - {"default"}
    assert len(types) <= 1, "spec rules allow one rope scaling kind"
    scaling = types.pop() if types else None
    longrope = [p for p in kinds if p.get("rope_type") == "longrope"]
    return {
        "scaling": scaling,
        "yarn": scaling == "yarn",
        # LongRoPE's factor on cos and sin: stated, from `factor`, or from the
        # context's ratio (transformers' _compute_longrope_parameters).
        "longrope": bool(longrope),
        "longrope_attention_factor": any("attention_factor" in p for p in longrope),
        "longrope_factor": any("factor" in p for p in longrope),
        "rope_by_kind": by_kind,
        # Some layer kind rotates without the scaling the other has.
        "plain_kind": by_kind
        and scaling is not None
        and len(kinds)
        > len([p for p in kinds if p.get("rope_type", "default") != "default"]),
    }


def _block_form(arch) -> dict[str, bool]:
    """The decoder block's norms (kind, bias, placement) and whether the
    checkpoint stores q/k/v fused."""
    norms, stream = arch.norms, arch.layers[0].stream
    return {
        "layernorm": norms.kind == "layernorm",
        "norm_bias": norms.has_bias,
        "parallel_norm": stream.placement == "parallel",
        "fused_qkv": "qkv_proj" in arch.fused,
    }


def _moe_flags(spec: ModelSpec, arch: ArchPlan) -> dict[str, Any]:
    """The MoE block's features (all off without one)."""
    moe = arch.moe
    return {
        "moe": moe is not None,
        "shared": moe is not None and moe.num_shared_experts > 0,
        "shared_gate": moe is not None and moe.shared_expert_gate,
        "bias_correction": moe is not None and moe.router.bias_correction,
        # Where the bias sits (module_tree.router_bias_at) and its stored shape.
        "bias_at": router_bias_at(spec)
        if moe is not None and moe.router.bias_correction
        else None,
        "bias_2d": moe is not None and moe.router.bias_2d,
        # checkpoint.fused: experts, the routed experts stacked in two tensors;
        # as gpt-oss stores them, one module of its own (experts_format).
        "stacked": moe is not None and moe.stacked,
        "gpt_oss_experts": gpt_oss_experts(spec),
        # Stacked, output dim first, as parameters of one module (Mistral-4).
        "parameter_experts": parameter_experts(spec),
        "transposed_experts": transposed_experts(spec),
        "weight_on_input": moe is not None and moe.router.weight_on_input,
        "expert_bias": moe is not None and moe.expert_bias,
        "clamped_swiglu": moe is not None and moe.clamped_swiglu is not None,
    }


def _rope_rule(spec: ModelSpec, keys: ConfigKeys, arch) -> str:
    """The reference's per-layer rope rule (of ``config`` and ``i``), checked
    against the plan's NoPE layers."""
    expr = keys.rope_layer_expr("i")
    _check_layer_plan(spec, keys.hf, expr, arch.rope_layers, "rope layer")
    assert expr is not None  # the check refuses a missing rule
    return expr


def _moe_keys(
    spec: ModelSpec,
    keys: ConfigKeys,
    f: dict[str, Any],
    c: dict[str, str | None],
    moe_layers: tuple[bool, ...],
) -> list[str]:
    """Adds the MoE's config keys to ``c``; returns the MoE layer rule's terms
    (of ``config`` and ``i``), checked against the plan's MoE layers."""
    moe, hf = spec.mlp.moe, keys.hf
    assert moe is not None
    c["n_experts"] = keys.need("n_routed_experts")
    c["top_k"] = keys.need("num_experts_per_tok")
    # Mixtral keeps the experts' width in intermediate_size (no dense layers).
    c["expert_width"] = f"config.{keys.need('moe_intermediate_size')}"
    if f["shared"]:
        if moe.shared_expert_intermediate_size is not None:
            key = keys.need("shared_expert_intermediate_size")
            c["shared_width"] = f"config.{key}"
        elif keys.find("n_shared_experts") is None and moe.num_shared_experts == 1:
            # No count key: one shared expert of the experts' width (HunYuan-MoE).
            c["shared_width"] = c["expert_width"]
        else:
            key = keys.need("n_shared_experts")
            c["shared_width"] = f"config.{key} * {c['expert_width']}"
    if f["clamped_swiglu"]:
        c["swiglu_alpha"] = keys.need("swiglu_alpha", moe.swiglu_alpha)
        c["swiglu_limit"] = keys.need("swiglu_limit", moe.swiglu_limit)
    terms = keys.moe_layer_terms("i")
    terms = terms or ["True"]
    _check_layer_plan(spec, hf, " and ".join(terms), moe_layers)
    return terms


def _mlp_classes(
    names: dict[str, str], f: dict[str, Any]
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """One gated-MLP class per distinct (gate, up, down) naming. Stacked routed
    experts (checkpoint.fused: experts) have no class of their own: the MoE block
    holds their tensors."""
    groups = []
    if f["dense"]:
        groups.append(("dense", "MLP", "", "dense layers"))
    if f["moe"] and not f["stacked"]:
        groups.append(("expert", "ExpertMLP", "expert_", "routed experts"))
    if f["shared"]:
        groups.append(("shared", "SharedExpertMLP", "shared_", "shared experts"))
    classes: list[dict[str, Any]] = []
    role_class: dict[str, str] = {}
    for group, cls, role_prefix, what in groups:
        # (gate, up, down, gate_up): the dense MLP's gate and up may be one tensor.
        triple = tuple(
            names.get(f"{role_prefix}{p}_proj")
            for p in ("gate", "up", "down", "gate_up")
        )
        same = next((m for m in classes if m["triple"] == triple), None)
        if same is None:
            same = {"cls": cls, "triple": triple, "uses": []}
            classes.append(same)
        same["uses"].append(what)
        role_class[group] = same["cls"]
    out = [
        {
            "cls": m["cls"],
            "gate": m["triple"][0],
            "up": m["triple"][1],
            "down": m["triple"][2],
            "gate_up": m["triple"][3],
            "doc": "Gated MLP, down(act(gate(x)) * up(x)), of the "
            + _and(m["uses"])
            + ".",
        }
        for m in classes
    ]
    return out, role_class


def _ignore_unexpected(
    spec: ModelSpec, names: dict[str, str], f: dict[str, Any]
) -> list[str]:
    """Regexes for K/V tensors of KV-sharing layers, which the reference lacks."""
    if not f["kv_sharing"]:
        return []
    if f["mla"]:
        roles = ["kv_a_proj", "kv_a_norm"]  # the latent and rope key it reads
    else:
        roles = ["k_proj", "v_proj"] + (["k_norm"] if f["qk_norm"] else [])
    patterns = []
    for role in roles:
        path = spec.tensor_path(role).split(".", 1)[1]  # below the base model
        patterns.append(re.escape(path).replace(r"\{layer\}", r"\d+") + r"\.")
    return patterns


def config_class_context(spec: ModelSpec, hf: dict | None = None) -> dict[str, Any]:
    """What the typed config class template needs (the reference's configuration
    file and the plugin's config module render the same class)."""
    fields = _config_fields(dict(hf or build_plan(spec).config.hf))
    names = {field["name"] for field in fields}
    return {
        "spec": spec,
        "config_class": f"{class_prefix(spec.architecture)}Config",
        "fields": fields,
        "derived": [field for field in fields if field["mutable"]],
        # Qwen2's switch: the window applies only with use_sliding_window.
        "window_switch": {"use_sliding_window", "sliding_window"} <= names,
        "any_untyped": any(field["type"] == "Any | None" for field in fields),
        "kda_view": _kda_view(spec),
    }


def _kda_view(spec: ModelSpec) -> dict[str, str] | None:
    """Kimi delta attention's sizes as Kimi Linear's config nests them
    (``linear_attn_config``, which vLLM's KDA layer reads): entry -> the flat
    config key holding it. None without Kimi delta attention."""
    arch = build_plan(spec)
    if not isinstance(arch.linear, KimiDeltaAttention):
        return None
    code = linear_attention.COMPONENT.code_context(arch.linear, arch.config)
    return {
        "num_heads": code.num_key_heads,
        "head_dim": code.key_head_dim,
        "short_conv_kernel_size": code.conv_kernel_size,
    }


def _config_fields(hf: dict[str, Any]) -> list[dict[str, Any]]:
    """The typed fields of the generated config class, one per config.json key.

    Lists and dicts default to None and get their value in ``__post_init__``;
    ``layer_types`` is derived there from ``sliding_window_pattern`` when the
    config has one (rather than spelled out per layer)."""
    fields = []
    for key, value in hf.items():
        if key in BASE_KEYS:
            continue
        if not key.isidentifier():
            raise InputError(f"config.json key {key!r} is not a Python identifier")
        mutable = isinstance(value, list | dict)
        fields.append(
            {
                "name": key,
                # EXAONE-4 publishes its pattern as letters ("LLLG") beside
                # layer_types, which is what the layers read then.
                "type": "int | str | None"
                if key == "sliding_window_pattern"
                else _field_type(value),
                "default": "None" if mutable else repr(value),
                "value": _per_layer(value, hf.get("num_hidden_layers")),
                "mutable": mutable,
                "pattern": key == "layer_types" and _by_pattern(hf),
            }
        )
    return fields


def _by_pattern(hf: dict[str, Any]) -> bool:
    """``layer_types`` is what ``sliding_window_pattern`` gives (then the class
    derives it instead of listing it)."""
    n, pattern = hf.get("num_hidden_layers"), hf.get("sliding_window_pattern")
    if not isinstance(n, int) or not isinstance(pattern, int) or pattern < 1:
        return False
    return hf.get("layer_types") == [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(n)
    ]


def _per_layer(value: Any, layers: Any) -> str:
    """Source of a default: a per-layer list of one repeated value as
    ``[v] * self.num_hidden_layers``, anything else as its repr."""
    if (
        isinstance(value, list)
        and len(value) == layers
        and len(value) > 1
        and all(v == value[0] for v in value)
        and not isinstance(value[0], list | dict)
    ):
        return f"[{value[0]!r}] * self.num_hidden_layers"
    if (
        isinstance(value, list)
        and len(value) == layers
        and sum(v is None for v in value) > len(value) // 2
    ):
        # Mostly None (KV-sharing targets): the few set layers, as a map.
        pairs = {i: v for i, v in enumerate(value) if v is not None}
        return f"[{pairs}.get(i) for i in range(self.num_hidden_layers)]"
    return repr(value)


def _field_type(value: Any) -> str:
    """The annotation of a config field with this (JSON) value."""
    # Scalars may be null too: a checkpoint's config can say so.
    if isinstance(value, bool):
        return "bool | None"
    if isinstance(value, int):
        return "int | None"
    if isinstance(value, float):
        return "float | int | None"
    if isinstance(value, str):
        return "str | None"
    if isinstance(value, dict):
        return "dict | None"
    if isinstance(value, list):
        kinds = {_field_type(v).removesuffix(" | None") for v in value}
        if len(kinds) == 1 and (kind := kinds.pop()) in ("bool", "int", "str"):
            return f"list[{kind}] | None"
        return "list | None"
    return "Any | None"  # null: the key is there, its type is the spec's to give


def _summary(spec: ModelSpec, arch: ArchPlan, f: dict[str, Any]) -> list[str]:
    att = arch.attention
    parts = []
    if f["mla"]:
        parts.append(
            (
                "sparse multi-head latent attention"
                if f["indexer"]
                else "multi-head latent attention"
            )
            + (" with a low-rank query" if f["q_lora"] else "")
            + (" and a lightning indexer" if f["indexer"] else "")
        )
    else:
        kind = (
            "multi-head"
            if att.num_kv_heads == att.num_heads
            else ("multi-query" if att.num_kv_heads == 1 else "grouped-query")
        )
        extras = [
            name
            for name, on in (
                # KV sharing varies by layer: listed with the layer kinds below.
                *(
                    (c.label, True)
                    for c in components.present(spec, "attention")
                    if c.label and c.name != "kv_sharing"
                ),
                ("q/k/v biases", f["qkv_bias"]),
                ("an output bias", f["o_bias"]),
            )
            if on
        ]
        parts.append(
            f"{kind} attention" + (" with " + ", ".join(extras) if extras else "")
        )
    if isinstance(arch.linear, GatedDeltaNet):
        parts.append("Gated DeltaNet linear-attention layers")
    if isinstance(arch.linear, KimiDeltaAttention):
        parts.append("Kimi delta attention linear-attention layers")
    if f["sliding"]:
        parts.append("sliding-window layers")
    if f["kv_sharing"]:
        parts.append("cross-layer KV sharing")
    rope = "interleaved rope" if f["interleaved"] else "rope"
    if f["partial"]:
        rope = f"partial {rope} ({att.partial_rotary_factor:g} of each head)"
    if f["scaling"]:
        rope += f" with {f['scaling']} scaling"
    parts.append(rope)
    if f["moe"]:
        moe = arch.moe
        assert moe is not None
        what = f"mixture of experts ({moe.router.scoring} routing"
        if f["shared"]:
            what += ", shared experts"
        parts.append(what + ")")
        if f["dense"]:
            parts.append("dense layers")
    else:
        parts.append("dense MLP")
    bare = f["layernorm"] and not f["norm_bias"]
    parts.append("layernorm without bias" if bare else arch.norms.kind)
    if f["parallel_norm"]:
        parts.append("parallel attention and MLP")
    names = {
        "qkv_proj": "q/k/v",
        "gate_up_proj": "gate/up",
        "shared_gate_up_proj": "the shared expert's gate/up",
    }
    fused = [names[r] for r in spec.checkpoint.fused if r in names]
    if fused:
        parts.append(f"{' and '.join(fused)} stored as one tensor each")
    if f["gpt_oss_experts"]:
        parts.append("each layer's experts stacked in one module (gpt-oss)")
    elif f["parameter_experts"]:
        parts.append("each layer's experts stacked in one module")
    elif f["stacked"]:
        parts.append("each layer's experts stacked in two tensors")
    head = arch.part(Logits)
    if head is not None and head.scale != 1.0:
        parts.append("scaled logits")
    if head is not None and head.tied:
        parts.append("tied embeddings")
    embed = arch.part(Embeddings)
    multiplied = embed is not None and embed.multiplier != 1.0
    if multiplied or arch.layers[0].stream.multiplier != 1.0:
        parts.append("scaled embeddings and residual branches (Granite)")
    if arch.mtp is not None:
        n = arch.mtp.num_heads
        parts.append(f"{n} multi-token-prediction head{'s' if n > 1 else ''}")
    text = "Architecture: " + ", ".join(parts) + "."
    return textwrap.wrap(text, width=88)


def docstring(text: str, indent: int) -> str:
    """The body of a docstring opened at ``indent``, wrapped to line length 88.

    Paragraphs are separated by blank lines. The first line leaves room for both
    quote triples, so a one-line docstring always fits on its line.
    """
    pad = " " * indent
    width = 88 - indent
    lines: list[str] = []
    for para in text.split("\n\n"):
        words = " ".join(para.split())
        if lines:
            lines += [""] + textwrap.wrap(words, width=width)
            continue
        first = textwrap.wrap(words, width=width - 6)[0]
        rest = words[len(first) :].strip()
        lines += [first] + (textwrap.wrap(rest, width=width) if rest else [])
    if len(lines) == 1:
        return lines[0]
    body = "\n".join(pad + line if line else line for line in lines[1:])
    return f"{lines[0]}\n{body}\n{pad}"


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def _moe_doc(f: dict[str, Any]) -> str:
    doc = "Routed experts"
    if f["gpt_oss_experts"]:
        doc += " (stacked in one module)"
    if f["shared_gate"]:
        doc += " plus shared experts behind a sigmoid gate"
    elif f["shared"]:
        doc += " plus always-on shared experts"
    return doc + "."


def _stacked_doc(f: dict[str, Any]) -> str:
    if not f["gpt_oss_experts"]:
        return ""
    doc = (
        "Every routed expert of a layer, stacked, input dim first (gpt-oss): "
        "gate_up_proj [experts, hidden, 2 x width] with each expert's gate and up "
        "columns interleaved, down_proj [experts, width, hidden]"
    )
    if f["expert_bias"]:
        doc += ", and their biases"
    return doc + (
        ". The clamped SwiGLU: gate clamped above at the limit, up to [-limit, "
        "limit], then (up + 1) * gate * sigmoid(alpha * gate)."
    )


def _attention_doc(f: dict[str, Any], part_docs: list[str]) -> str:
    doc = "Grouped-query attention"
    doc += "".join(f", {phrase}" for phrase in part_docs)
    doc += "."
    if f["kv_sharing"]:
        doc += (
            "\n\nA layer with kv_source set computes queries only: it attends over "
            "the K/V that layer kv_source computed in the same forward pass (and "
            "cached), and has no K/V projections of its own."
        )
    return doc
