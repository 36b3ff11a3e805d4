"""The template context: every decision about the generated model, made from the spec.

Templates only print what this module decided. Features (qk-norm, biases, MoE,
MLA, sliding windows, ...) are decided here, at generation time, so the generated
file contains exactly the code paths the spec uses; sizes and per-layer plans are
read by the generated code from the checkpoint's config (see
:mod:`onboard.arch.config_keys`).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from onboard import components
from onboard.arch import (
    ArchPlan,
    GatedDeltaNet,
    KimiDeltaAttention,
    Norms,
    build_plan,
)
from onboard.arch.config_keys import (
    ConfigKeys,
    GenerationError,
    eps_concept,
)
from onboard.components import (
    dense_mlp,
    embeddings,
    kv_sharing,
    linear_attention,
    logits,
    residual_stream,
    softmax_scale,
)
from onboard.components.embeddings import Embeddings
from onboard.components.linear_attention import (
    KDA_OUTPUT_NORM_EPS,
    LinearAttentionCode,
)
from onboard.components.logits import Logits
from onboard.components.mtp import COMPONENT as MTP_HEADS
from onboard.components.residual_stream import ResidualStream
from onboard.components.softmax_scale import SoftmaxScale
from onboard.spec.hf import transformers_knows
from onboard.spec.layouts import (
    LAYOUT_PRESETS,
    PARAM_ROLES,
    ROUTED_EXPERT_ROLES,
    SHARED_EXPERT_ROLES,
    STACKED_EXPERT_ROLES,
    gpt_oss_param,
)
from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.module_tree import (
    gpt_oss_experts,
    parameter_experts,
)
from onboard.spec.mtp import mtp_draft
from onboard.templating import py_str

# The module tree the generated model builds is vLLM's usual one (the Llama /
# DeepSeek naming). Checkpoint names that differ are renamed by the model's
# ``hf_to_vllm_mapper``, which vLLM also applies to a quantization config's
# module lists.
CANONICAL = LAYOUT_PRESETS["llama"]
# A decoder layer's own modules besides its MLP, which an MLP may not be named.
LAYER_ATTRIBUTES = (
    "self_attn",
    "linear_attn",
    "linear_attention",
    "input_layernorm",
    "post_attention_layernorm",
    "post_feedforward_layernorm",
)


@dataclass
class Rename:
    """One checkpoint -> vLLM module-path rename for ``hf_to_vllm_mapper``."""

    role: str
    pattern: str  # Python raw-string body of the regex
    replacement: str

    @property
    def pattern_parts(self) -> list[str]:
        """The pattern cut at dots into pieces that fit a line (joined by Python's
        implicit string concatenation)."""
        parts = [""]
        for piece in re.split(r"(?=\\\.)", self.pattern):
            if parts[-1] and len(parts[-1]) + len(piece) > 56:
                parts.append("")
            parts[-1] += piece
        return parts


@dataclass
class Context:
    spec: ModelSpec
    values: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, **self.values}


# ---- module paths -------------------------------------------------------------------


def _layer_rel(path: str) -> str | None:
    """``model.layers.{layer}.mlp.gate`` -> ``mlp.gate`` (None: not a layer path)."""
    head = "model.layers.{layer}."
    return path[len(head) :] if path.startswith(head) else None


def _vllm_moe_paths(
    spec: ModelSpec, has_dense: bool, has_shared: bool, has_shared_gate: bool
) -> dict[str, str]:
    """Module paths for the MoE roles, keeping the checkpoint's own names where
    they fit vLLM's structure (``block_sparse_moe``, Mixtral's ``w1/w2/w3``, Qwen's
    ``shared_expert``), as vLLM's hand-written models do: then neither weights nor
    quantization configs need renaming. Roles that do not fit are renamed."""
    dense_block = _vllm_dense_block(spec) if has_dense else None
    if "experts" in spec.checkpoint.fused:
        return _vllm_stacked_moe_paths(spec, dense_block)
    paths = _vllm_split_moe_paths(spec, dense_block, has_shared, has_shared_gate)
    # A shared expert's gate and up stored as one tensor load whole into its
    # gate_up_proj (vLLM's merged linear splits a tensor fused on disk).
    shared = paths["shared_gate_proj"].rsplit(".", 1)[0]
    paths["shared_gate_up_proj"] = f"{shared}.gate_up_proj"
    return paths


def _vllm_split_moe_paths(
    spec: ModelSpec, dense_block: str | None, has_shared: bool, has_shared_gate: bool
) -> dict[str, str]:
    """_vllm_moe_paths for experts stored one tensor per projection and expert."""
    paths = {
        role: CANONICAL[role]
        for role in (
            "router",
            *ROUTED_EXPERT_ROLES,
            *SHARED_EXPERT_ROLES,
            "shared_expert_gate",
        )
    }
    router = _layer_rel(spec.tensor_path("router")) or ""
    parts = router.split(".")
    if len(parts) != 2:
        return paths
    block, gate = parts
    if (
        block in LAYER_ATTRIBUTES
        or (dense_block is not None and block != dense_block)
        or gate == "experts"
    ):
        return paths
    leaves = []
    for role in ("expert_gate_proj", "expert_up_proj", "expert_down_proj"):
        rel = _layer_rel(spec.tensor_path(role)) or ""
        m = re.fullmatch(rf"{re.escape(block)}\.experts\.\{{expert\}}\.(\w+)", rel)
        if m is None:
            return paths
        leaves.append(m.group(1))
    if len(set(leaves)) != 3:
        return paths
    base = f"model.layers.{{layer}}.{block}"
    paths["router"] = f"{base}.{gate}"
    for role, leaf in zip(
        ("expert_gate_proj", "expert_up_proj", "expert_down_proj"), leaves, strict=True
    ):
        paths[role] = f"{base}.experts.{{expert}}.{leaf}"
    taken = {gate, "experts"}
    for role, leaf in (
        ("shared_gate_proj", "gate_proj"),
        ("shared_up_proj", "up_proj"),
        ("shared_down_proj", "down_proj"),
    ):
        paths[role] = f"{base}.shared_experts.{leaf}"
    if has_shared:
        rels = [
            _layer_rel(spec.tensor_path(r)) or ""
            for r in ("shared_gate_proj", "shared_up_proj", "shared_down_proj")
        ]
        ms = [
            re.fullmatch(rf"{re.escape(block)}\.(\w+)\.({leaf})", rel)
            for rel, leaf in zip(
                rels, ("gate_proj", "up_proj", "down_proj"), strict=True
            )
        ]
        names = {m.group(1) for m in ms if m is not None}
        if all(ms) and len(names) == 1 and not names & taken:
            shared = names.pop()
            taken.add(shared)
            for role, leaf in (
                ("shared_gate_proj", "gate_proj"),
                ("shared_up_proj", "up_proj"),
                ("shared_down_proj", "down_proj"),
            ):
                paths[role] = f"{base}.{shared}.{leaf}"
        else:
            taken.add("shared_experts")
    paths["shared_expert_gate"] = f"{base}.shared_expert_gate"
    if has_shared_gate:
        rel = _layer_rel(spec.tensor_path("shared_expert_gate")) or ""
        m = re.fullmatch(rf"{re.escape(block)}\.(\w+)", rel)
        if m is not None and m.group(1) not in taken:
            paths["shared_expert_gate"] = f"{base}.{m.group(1)}"
    return paths


def _vllm_stacked_moe_paths(spec: ModelSpec, dense_block: str | None) -> dict[str, str]:
    """Module paths for the MoE roles of stacked experts, as vLLM's granitemoe.py
    and gpt_oss.py have them: the checkpoint's MoE block name where the stacked
    experts and the router share one (``block_sparse_moe``, ``mlp``), its router
    under the checkpoint's name where it sits on the block (gpt-oss's ``router``)
    and as ``gate`` otherwise, the stacked tensors as the fused MoE layer's
    ``experts.gate_up_proj`` / ``down_proj`` (which it splits into each expert's
    w1 / w3 and w2; experts_format gpt_oss: the ``experts`` module, whose
    parameters keep their names), and the shared expert as the block's
    ``shared_experts`` (vLLM's fused MoE layer runs it)."""
    rels = [
        (_layer_rel(spec.tensor_path(role)) or "").split(".")
        for role in ("router", *STACKED_EXPERT_ROLES)
    ]
    blocks = {parts[0] for parts in rels}
    block = blocks.pop() if len(blocks) == 1 else "mlp"
    if (
        not block.isidentifier()
        or block in LAYER_ATTRIBUTES
        or (dense_block is not None and block != dense_block)
        or any(len(parts) < 2 for parts in rels)
    ):
        block = "mlp"
    base = f"model.layers.{{layer}}.{block}"
    router = rels[0]
    gate = "gate"
    if (
        len(router) == 2
        and router[0] == block
        and router[1].isidentifier()
        and router[1] not in ("experts", "shared_experts", "shared_expert_gate")
    ):
        gate = router[1]
    paths = {
        "router": f"{base}.{gate}",
        "experts_gate_up_proj": f"{base}.experts.gate_up_proj",
        "experts_down_proj": f"{base}.experts.down_proj",
        "shared_expert_gate": f"{base}.shared_expert_gate",
    }
    if gpt_oss_experts(spec):
        paths |= dict.fromkeys(STACKED_EXPERT_ROLES, f"{base}.experts")
    for role, leaf in (
        ("shared_gate_proj", "gate_proj"),
        ("shared_up_proj", "up_proj"),
        ("shared_gate_up_proj", "gate_up_proj"),
        ("shared_down_proj", "down_proj"),
    ):
        paths[role] = f"{base}.shared_experts.{leaf}"
    # Each expert's name in the fused MoE layer (quantization configs name them).
    for role, leaf in zip(
        ROUTED_EXPERT_ROLES, ("gate_proj", "up_proj", "down_proj"), strict=True
    ):
        paths[role] = f"{base}.experts.{{expert}}.{leaf}"
    return paths


def _vllm_dense_block(spec: ModelSpec) -> str:
    """Decoder attribute of the dense MLP: the checkpoint's when its
    projections sit under one block with vLLM's leaf names, else ``mlp``."""
    blocks = set()
    for role in dense_mlp.COMPONENT.checkpoint_roles(spec):
        leaf = role
        rel = _layer_rel(spec.tensor_path(role)) or ""
        m = re.fullmatch(rf"(\w+)\.{leaf}", rel)
        if m is None:
            return "mlp"
        blocks.add(m.group(1))
    block = blocks.pop() if len(blocks) == 1 else "mlp"
    if block in LAYER_ATTRIBUTES:
        return "mlp"
    return block


# Roles whose rename is of one parameter, not of a whole module: the router's bias
# may sit on a module that holds other roles' modules too (the MoE block).
RENAMED_PARAM = {role: f".{param}" for role, param in PARAM_ROLES.items()}


def _router_bias_at(spec: ModelSpec) -> str:
    """Where the generated MoE block keeps the router's bias, as vLLM's own files
    do: on the router (DeepSeek-V3, and ERNIE-4.5-MoE's ``moe_statics``, renamed
    to it), or on the MoE block (EXAONE-MoE, MiniMax-M2: a parameter of the block
    in the checkpoint)."""
    path = spec.tensor_path("router_bias")
    if path == spec.tensor_path("router"):
        return "router"
    rel = _layer_rel(path)
    return "moe" if rel is not None and "." not in rel else "gate"


def rename_rule(role: str, source: str, target: str) -> Rename:
    """Regex rename of one role's module path (with its parameter suffixes)."""
    pattern = ""
    for piece in re.split(r"(\{layer\}|\{expert\})", source):
        if piece == "{layer}":
            pattern += r"(?P<layer>\d+)"
        elif piece == "{expert}":
            pattern += r"(?P<expert>\d+)"
        else:
            py_str(piece)  # identifiers and dots only
            pattern += piece.replace(".", r"\.")
    replacement = target.replace("{layer}", r"\g<layer>").replace(
        "{expert}", r"\g<expert>"
    )
    py_str(replacement.replace(r"\g<layer>", "0").replace(r"\g<expert>", "0"))
    # Anchored, and ending at a dot or the end, so `mlp.gate` does not also rename
    # `mlp.gate_proj`.
    return Rename(role, f"^{pattern}(?=\\.|$)", replacement)


def _renames(
    spec: ModelSpec, roles: list[str], vllm_paths: dict[str, str]
) -> list[Rename]:
    gpt_oss_module = "experts_gate_up_proj" if gpt_oss_experts(spec) else None
    parameters = parameter_experts(spec)
    out = [
        rename_rule(
            role,
            spec.tensor_path(role) + RENAMED_PARAM.get(role, ""),
            vllm_paths[role] + RENAMED_PARAM.get(role, ""),
        )
        for role in roles
        if spec.tensor_path(role) != vllm_paths[role]
        # gpt-oss's stacked experts: one module, renamed once (its parameters
        # keep their names).
        and (role not in STACKED_EXPERT_ROLES or role == gpt_oss_module)
    ]
    for role in STACKED_EXPERT_ROLES:
        if role in roles and parameters:
            # Mistral-4's stacks: parameters of one module, named after the roles.
            stored = f"{spec.tensor_path(role)}.{gpt_oss_param(role)}"
            if stored != vllm_paths[role]:
                out.append(rename_rule(role, stored, vllm_paths[role]))
        elif role in roles and gpt_oss_module is None:
            # The fused MoE layer takes a stacked tensor by its own name, without
            # the checkpoint's ".weight" (as vLLM's granitemoe.py maps them).
            rename = rename_rule(role, spec.tensor_path(role), vllm_paths[role])
            rename.pattern = rename.pattern.removesuffix("(?=\\.|$)") + r"\.weight$"
            out.append(rename)
    check_renames(spec, out, lambda role: vllm_paths[role])
    return out


def check_renames(
    spec: ModelSpec, renames: list[Rename], target: Callable[[str], str]
) -> None:
    """Renames run one after another: none may match a path another one produced
    (e.g. two roles swapping names). ``target(role)``: the path a role's rename
    produces."""
    for a in renames:
        produced = (target(a.role) + RENAMED_PARAM.get(a.role, "")).format(
            layer=0, expert=0
        )
        for b in renames:
            if b is not a and re.search(b.pattern, produced):
                raise GenerationError(
                    f"{spec.name}: checkpoint.tensor_names: renaming {a.role} to "
                    f"{produced!r} collides with the checkpoint path of {b.role}"
                )


# ---- config-driven per-layer plans -----------------------------------------------


class _Cfg(SimpleNamespace):
    """The HF config dict as attributes, to evaluate generated expressions."""


def _check_expr(
    expr: str, hf: dict, want: list[Any], what: str, spec: ModelSpec
) -> None:
    """``expr`` must give ``want`` on each layer (None in ``want``: any value)."""
    cfg = _Cfg(**hf)
    got = [
        eval(expr, {}, {"config": cfg, "layer_idx": i})  # noqa: S307
        for i in range(len(want))
    ]
    if any(w is not None and g != w for g, w in zip(got, want, strict=True)):
        raise GenerationError(
            f"{spec.name}: the Hugging Face config's {what} ({expr}) gives "
            f"{got} per layer, but the spec says {want}"
        )


def _rope_layer_expr(spec: ModelSpec, arch: ArchPlan, f: ConfigKeys) -> str:
    """Expression (of ``config`` and ``layer_idx``) true on the layers that apply
    rope, checked against the plan's NoPE layers."""
    expr = f.rope_layer_expr("layer_idx")
    if expr is None:
        raise GenerationError(
            f"{spec.name}: the Hugging Face config written for this spec does not "
            "say which layers use rope (no no_rope_layers or layer_types)"
        )
    _check_expr(expr, f.hf, list(arch.rope_layers), "rope layer plan", spec)
    return expr


def _moe_layer_expr(spec: ModelSpec, arch: ArchPlan, f: ConfigKeys) -> str | None:
    """Expression (of ``config`` and ``layer_idx``) that is true on MoE layers,
    built from the placement fields the config actually has and checked against
    the plan's layers; None when every layer is MoE."""
    want = list(arch.moe_layers)
    if all(want):
        return None
    terms = f.moe_layer_terms("layer_idx")
    if not terms:
        raise GenerationError(
            f"{spec.name}: the Hugging Face config written for this spec does "
            "not say which layers are MoE (no first_k_dense_replace, "
            "decoder_sparse_step, mlp_only_layers or mlp_layer_types)"
        )
    expr = " and ".join(terms)
    _check_expr(expr, f.hf, want, "MoE layer plan", spec)
    return expr


# ---- the context ---------------------------------------------------------------------


def _mla_context(
    spec: ModelSpec, arch: ArchPlan, is_mla: bool, yarn: bool
) -> dict[str, Any]:
    """What the MLA layer prints beyond plain MLA: q-LoRA, Mistral-4's query
    scaling and whole-head rope factor, DeepSeek's YaRN, the sparse indexer."""
    att, rope = arch.attention, arch.rope
    latent_eps = att.mla.latent_norm_eps if is_mla and att.mla else None
    return {
        "mla_q_lora": bool(is_mla and att.mla and att.mla.q_lora_rank is not None),
        # Mistral-4's position-dependent query scaling.
        "mla_llama_4_scaling": is_mla and att.llama_4_scaling,
        # rope_parameters.partial_rotary_factor is the rope's share of the whole
        # q/k head (Mistral-4), not a share of qk_rope_head_dim.
        "mla_whole_head": is_mla and rope.whole_head,
        # DeepSeek's YaRN also scales the softmax by mscale(mscale_all_dim)^2.
        "mla_yarn": is_mla and yarn,
        "mla_yarn_mscale": bool(
            is_mla and yarn and rope.scaling and rope.scaling.mscale_all_dim
        ),
        # The latent norms' eps where it is not the model's (GLM-5's 1e-6).
        "mla_latent_eps": (
            latent_eps if latent_eps not in (None, arch.norms.eps) else None
        ),
        # Sparse MLA's lightning indexer: its index rope's pairs, shared layers.
        "indexer": (
            SimpleNamespace(
                interleaved=indexer.rope_interleave,
                shared=bool(arch.shared_index_layers),
            )
            if (indexer := arch.attention.indexer) is not None
            else None
        ),
    }


def _refuse_ungenerated(spec: ModelSpec, arch: ArchPlan) -> None:
    """What the Hugging Face reference computes and the vLLM model file does not
    print yet: MLA layers without rope, and Kimi delta attention where
    vLLM's layer computes something else (_refuse_kimi_delta)."""
    if isinstance(arch.linear, KimiDeltaAttention):
        _refuse_kimi_delta(spec)
    is_mla = arch.attention.kind == "mla"
    if is_mla and arch.kv_sources:
        _refuse_mla_kv_sharing(spec)
    elif is_mla and components.fragments(spec, "vllm")["mla.output"]:
        _refuse_direct_mla(spec, arch)
    if is_mla and arch.nope:
        raise GenerationError(
            f"{spec.name}: rope.nope_layers: the vLLM model is not generated for MLA "
            "layers without rope yet (the Hugging Face reference computes them)"
        )


def _refuse_mla_kv_sharing(spec: ModelSpec) -> None:
    """The spec's rules refuse what MLA KV sharing is not generated with; a
    spec built past them is refused here, with the same words."""
    for _, what in kv_sharing.mla_limits(spec):
        raise GenerationError(f"{spec.name}: {kv_sharing.mla_limit_message(what)}")


def _refuse_direct_mla(spec: ModelSpec, arch: ArchPlan) -> None:
    """MLA whose output a component changes before o_proj calls vLLM's
    MLAAttention directly; that form is generated for the plain rope only."""
    absent = [
        (arch.rope.scaling is not None, "rope.scaling"),
        (arch.attention.llama_4_scaling, "attention.llama_4_scaling"),
        (arch.rope.whole_head, f"{spec.model_type}'s whole-head rope"),
    ]
    for present, what in absent:
        if present:
            names = ", ".join(c.name for c in components.present(spec, "attention"))
            raise GenerationError(
                f"{spec.name}: the vLLM model of MLA with {names} calls vLLM's "
                f"MLAAttention itself, which is generated without {what} only"
            )


def _refuse_kimi_delta(spec: ModelSpec) -> None:
    """Kimi delta attention specs vLLM's KDA layer does not compute as the spec
    says: its output norm's eps and its recurrent state's dtype."""
    lin = spec.linear_attention
    assert lin is not None
    where = f"{spec.name}: linear_attention.type kimi_delta"
    if spec.norm.eps != KDA_OUTPUT_NORM_EPS:
        raise GenerationError(
            f"{where}: vLLM's Kimi delta attention layer normalises its output with "
            f"eps {KDA_OUTPUT_NORM_EPS} whatever rms_norm_eps says; a model with "
            f"norm.eps {spec.norm.eps} is not generated"
        )
    if lin.state_dtype != "float32":
        raise GenerationError(
            f"{where}: vLLM's Kimi delta attention layer keeps its recurrent state "
            "in float32; linear_attention.state_dtype bfloat16 is not generated"
        )


def build_context(
    spec: ModelSpec, hf: dict | None = None, *, mtp: bool = False
) -> dict[str, Any]:
    """Template context of the model file, or with ``mtp`` of the MTP draft file.

    The MTP file imports the model file's decoder layer for its blocks, so the
    model file's classes serve both: its MLP classes cover the MTP's ``mtp.mlp``
    too, and its decoder layer takes its per-layer plan (MLP kind, sliding window,
    KV-sharing target) as constructor arguments, which the model reads from the
    config's per-layer fields and the MTP file sets for an MTP block (full
    attention, its own KV cache, the MTP's MLP): MTP layers index past the
    ``num_hidden_layers`` entries of those fields. The two contexts differ only in
    which checkpoint tensors the file's own ``load_weights`` maps.
    """
    arch = build_plan(spec)
    _refuse_ungenerated(spec, arch)
    f = arch.config if hf is None else ConfigKeys(spec, hf)
    att = arch.attention
    is_mla = att.kind == "mla"
    mtp_mlp = arch.mtp and ("moe" if arch.mtp.block.is_moe else "dense")
    # The model file's MLP classes (for its layers and the MTP blocks).
    has_moe, has_dense = arch.has_moe, arch.has_dense
    mlp = SimpleNamespace(
        has_moe=has_moe,
        has_dense=has_dense,
        shared=bool(arch.moe and arch.moe.num_shared_experts),
        shared_gate=bool(arch.moe and arch.moe.shared_expert_gate),
    )
    # The MLP kinds whose checkpoint tensors this file loads.
    if mtp:
        assert mtp_mlp is not None
        mlp.loads_moe, mlp.loads_dense = mtp_mlp == "moe", mtp_mlp == "dense"
    else:
        mlp.loads_moe, mlp.loads_dense = has_moe, not all(arch.moe_layers)

    cfg = _model_config_keys(spec, arch, f)
    sliding = _sliding(arch)
    kv_sharing = bool(arch.kv_sources)

    moe_ctx = _moe_context(spec, arch, f, cfg, mlp)
    if arch.mtp is not None:
        cfg["num_mtp_layers"] = f.need("num_nextn_predict_layers", arch.mtp.num_heads)

    vllm_paths = _vllm_paths(spec, mlp)
    ckpt = spec.checkpoint
    norm_names = _layer_norm_names(spec, arch, vllm_paths, mlp)
    renames = _renames(spec, _loaded_roles(spec, arch, mlp, mtp=mtp), vllm_paths)
    names = _module_names(vllm_paths, mlp)
    stacked, packed = _stacked_params(spec, arch, mlp, names)

    rope = arch.rope
    kv_target_expr = None
    if kv_sharing:
        kv_target_expr = _kv_target_expr(cfg["kv_sharing"], f.hf[cfg["kv_sharing"]])
    # What differs between decoder layers (or between a layer and an MTP block):
    # the decoder layer's constructor arguments.
    layer_expr = moe_ctx["layer_expr"] if moe_ctx else None
    per_layer = SimpleNamespace(
        moe=has_moe and has_dense,
        # The model's `moe` per layer: its MoE layer rule, or None where every
        # layer is MoE (then the dense MLP serves the MTP blocks only).
        moe_rule=layer_expr,
        sliding=sliding != "none",
        kv_sharing=kv_sharing,
        nope=arch.nope,
        # Each layer's token mixer: linear attention or attention.
        linear=arch.linear is not None,
    )
    per_layer.any = (
        per_layer.moe
        or per_layer.sliding
        or per_layer.kv_sharing
        or per_layer.nope
        or per_layer.linear
    )
    rope_expr = _rope_layer_expr(spec, arch, f) if per_layer.nope else None
    layer_idx_needed = (
        sliding == "mixed"
        or kv_sharing
        or per_layer.nope
        or per_layer.linear
        or bool(per_layer.moe and layer_expr)
    )
    yarn = rope.yarn
    rope_by_kind = arch.rope_by_kind(f.hf[f.need("rope_parameters")])
    longrope_mscale = _longrope_mscale(arch, rope_by_kind)
    return {
        "spec": spec,
        "P": class_prefix(spec.architecture),
        "arch": spec.architecture,
        "module_name": spec.module_name,
        "cfg": cfg,
        "attn": att.kind,
        # Where q and k are normalised: None, "head", "projection", "after_rope".
        "qkv_bias": att.qkv_bias,
        "o_bias": att.o_bias,
        "linear": _linear_context(spec, arch, f, cfg),
        # Beside gqa attention the model's mapper stacks the KDA layers' q/k/v
        # projections too (as qkv_proj); the KDA layer takes them back.
        "kda_stacked_qkv": isinstance(arch.linear, KimiDeltaAttention)
        and not is_mla
        and "qkv_proj" not in arch.fused,
        "partial_rotary": att.partial_rotary_factor != 1.0,
        "neox": not rope.interleaved,
        "rope_scaling": rope.scaling.type if rope.scaling else None,
        "longrope_mscale": longrope_mscale,
        **_mla_context(spec, arch, is_mla, yarn),
        "kv_target_expr": kv_target_expr,
        "rope_expr": rope_expr,
        "layer_idx_needed": layer_idx_needed,
        # The model's layer factory reads the config.
        "per_layer_reads_config": layer_idx_needed or per_layer.sliding,
        "per_layer": per_layer,
        "layer_doc": _layer_doc(arch, per_layer) if per_layer.any else "",
        "summary": _summary(spec, arch),
        "rope_comment": _rope_comment(arch, rope_by_kind),
        "attn_doc": _attn_doc(spec, arch),
        "moe_doc": _moe_doc(arch),
        "sliding": sliding,
        # MLA layers reading an earlier layer's latent: the model hands it on.
        "mla_kv_sharing": is_mla and kv_sharing,
        **_components_context(spec, arch, f),
        **_norm_context(arch, cfg, mlp, norm_names, vllm_paths),
        "rope_by_kind": rope_by_kind,
        "has_dense": has_dense,
        "has_moe": has_moe,
        "moe": SimpleNamespace(**moe_ctx) if moe_ctx else None,
        "mtp": arch.mtp is not None,
        "mtp_doc": _mtp_doc(spec, arch) if mtp else "",
        "mtp_block_moe": mtp_mlp == "moe",
        "mtp_block_comment": _mtp_block_comment(per_layer) if mtp else [],
        "mtp_draft": mtp_draft(spec, standalone=True) if arch.mtp is not None else None,
        "mtp_prefixes": _mtp_prefixes(arch),
        "names": SimpleNamespace(**names),
        "renames": renames,
        "stacked": stacked,
        "packed": packed,
        # A multimodal wrapper's checkpoint: the language model reads its
        # text_config, loads its prefixed tensors and skips the other modules.
        "hf_config": "hf_text_config" if ckpt.language_model_prefix else "hf_config",
        "wrapper": (
            SimpleNamespace(
                prefix=ckpt.language_model_prefix, skipped=ckpt.skipped_prefixes
            )
            if ckpt.language_model_prefix
            else None
        ),
    }


def _norm_context(
    arch: ArchPlan,
    cfg: dict[str, Any],
    mlp: SimpleNamespace,
    norm_names: SimpleNamespace,
    vllm_paths: dict[str, str],
) -> dict[str, Any]:
    """The decoder layer's norms: their classes, placement and names."""
    norms = arch.norms
    first = arch.layers[0].stream
    stream = _stream_code(
        first,
        norms,
        vllm_paths,
        residual_stream.COMPONENT.multiplier_key(first, arch.config),
    )
    return {
        # The norm class of the layers and the final norm, and of the q/k norms.
        "norm_class": _norm_class(norms),
        "rms_class": "GemmaRMSNorm" if norms.unit_offset else "RMSNorm",
        # A LayerNorm without bias (Cohere) says so; vLLM's has one by default.
        "norm_args": ", bias=False"
        if norms.kind == "layernorm" and not norms.bias
        else "",
        "norm_names": norm_names,
        # The MLP takes reduce_results: a shared expert reduced with the routed
        # ones, a parallel block's MLP reduced with attention.
        "mlp_reduce_arg": mlp.shared or stream.form == "parallel",
        "stream": stream,
    }


@dataclass(frozen=True)
class StreamCode:
    """What the residual stream's vLLM fragments print
    (templates/components/residual_stream/)."""

    # The forward: ``pre``, ``post``, ``parallel``, ``sandwich``, or ``fused``
    # (pre-norm, the residual added in vLLM's RMSNorm kernel).
    form: str
    # The layer's norm modules, in the order the block runs them.
    norm_attrs: tuple[str, ...]
    # The config key of the multiplier on each sublayer's output (Granite).
    multiplier_key: str | None

    @property
    def fused(self) -> bool:
        """The layer takes and returns the residual beside the hidden states, so
        vLLM's RMSNorm adds it in the same kernel (sandwich blocks do too)."""
        return self.form in ("fused", "sandwich")


def _stream_code(
    stream: ResidualStream, norms: Norms, vllm_paths: dict[str, str], key: str | None
) -> StreamCode:
    """The residual stream's vLLM code from its plan node. vLLM's RMSNorm adds
    the residual in its kernel where the norms of attention's and the MLP's
    inputs are RMSNorms and no multiplier scales the sublayers' outputs (as
    vLLM's granite.py)."""
    form: str = stream.placement
    if stream.placement == "pre" and norms.kind == "rmsnorm" and key is None:
        form = "fused"
    attrs = tuple(_layer_rel(vllm_paths[role]) or "" for role in stream.roles)
    return StreamCode(form, attrs, key)


def _linear_context(
    spec: ModelSpec, arch: ArchPlan, f: ConfigKeys, cfg: dict[str, Any]
) -> LinearAttentionCode | None:
    """What the linear-attention layers print (None without them), checked
    against the config: vLLM's KDA layer reads some keys itself, and the layer
    rule must pick the plan's linear layers."""
    lin = arch.linear
    if lin is None:
        return None
    code = linear_attention.COMPONENT.vllm_context(lin, f)
    if code.kda:
        _check_kda_config(spec, f, cfg)
    cfg["layer_types"] = code.layer_types
    _check_expr(
        code.layer_rule("layer_idx"),
        f.hf,
        list(arch.linear_layers),
        "linear-attention layers",
        spec,
    )
    return code


def _check_kda_config(spec: ModelSpec, f: ConfigKeys, cfg: dict[str, Any]) -> None:
    """vLLM's KDA layer reads the model's config itself: ``hidden_size``,
    ``hidden_act``, ``rms_norm_eps`` and Kimi Linear's nested
    ``linear_attn_config`` (which the config class onboard generates for a new
    model type has as a property, and vLLM's own Kimi Linear config class has)."""
    where = f"{spec.name}: linear_attention.type kimi_delta"
    expected = {
        "hidden_size": cfg.get("hidden_size"),
        "hidden_act": f.find("hidden_act", spec.activation),
        "rms_norm_eps": cfg.get("norm_eps"),
    }
    for key, found in expected.items():
        if found != key:
            raise GenerationError(
                f"{where}: vLLM's Kimi delta attention layer reads config.{key}, "
                f"which this model's config.json does not have"
            )
    if transformers_knows(spec.model_type) and spec.model_type != "kimi_linear":
        raise GenerationError(
            f"{where}: vLLM's Kimi delta attention layer reads "
            f"config.linear_attn_config, which {spec.model_type}'s config class "
            "does not have"
        )


def _norm_class(norms) -> str:
    if norms.kind == "layernorm":
        return "LayerNorm"
    return "GemmaRMSNorm" if norms.unit_offset else "RMSNorm"


def _layer_norm_names(
    spec: ModelSpec, arch: ArchPlan, vllm_paths: dict[str, str], mlp: SimpleNamespace
) -> SimpleNamespace:
    """The decoder layer's attribute for each norm site of a sandwich block: the
    checkpoint's own names where all four are plain attributes of the layer (no
    renames, as vLLM's glm4.py keeps GLM-4's post_self_attn_layernorm), else
    vLLM's Gemma-2 names. Updates ``vllm_paths`` to match."""
    stream = arch.layers[0].stream
    if stream.placement != "sandwich":
        return SimpleNamespace()
    sites = ("attention_input", "attention_output", "mlp_input", "mlp_output")
    roles = [stream.at(site) for site in sites]
    leaves = [_layer_rel(spec.tensor_path(r)) or "" for r in roles]
    taken = {"self_attn", _vllm_dense_block(spec) if mlp.has_dense else "mlp"}
    if mlp.has_moe:
        taken.add((_layer_rel(vllm_paths["router"]) or "").split(".")[0])
    own = (
        all(leaf.isidentifier() for leaf in leaves)
        and len(set(leaves)) == len(leaves)
        and not set(leaves) & taken
    )
    if not own:
        leaves = [(_layer_rel(CANONICAL[r]) or "") for r in roles]
    for role, leaf in zip(roles, leaves, strict=True):
        vllm_paths[role] = f"model.layers.{{layer}}.{leaf}"
    return SimpleNamespace(**dict(zip(sites, leaves, strict=True)))


def _sliding(arch: ArchPlan) -> str:
    """Which layers slide: "none", "all" or "mixed"."""
    types = set(arch.attention_types)
    if "sliding_attention" not in types:
        return "none"
    return "all" if types == {"sliding_attention"} else "mixed"


def _model_config_keys(
    spec: ModelSpec, arch: ArchPlan, f: ConfigKeys
) -> dict[str, str | None]:
    """Config attribute names the model reads, by concept: sizes, attention,
    KV sharing and the dense MLP (the MoE's are added by :func:`_moe_context`)."""
    att = arch.attention
    cfg: dict[str, str | None] = {
        "vocab_size": f.need("vocab_size", spec.vocab_size),
        "hidden_size": f.need("hidden_size", spec.hidden_size),
        "num_hidden_layers": f.need("num_hidden_layers", spec.num_hidden_layers),
        "max_position_embeddings": f.need(
            "max_position_embeddings", spec.max_position_embeddings
        ),
        "num_attention_heads": f.need("num_attention_heads", att.num_heads),
        "norm_eps": f.need(eps_concept(spec), arch.norms.eps),
    }
    sliding = _sliding(arch)
    if sliding != "none":
        window = next(b.mixer.window for b in arch.layers if b.mixer.sliding)
        cfg["sliding_window"] = f.need("sliding_window", window)
        if sliding == "mixed":
            cfg["layer_types"] = f.need("layer_types", list(arch.attention_types))
    if att.kind == "mla":
        mla = att.mla
        assert mla is not None
        for concept in (
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ):
            cfg[concept] = f.need(concept, getattr(mla, concept))
        if mla.q_lora_rank is not None:
            cfg["q_lora_rank"] = f.need("q_lora_rank", mla.q_lora_rank)
        latent_eps = mla.latent_norm_eps
        if latent_eps not in (None, arch.norms.eps):
            # Where the config states it (else the literal: GLM-5's 1e-6).
            cfg["mla_norm_eps"] = f.find("mla_norm_eps", latent_eps)
        idx = att.indexer
        if idx is not None:
            cfg["index_topk"] = f.need("index_topk", idx.topk)
            cfg["index_n_heads"] = f.need("index_n_heads", idx.num_heads)
            cfg["index_head_dim"] = f.need("index_head_dim", idx.head_dim)
            shared = arch.shared_index_layers
            if shared:
                cfg["indexer_types"] = f.need(
                    "indexer_types",
                    ["shared" if b.index in shared else "full" for b in arch.layers],
                )
    else:
        cfg["qkv_bias"] = f.find("qkv_bias", att.qkv_bias)
        # MHA configs may leave the KV heads out (then they equal the heads).
        cfg["num_key_value_heads"] = f.find("num_key_value_heads", att.num_kv_heads)
        if cfg["num_key_value_heads"] is None and att.num_kv_heads != att.num_heads:
            f.need("num_key_value_heads", att.num_kv_heads)
        # Families without head_dim in their config derive it from the width.
        cfg["head_dim"] = f.find("head_dim", att.head_dim)
        cfg["head_dim_derivable"] = att.head_dim * att.num_heads == spec.hidden_size
        if cfg["head_dim"] is None and not cfg["head_dim_derivable"]:
            f.need("head_dim", att.head_dim)
    cfg["o_bias"] = f.find("o_bias", att.o_bias)
    cfg["rope_interleave"] = f.find("rope_interleave", arch.rope.interleaved)
    if att.indexer is not None:
        cfg["indexer_rope_interleave"] = f.find(
            "indexer_rope_interleave", att.indexer.rope_interleave
        )
    if arch.kv_sources:
        cfg["kv_sharing"] = _kv_sharing_field(arch, f)
    if arch.has_dense:
        assert spec.mlp.intermediate_size is not None
        cfg["intermediate_size"] = f.dense_width()
    # The spec has no MLP biases: a config that says so is read, not ignored.
    cfg["mlp_bias"] = f.find("mlp_bias", False)
    return cfg


def _moe_context(
    spec: ModelSpec,
    arch: ArchPlan,
    f: ConfigKeys,
    cfg: dict[str, str | None],
    mlp: SimpleNamespace,
) -> dict[str, Any]:
    """The MoE block's decisions (empty without MoE layers); adds the MoE's
    config attribute names to ``cfg``."""
    moe = arch.moe
    if moe is None or not mlp.has_moe:
        return {}
    cfg["num_experts"] = f.need("n_routed_experts", moe.num_experts)
    cfg["num_experts_per_tok"] = f.need("num_experts_per_tok", moe.num_experts_per_tok)
    cfg["moe_intermediate_size"] = f.need(
        "moe_intermediate_size", moe.expert_intermediate_size
    )
    shared_size_expr = None
    cfg["n_shared_experts"] = None
    if mlp.shared:
        width = moe.shared_intermediate_size
        cfg["n_shared_experts"] = f.find("n_shared_experts", moe.num_shared_experts)
        if (name := f.find("shared_expert_intermediate_size", width)) is not None:
            shared_size_expr = f"config.{name}"
        elif cfg["n_shared_experts"] is not None and (
            f.hf[cfg["moe_intermediate_size"]] * moe.num_shared_experts == width
        ):
            shared_size_expr = (
                f"config.{cfg['moe_intermediate_size']} "
                f"* config.{cfg['n_shared_experts']}"
            )
        elif (
            f.find("n_shared_experts") is None
            and f.hf[cfg["moe_intermediate_size"]] == width
        ):
            # No count key: the family has one shared expert of the experts'
            # width (HunYuan-MoE's shared_mlp).
            shared_size_expr = f"config.{cfg['moe_intermediate_size']}"
        else:
            f.need("shared_expert_intermediate_size", width)
    if moe.clamped_swiglu is not None:
        alpha, limit = moe.clamped_swiglu
        cfg["swiglu_alpha"] = f.need("swiglu_alpha", alpha)
        cfg["swiglu_limit"] = f.need("swiglu_limit", limit)
    return {
        # Stacked as gpt-oss stores them: its MoE block loads them itself.
        "gpt_oss_experts": moe.gpt_oss_format,
        # gpt-oss's own MXFP4 experts format, which its checkpoints ship.
        "mxfp4_experts": moe.gpt_oss_format and "mxfp4" in spec.quantization,
        "expert_bias": moe.expert_bias,
        "layer_expr": _moe_layer_expr(spec, arch, f),
        # The stacked experts are stored input dim first (Llama-4).
        "transposed": moe.transposed,
        "bias_correction": moe.router.bias_correction,
        # The module that holds the bias in the generated block, and whether the
        # checkpoint stores it as [1, num_experts].
        "bias_on_block": moe.router.bias_correction and _router_bias_at(spec) == "moe",
        "bias_2d": moe.router.bias_2d,
        "shared": mlp.shared,
        "shared_size_expr": shared_size_expr,
        "shared_gate": mlp.shared_gate,
    }


# ---- module paths, checkpoint renames, stacked parameters ------------------------


def _vllm_paths(spec: ModelSpec, mlp: SimpleNamespace) -> dict[str, str]:
    """vLLM module path of every role (templates with ``{layer}``/``{expert}``)."""
    paths = dict(CANONICAL)
    if mlp.has_moe:
        paths.update(_vllm_moe_paths(spec, mlp.has_dense, mlp.shared, mlp.shared_gate))
        paths["router_bias"] = paths["router"]
        if _router_bias_at(spec) == "moe":
            block = (_layer_rel(paths["router"]) or "").split(".")[0]
            paths["router_bias"] = f"model.layers.{{layer}}.{block}"
    if mlp.has_dense:
        block = _vllm_dense_block(spec)
        for role in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
            paths[role] = f"model.layers.{{layer}}.{block}.{role}"
    return paths


def _loaded_roles(
    spec: ModelSpec, arch: ArchPlan, mlp: SimpleNamespace, *, mtp: bool
) -> list[str]:
    """The roles whose checkpoint tensors the file's ``load_weights`` maps."""
    att = arch.attention
    roles = ["embed", "final_norm", *arch.layers[0].stream.roles, "o_proj"]
    if not spec.tie_word_embeddings:
        roles.append("lm_head")
    if att.kind == "mla":
        mla = att.mla
        assert mla is not None
        roles += ["kv_a_proj", "kv_a_norm", "kv_b_proj"]
        roles += (
            ["q_proj"]
            if mla.q_lora_rank is None
            else ["q_a_proj", "q_a_norm", "q_b_proj"]
        )
    else:
        if "qkv_proj" in arch.fused:
            roles += ["qkv_proj"]
        else:
            roles += ["q_proj", "k_proj", "v_proj"]
    if mlp.loads_dense:
        roles += list(dense_mlp.COMPONENT.checkpoint_roles(spec))
    if mlp.loads_moe:
        moe = arch.moe
        assert moe is not None
        experts = STACKED_EXPERT_ROLES if moe.stacked else ROUTED_EXPERT_ROLES
        roles += ["router", *experts]
        if moe.router.bias_correction:
            # On the router's module it moves with the router's rename.
            if _router_bias_at(spec) != "router":
                roles.append("router_bias")
        if mlp.shared:
            if moe.shared_fused:
                roles += ["shared_gate_up_proj", "shared_down_proj"]
            else:
                roles += list(SHARED_EXPERT_ROLES)
        if mlp.shared_gate:
            roles.append("shared_expert_gate")
    for component in components.present(spec):
        if component is MTP_HEADS and not mtp:
            continue  # MTP heads load in their own file
        if component.host == "mixer" and mtp:
            continue  # the MTP block attends: it has no linear mixer
        if component.host == "mlp":
            continue  # the blocks' MLPs, above: the file loads its blocks' own
        roles += component.checkpoint_roles(spec)
    return roles


def _module_names(vllm_paths: dict[str, str], mlp: SimpleNamespace) -> dict[str, Any]:
    """Attribute names of the MLP blocks inside a decoder layer."""

    def rel(role: str) -> list[str]:
        return (_layer_rel(vllm_paths[role]) or "").split(".")

    names: dict[str, Any] = {}
    if mlp.has_dense:
        names["mlp"] = rel("down_proj")[0]
    if mlp.has_moe:
        names["mlp"] = rel("router")[0]
        names["router"] = rel("router")[1]
        names["ckpt_names"] = tuple(
            rel(role)[-1]
            for role in ("expert_gate_proj", "expert_down_proj", "expert_up_proj")
        )
        names["shared"] = rel("shared_down_proj")[1]
        names["shared_gate"] = rel("shared_expert_gate")[1]
    return names


def _stacked_params(
    spec: ModelSpec, arch: ArchPlan, mlp: SimpleNamespace, names: dict[str, Any]
) -> tuple[list[tuple[str, str, str]], dict[str, list[str]]]:
    """Checkpoint tensors stacked into one vLLM parameter, as (substring, new,
    shard) triples, and the packed-modules map."""
    att = arch.attention
    fused = arch.fused  # already one tensor: loaded as it is
    stacked: list[tuple[str, str, str]] = []
    packed: dict[str, list[str]] = {}
    if att.kind != "mla":
        if "qkv_proj" not in fused:
            stacked += [
                (".q_proj", ".qkv_proj", '"q"'),
                (".k_proj", ".qkv_proj", '"k"'),
                (".v_proj", ".qkv_proj", '"v"'),
            ]
        packed["qkv_proj"] = ["q_proj", "k_proj", "v_proj"]
    elif att.mla is not None and att.mla.q_lora_rank is not None:
        # vLLM computes q_a and kv_a in one GEMM.
        stacked += [
            (".q_a_proj", ".fused_qkv_a_proj", "0"),
            (".kv_a_proj_with_mqa", ".fused_qkv_a_proj", "1"),
        ]
        packed["fused_qkv_a_proj"] = ["q_a_proj", "kv_a_proj_with_mqa"]
    if att.indexer is not None:
        # The indexer's wk and weights_proj read the same input: one GEMM.
        stacked += [
            (".indexer.wk.", ".indexer.wk_weights_proj.", "0"),
            (".indexer.weights_proj.", ".indexer.wk_weights_proj.", "1"),
        ]
        packed["wk_weights_proj"] = ["wk", "weights_proj"]
    lin = arch.linear
    if isinstance(lin, GatedDeltaNet) and lin.projections == "split":
        # Qwen3.5's split projections load into vLLM's two merged ones.
        stacked += [
            (".in_proj_qkv", ".in_proj_qkvz", "(0, 1, 2)"),
            (".in_proj_z", ".in_proj_qkvz", "3"),
            (".in_proj_b", ".in_proj_ba", "0"),
            (".in_proj_a", ".in_proj_ba", "1"),
        ]
        packed["in_proj_qkvz"] = ["in_proj_qkv", "in_proj_z"]
        packed["in_proj_ba"] = ["in_proj_b", "in_proj_a"]
    elif isinstance(lin, KimiDeltaAttention):
        # The KDA layer's own load_weights stacks these (the checkpoint's q_proj
        # may also name an MLA layer's query projection).
        packed["in_proj_qkvgfab"] = ["q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj"]
        packed["conv1d"] = ["q_conv1d", "k_conv1d", "v_conv1d"]
    elif lin is not None:
        packed["in_proj_qkvz"] = ["in_proj_qkvz"]
        packed["in_proj_ba"] = ["in_proj_ba"]
    gate_up_blocks = []
    if mlp.loads_dense and "gate_up_proj" not in fused:
        gate_up_blocks.append(names["mlp"])
    if mlp.loads_moe and mlp.shared and "shared_gate_up_proj" not in fused:
        # (A fused shared expert's checkpoint tensor is its gate_up_proj already.)
        gate_up_blocks.append(names["shared"])
    for block in gate_up_blocks:
        stacked += [
            (f".{block}.gate_proj", f".{block}.gate_up_proj", "0"),
            (f".{block}.up_proj", f".{block}.gate_up_proj", "1"),
        ]
    if mlp.loads_dense or (mlp.loads_moe and mlp.shared):
        packed["gate_up_proj"] = ["gate_proj", "up_proj"]
    return stacked, packed


def _mtp_prefixes(arch: ArchPlan) -> list[str]:
    """Checkpoint prefixes of the MTP heads' tensors (each a checked string)."""
    if arch.mtp is None:
        return []
    prefixes = {"model.layers."}
    for role in MTP_HEADS.roles:
        prefixes.add(arch.tensors.checkpoint[role].split("{layer}")[0])
    for p in prefixes:
        py_str(p.rstrip("."))
    return sorted(prefixes)


def _kv_sharing_field(arch: ArchPlan, f: ConfigKeys) -> str:
    """Config attribute holding the KV-sharing map ``{layer: target}``."""
    want = dict(arch.kv_sources)

    def same(value: Any) -> bool:
        if isinstance(value, dict):
            try:
                return {int(k): int(v) for k, v in value.items()} == want
            except (TypeError, ValueError):
                return False
        if isinstance(value, list) and len(value) == len(arch.layers):
            return {i: t for i, t in enumerate(value) if t is not None} == want
        return False

    return f.need("kv_sharing_target_layers", check=same)


def _kv_target_expr(name: str, value: Any) -> str:
    """Expression giving a layer's KV-sharing target (or None) from the config."""
    if isinstance(value, list):
        return f"config.{name}[layer_idx]"
    # JSON object keys are strings.
    return f"config.{name}.get(str(layer_idx))"


# ---- docstrings ------------------------------------------------------------------


def _attn_doc(spec: ModelSpec, arch: ArchPlan) -> str:
    att = arch.attention
    if att.kind == "mla":
        mla = att.mla
        assert mla is not None
        q = (
            "queries through a low-rank q_a/q_b projection"
            if mla.q_lora_rank is not None
            else "a full-rank query projection"
        )
        direct = bool(arch.kv_sources) or bool(
            components.fragments(spec, "vllm")["mla.output"]
        )
        doc = (
            "Multi-head latent attention: keys and values are cached as one "
            f"compressed latent (kv_lora_rank) plus a shared rope key, with {q}; "
            + ("vLLM's MLAAttention" if direct else "vLLM's MLA wrapper")
            + " picks the kernels."
        )
        return " ".join([doc, *(f"With {p}." for p in _part_docs(arch))])
    parts = ["grouped-query" if att.num_kv_heads < att.num_heads else "multi-head"]
    parts += [f"with {phrase}" for phrase in _part_docs(arch)]
    if att.qkv_bias or att.o_bias:
        parts.append(
            "with biases on "
            + " and ".join(
                n for n, on in (("q/k/v", att.qkv_bias), ("o", att.o_bias)) if on
            )
        )
    if att.partial_rotary_factor != 1.0:
        parts.append(f"rope on {att.partial_rotary_factor:g} of each head")
    scale = att.part(SoftmaxScale)
    if scale is not None and scale.scalar is not None:
        parts.append("softmax scale query_pre_attn_scalar**-0.5")
    if arch.rope.sliding_own:
        parts.append("the sliding layers with their own rope")
    kinds = set(arch.attention_types)
    if "sliding_attention" in kinds:
        parts.append(
            "sliding-window on the layers the config's layer types mark"
            if len(kinds) > 1
            else "sliding-window on every layer"
        )
    if arch.kv_sources:
        parts.append("KV-cache sharing across layers")
    return "Attention: " + ", ".join(parts) + "."


def _components_context(spec: ModelSpec, arch: ArchPlan, f: ConfigKeys) -> dict:
    """The components' fragments by slot and what each prints (its context);
    whether MLA calls vLLM's MLAAttention itself: to share a latent cache, or
    for a component acting on the attention output before o_proj."""
    slots = components.fragments(spec, "vllm")
    return {
        "vllm_slots": slots,
        "parts": {
            c.name: c.vllm_context(node, f) for c, node in components.code_parts(arch)
        },
        "mla_direct": arch.attention.kind == "mla"
        and (bool(arch.kv_sources) or bool(slots["mla.output"])),
    }


def _part_docs(arch: ArchPlan) -> list[str]:
    """What the attention's components say of themselves, a phrase each."""
    return [
        doc
        for c, node in components.parts(arch.attention)
        if (doc := c.describe(node)) is not None
    ]


def _layer_doc(arch: ArchPlan, per_layer: SimpleNamespace) -> str:
    parts = []
    if per_layer.moe:
        parts.append("whether its MLP is the MoE block (else the dense MLP)")
    if per_layer.sliding:
        parts.append("its sliding window (None: full attention)")
    if per_layer.kv_sharing:
        parts.append("the earlier layer whose KV cache it reads (None: its own)")
    if per_layer.nope:
        parts.append("whether its attention applies rope (False: NoPE)")
    if per_layer.linear:
        parts.append("whether its token mixer is linear attention (else attention)")
    if arch.mtp is None:
        return (
            "A decoder layer. What differs by layer comes from the caller (the "
            f"model reads it per layer from the config): {_listed(parts)}."
        )
    return (
        "A decoder layer. What differs by layer comes from the caller: "
        f"{_listed(parts)}. The model reads it per layer from the config; the MTP "
        "draft sets it for its blocks, whose layer indices lie past the config's "
        "per-layer fields."
    )


def _mtp_block_comment(per_layer: SimpleNamespace) -> list[str]:
    """Comment lines on the MTP block in the MTP file."""
    defaults = [
        what
        for what, on in (
            ("full attention", per_layer.sliding),
            ("its own KV cache", per_layer.kv_sharing),
            ("rope on q and k", per_layer.nope),
            ("attention as its token mixer", per_layer.linear),
        )
        if on
    ]
    text = "The model's decoder layer as this head's block"
    if defaults:
        text += f": {_listed(defaults)} (the default{'s' * (len(defaults) > 1)})"
    text += (
        ". Its prefix (layer num_hidden_layers + i) names its KV cache; its modules "
        'keep the checkpoint\'s names (no "mtp_block"), which quantization configs '
        "use."
    )
    return textwrap.wrap(text, width=76)


def _moe_doc(arch: ArchPlan) -> str:
    moe = arch.moe
    if moe is None:
        return ""
    r = moe.router
    parts = [f"{r.scoring} scores" + (" of the biased router logits" if r.bias else "")]
    if r.bias_correction:
        parts.append("experts chosen by score + e_score_correction_bias")
    if r.num_groups is not None:
        parts.append("within the best expert groups")
    if r.norm_topk_prob:
        parts.append("top-k weights renormalised")
    if r.routed_scaling_factor != 1.0:
        parts.append("routed output scaled by routed_scaling_factor")
    shared = ""
    if moe.num_shared_experts:
        shared = " and the shared expert" + (
            " (sigmoid-gated)" if moe.shared_expert_gate else ""
        )
    doc = (
        f"Routed experts{shared} with their router, run by vLLM's fused MoE "
        f"layer. Routing: {', '.join(parts)}."
    )
    if moe.clamped_swiglu is not None:
        experts = " The experts (with biases)" if moe.expert_bias else " The experts"
        doc += experts + (
            " apply the clamped SwiGLU (swigluoai) to gate and up columns stored "
            "interleaved."
        )
    return doc


def _summary(spec: ModelSpec, arch: ArchPlan) -> list[str]:
    """Module docstring lines: what the spec is made of."""
    layers = arch.layers
    items = [_attn_doc(spec, arch)]
    lin = arch.linear
    if lin is not None:
        n_linear = sum(arch.linear_layers)
        kda = isinstance(lin, KimiDeltaAttention)
        kind = "Kimi delta attention" if kda else "Gated DeltaNet linear attention"
        conv = "short convolutions" if kda else "a short convolution"
        items.append(
            f"{kind} on {n_linear} of {len(layers)} layers "
            "in the spec (the config's layer_types), run by vLLM's own layer and "
            f"kernels: {conv} and a recurrent state per sequence, "
            "which vLLM's hybrid cache keeps beside the attention layers' KV cache"
            + (
                " (vLLM's KDA kernels are Triton-only: on CPU the layer runs the "
                "Kimi delta rule in plain torch on the same states)."
                if kda
                else "."
            )
        )
    if arch.moe is not None:
        n_moe = sum(layer.is_moe for layer in layers)
        items.append(
            f"MoE on {n_moe} of {len(layers)} layers in the spec; " + _moe_doc(arch)
        )
    else:
        items.append("Dense gated MLP on every layer.")
    if layers[0].stream.placement == "parallel":
        items.append(
            "Parallel blocks: attention and the MLP read the same normalised input "
            "and both add to the residual."
        )
    parts = {
        "qkv_proj": "q, k and v",
        "gate_up_proj": "gate and up",
        "shared_gate_up_proj": "the shared expert's gate and up",
    }
    fused = [f"{parts[r]} ({r})" for r in spec.checkpoint.fused if r in parts]
    if fused:
        items.append(
            f"The checkpoint stores {_listed(fused)} each as one tensor, loaded "
            "as it is."
        )
    head, embed = arch.part(Logits), arch.part(Embeddings)
    assert head is not None and embed is not None, "every model has both"
    if head.scale != 1.0:
        items.append("Logits multiplied by the config's logit_scale.")
    if arch.rope.scaling is not None:
        items.append(f"Rope: {arch.rope.scaling.type} scaling.")
    gemma = [
        what
        for what, on in (
            (
                "sandwich norms (on the inputs and outputs of attention and MLP)",
                layers[0].stream.placement == "sandwich",
            ),
            ("RMS norms scaled by 1 + weight", arch.norms.unit_offset),
            ("embeddings scaled by sqrt(hidden_size)", embed.sqrt_hidden),
            ("soft-capped logits", head.softcap is not None),
        )
        if on
    ]
    if gemma:
        items.append(_listed(gemma)[:1].upper() + _listed(gemma)[1:] + ".")
    stream = arch.layers[0].stream
    embed_keys = embeddings.COMPONENT.code_context(embed, arch.config)
    head_keys = logits.COMPONENT.code_context(head, arch.config)
    scale = arch.attention.part(SoftmaxScale)
    scale_key = (
        softmax_scale.COMPONENT.code_context(scale, arch.config).multiplier
        if scale
        else None
    )
    read = [
        concept
        for concept, key in (
            ("attention_multiplier", scale_key),
            ("embedding_multiplier", embed_keys.multiplier),
            (
                "residual_multiplier",
                residual_stream.COMPONENT.multiplier_key(stream, arch.config),
            ),
            ("logits_scaling", head_keys.divisor),
        )
        if key
    ]
    if read:
        items.append(f"Granite's multipliers, read from the config: {_listed(read)}.")
    # Stacked (gpt-oss's own storage: the MoE block's docstring says it).
    if arch.moe is not None and arch.moe.stacked and not arch.moe.gpt_oss_format:
        items.append(
            "The checkpoint stores each layer's experts stacked (gate and up in one "
            "tensor), as the fused MoE layer holds them."
        )
    if arch.mtp is not None:
        items.append(
            f"{_heads(arch.mtp.num_heads, 'MTP head')} in the checkpoint, loaded "
            "by the MTP draft model, not by this one."
        )
    return [textwrap.fill(item, width=85) for item in items]


def _heads(n: int, what: str) -> str:
    """``1 MTP head``, ``2 MTP heads``."""
    return f"{n} {what}{'s' * (n != 1)}"


def _listed(parts: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _rope_comment(arch: ArchPlan, by_kind: bool = False) -> str:
    parts = ["theta"]
    rope = arch.rope
    scalings = {s.type for s in (rope.scaling, rope.sliding_scaling) if s}
    if scalings:
        parts.append(f"the {'/'.join(sorted(scalings))} scaling")
    if arch.attention.partial_rotary_factor != 1.0:
        parts.append("the partial rotary factor")
    if by_kind:
        return f"rope_parameters holds, per layer type, {_listed(parts)}."
    return f"rope_parameters holds {_listed(parts)}."


def _longrope_mscale(arch: ArchPlan, rope_by_kind: bool) -> str | None:
    """Where LongRoPE's factor on cos and sin comes from when vLLM's default
    (from max_position_embeddings / original_max_position_embeddings) is not
    transformers': the stated ``attention_factor``, or the stated ``factor``.
    None for the default, or another scaling."""
    scaling = arch.rope.scaling
    if scaling is None or scaling.type != "longrope":
        return None
    if rope_by_kind:
        raise GenerationError(
            f"{arch.spec.name}: rope.scaling: longrope is generated for one rope "
            "for every layer (not rope_parameters per layer type)"
        )
    if scaling.attention_factor is not None:
        return "attention_factor"
    return "factor" if scaling.factor is not None else None


def _mtp_doc(spec: ModelSpec, arch: ArchPlan) -> str:
    """Module docstring body of the MTP draft file."""
    assert arch.mtp is not None
    draft = mtp_draft(spec, standalone=True)
    mlp = "an MoE" if arch.mtp.block.is_moe else "a dense"
    paragraphs = [
        f"{_heads(arch.mtp.num_heads, 'multi-token-prediction head')}, stored in the "
        "target checkpoint as layers num_hidden_layers + i. Head i reads the "
        "previous hidden state h (the target's last one for head 0) and the next "
        "token t: h_i = block_i(eh_proj(concat(enorm(embed(t)), hnorm(h)))), "
        "logits_i = shared_head.head(shared_head.norm(h_i)). Each block is a "
        f"full-attention decoder block with {mlp} MLP.",
        'vLLM builds this class for speculative_config {"method": "mtp"} under '
        f"the architecture name {draft.architecture}, and then replaces its "
        "embedding and output head by the target model's.",
    ]
    return "\n\n".join(textwrap.fill(p, width=85) for p in paragraphs)
