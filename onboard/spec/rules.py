"""Cross-field rules of the spec.

Each rule yields ``(path, message)`` pairs; all of them run on a spec that passed
field validation, so one ``spec check`` reports every problem at once.
"""

from __future__ import annotations

import builtins
import difflib
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass

from onboard import components
from onboard.spec.layouts import (
    ROLES,
    STACKED_EXPERT_ROLES,
    required_placeholders,
)
from onboard.spec.model import (
    ModelSpec,
    RopeScaling,
    class_prefix,
)
from onboard.spec.module_tree import (
    NN_MODULE_ATTRIBUTES,
    TensorTreeError,
    experts_in_one_module,
    gpt_oss_experts,
    has_dense_mlp,
    module_names,
    used_roles,
)
from onboard.spec.module_tree import RESERVED as REFERENCE_ATTRIBUTES

Path = tuple[str | int, ...]
Problem = tuple[Path, str]
Report = Callable[[Path, str], None]


def check_rules(spec: ModelSpec) -> list[Problem]:
    problems: list[Problem] = []
    for rule in (
        _rope_rules,
        _attention_rules,
        _layer_type_rules,
        _moe_rules,
        _checkpoint_rules,
        _module_tree_rules,
        _fused_rules,
        _speculator_rules,
        _name_rules,
        _keep_unquantized_rules,
    ):
        rule(spec, lambda path, message: problems.append((path, message)))
    # Every component's: a field set without its primitive is a problem too.
    for component in components.every():
        component.rules(spec, lambda path, message: problems.append((path, message)))
    return problems


# Parameters each rope scaling needs: transformers refuses a llama3 scaling without
# its frequency factors, and vLLM's get_rope raises a KeyError. (A missing
# original_max_position_embeddings means max_position_embeddings, as in
# transformers, but for longrope, whose short factors apply up to it.)
ROPE_SCALING_NEEDS = {
    "linear": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
# Parameters that belong to one scaling kind only.
ROPE_SCALING_ONLY = {
    "truncate": "yarn",
    "short_factor": "longrope",
    "long_factor": "longrope",
    "attention_factor": "longrope",
}


def _rope_rules(spec: ModelSpec, report: Report) -> None:
    _nope_rules(spec, report)
    _sliding_rope_rules(spec, report)
    for where, scaling in (
        (("rope", "scaling"), spec.rope.scaling),
        (
            ("rope", "sliding", "scaling"),
            spec.rope.sliding and spec.rope.sliding.scaling,
        ),
    ):
        if scaling is None:
            continue
        for field in ROPE_SCALING_NEEDS[scaling.type]:
            if getattr(scaling, field) is None:
                report(where + (field,), f"{scaling.type} rope scaling needs {field}")
        for field, kind in ROPE_SCALING_ONLY.items():
            if getattr(scaling, field) is not None and scaling.type != kind:
                report(where + (field,), f"{field} applies to {kind} scaling only")
        if scaling.type == "longrope":
            _longrope_rules(spec, scaling, where, report)


def _longrope_rules(
    spec: ModelSpec, scaling: RopeScaling, where: tuple, report: Report
) -> None:
    """Phi-3's LongRoPE as transformers' Phi3 and vLLM's
    Phi3LongRoPEScaledRotaryEmbedding compute it: one factor per rotary pair,
    the two halves rotated (vLLM raises on interleaved pairs), GQA's rope."""
    if where[1] == "sliding":
        report(where + ("type",), "longrope: for the full-attention rope only")
        return
    if spec.attention.type != "gqa":
        report(where + ("type",), "longrope: for GQA attention only (not MLA's rope)")
        return
    pairs = int(spec.head_dim * spec.attention.partial_rotary_factor) // 2
    for field in ("short_factor", "long_factor"):
        factors = getattr(scaling, field)
        if factors is not None and len(factors) != pairs:
            report(
                where + (field,),
                f"{len(factors)} factors; longrope needs one per rotary pair: "
                f"rotary_dim / 2 = {pairs}",
            )
    if spec.rope.interleaved:
        report(
            ("rope", "interleaved"),
            "longrope rotates the two halves (NeoX style); vLLM's LongRoPE "
            "refuses interleaved pairs",
        )
    original = scaling.original_max_position_embeddings
    if original is not None and original > spec.max_position_embeddings:
        report(
            where + ("original_max_position_embeddings",),
            f"{original} exceeds max_position_embeddings "
            f"({spec.max_position_embeddings}): the long factors apply between them",
        )


def _sliding_rope_rules(spec: ModelSpec, report: Report) -> None:
    sliding = spec.rope.sliding
    if sliding is None:
        return
    where = ("rope", "sliding")
    if "sliding_attention" not in spec.layer_attention_types():
        report(where, "no layer slides (set attention.sliding_window and its layers)")
    full = spec.rope.scaling
    if (
        sliding.scaling is not None
        and full is not None
        and sliding.scaling.type != full.type
    ):
        # The generated reference computes one scaling kind (and plain rope).
        report(
            where + ("scaling", "type"),
            f"{sliding.scaling.type} differs from rope.scaling.type ({full.type}); "
            "the sliding and full layers may differ in one scaling kind at most",
        )


def _nope_rules(spec: ModelSpec, report: Report) -> None:
    nope = spec.rope.nope_layers
    where = ("rope", "nope_layers")
    if not nope:
        return
    if len(set(nope)) != len(nope) or nope != sorted(nope):
        report(where, "list each layer once, in increasing order")
    late = [i for i in nope if i >= spec.num_hidden_layers]
    if late:
        report(where, f"layers {late} do not exist ({spec.num_hidden_layers} layers)")


def _attention_rules(spec: ModelSpec, report: Report) -> None:
    att = spec.attention
    a: Path = ("attention",)
    if att.type == "gqa":
        if att.llama_4_scaling is not None:
            report(
                a + ("llama_4_scaling",),
                "llama_4_scaling scales MLA's queries (Mistral-4); it needs "
                "attention.type mla",
            )
        if att.mla is not None:
            report(a + ("mla",), "MLA dimensions given but attention.type is gqa")
        if att.num_kv_heads is not None and att.num_heads % att.num_kv_heads:
            report(
                a + ("num_kv_heads",),
                f"num_heads ({att.num_heads}) must be divisible by num_kv_heads "
                f"({att.num_kv_heads})",
            )
        if att.head_dim is None and spec.hidden_size % att.num_heads:
            report(
                a + ("head_dim",),
                f"hidden_size ({spec.hidden_size}) is not divisible by num_heads "
                f"({att.num_heads}); set head_dim explicitly",
            )
        rotary = spec.head_dim * att.partial_rotary_factor
        if rotary != int(rotary) or int(rotary) % 2:
            report(
                a + ("partial_rotary_factor",),
                f"head_dim x partial_rotary_factor = {rotary:g} must be an even "
                "integer",
            )
        return
    # MLA
    if att.mla is None:
        report(a + ("mla",), "attention.type is mla but the mla section is missing")
        return
    for field in (
        "num_kv_heads",
        "head_dim",
        "sliding_window",
        "sliding_window_pattern",
    ):
        if getattr(att, field) is not None:
            report(a + (field,), f"{field} does not apply to MLA attention")
    if att.layer_types is not None and "sliding_attention" in att.layer_types:
        # MLA layers attend fully; linear-attention layers may sit between them.
        report(a + ("layer_types",), "MLA attention has no sliding_attention layers")
    if att.qkv_bias:
        report(a + ("qkv_bias",), "qkv_bias does not apply to MLA attention")

    if att.partial_rotary_factor != 1.0:
        report(
            a + ("partial_rotary_factor",),
            "MLA splits rope by qk_rope_head_dim; partial_rotary_factor must stay 1.0",
        )
    scaling, extension = att.llama_4_scaling, spec.rope.scaling
    if (
        scaling is not None
        and extension is not None
        and extension.original_max_position_embeddings is not None
        and extension.original_max_position_embeddings
        != scaling.original_max_position_embeddings
    ):
        # config.json holds one original_max_position_embeddings for both.
        report(
            a + ("llama_4_scaling", "original_max_position_embeddings"),
            f"{scaling.original_max_position_embeddings} disagrees with "
            "rope.scaling.original_max_position_embeddings "
            f"({extension.original_max_position_embeddings}): Mistral-4's config "
            "holds one for both",
        )
    mla = att.mla
    if mla.qk_rope_head_dim % 2:
        report(a + ("mla", "qk_rope_head_dim"), "qk_rope_head_dim must be even")
    if mla.q_lora_rank is not None and mla.q_lora_rank >= spec.hidden_size * 4:
        report(a + ("mla", "q_lora_rank"), "q_lora_rank is implausibly large")


def _layer_type_rules(spec: ModelSpec, report: Report) -> None:
    att = spec.attention
    a: Path = ("attention",)
    if att.layer_types is not None:
        if len(att.layer_types) != spec.num_hidden_layers:
            report(
                a + ("layer_types",),
                f"has {len(att.layer_types)} entries but num_hidden_layers is "
                f"{spec.num_hidden_layers}",
            )
        if att.sliding_window_pattern is not None:
            report(
                a + ("sliding_window_pattern",),
                "give either layer_types or sliding_window_pattern, not both",
            )
        if "sliding_attention" in att.layer_types and att.sliding_window is None:
            report(
                a + ("sliding_window",),
                "layer_types has sliding_attention layers but sliding_window is "
                "not set",
            )
    if att.sliding_window_pattern is not None and att.sliding_window is None:
        report(a + ("sliding_window_pattern",), "needs sliding_window to be set")


def _moe_rules(spec: ModelSpec, report: Report) -> None:
    moe = spec.mlp.moe
    if moe is None:
        return
    m: Path = ("mlp", "moe")
    if moe.num_experts_per_tok > moe.num_experts:
        report(
            m + ("num_experts_per_tok",),
            f"top-k ({moe.num_experts_per_tok}) exceeds num_experts "
            f"({moe.num_experts})",
        )
    for i, layer in enumerate(moe.dense_layers):
        if layer >= spec.num_hidden_layers:
            report(
                m + ("dense_layers", i),
                f"layer {layer} does not exist (num_hidden_layers is "
                f"{spec.num_hidden_layers})",
            )
    if not any(spec.is_moe_layer(i) for i in range(spec.num_hidden_layers)):
        report(
            m,
            "no layer is MoE: first_k_dense / layer_frequency / dense_layers "
            "exclude every layer (drop the moe section for a dense model)",
        )
    if moe.shared_expert_gate and moe.num_shared_experts == 0:
        report(m + ("shared_expert_gate",), "needs num_shared_experts >= 1")
    if moe.shared_expert_intermediate_size is not None and moe.num_shared_experts == 0:
        report(
            m + ("shared_expert_intermediate_size",), "needs num_shared_experts >= 1"
        )
    _stacked_expert_rules(spec, report)


# vLLM's swigluoai activation (its gpt_oss.py, and the CPU MoE kernel) fixes these.
SWIGLU_OAI = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def _stacked_expert_rules(spec: ModelSpec, report: Report) -> None:
    """gpt-oss's experts: the clamped SwiGLU, biases and stacked, interleaved
    storage (checkpoint.experts_format gpt_oss), which vLLM's swigluoai kernel
    takes together."""
    moe = spec.mlp.moe
    assert moe is not None
    m: Path = ("mlp", "moe")
    gpt_oss = gpt_oss_experts(spec)
    clamped = moe.swiglu_limit is not None
    if (moe.swiglu_alpha is None) != (moe.swiglu_limit is None):
        missing = "swiglu_alpha" if moe.swiglu_alpha is None else "swiglu_limit"
        report(m + (missing,), "the clamped SwiGLU needs swiglu_alpha and swiglu_limit")
    for field, value in SWIGLU_OAI.items():
        got = getattr(moe, field)
        if got is not None and got != value:
            report(
                m + (field,),
                f"vLLM's swigluoai kernel fixes {field} at {value}, got {got}",
            )
    if clamped and not gpt_oss:
        report(
            m + ("swiglu_limit",),
            "the clamped SwiGLU needs the experts stacked as gpt-oss stores them "
            "(checkpoint.fused: [experts], checkpoint.experts_format: gpt_oss): "
            "vLLM's swigluoai kernel reads each expert's gate and up interleaved",
        )
    if moe.expert_bias and not gpt_oss:
        report(
            m + ("expert_bias",),
            "expert biases are generated for experts stacked as gpt-oss stores "
            "them only (checkpoint.fused: [experts], checkpoint.experts_format: "
            "gpt_oss)",
        )
    if not gpt_oss:
        return
    c: Path = ("checkpoint", "experts_format")
    if not clamped:
        report(
            c,
            "gpt-oss's stacked experts interleave gate and up, which vLLM reads for "
            "the clamped SwiGLU only (set mlp.moe.swiglu_alpha and swiglu_limit)",
        )
    if moe.num_shared_experts:
        report(c, "gpt-oss's stacked experts with shared experts are not generated")
    if moe.router.bias_correction or moe.router.num_groups is not None:
        report(
            c,
            "gpt-oss's stacked experts are generated with plain top-k routing (no "
            "bias_correction, no expert groups), as gpt-oss routes",
        )
    if spec.mtp is not None:
        report(c, "gpt-oss's stacked experts in MTP heads are not generated")


# A tensor path: dotted identifiers and indices, with {layer} / {expert} as whole
# placeholders (no format specs or conversions: `{layer:0>9999}` would pad forever).
_TEMPLATE = re.compile(r"(?:[A-Za-z0-9_.]|\{layer\}|\{expert\})+")
MAX_TEMPLATE_CHARS = 200


def _checkpoint_rules(spec: ModelSpec, report: Report) -> None:
    if (
        spec.checkpoint.experts_format != "linear"
        and "experts" not in spec.checkpoint.fused
    ):
        report(
            ("checkpoint", "experts_format"),
            "describes stacked experts: needs `experts` in checkpoint.fused",
        )
    ckpt = spec.checkpoint
    if ckpt.skipped_prefixes and ckpt.language_model_prefix is None:
        report(
            ("checkpoint", "skipped_prefixes"),
            "a wrapper's other modules: needs checkpoint.language_model_prefix",
        )
    if ckpt.language_model_prefix is not None and spec.mtp is not None:
        report(
            ("checkpoint", "language_model_prefix"),
            "MTP heads beside a multimodal wrapper's language model are not "
            "expressible yet (the MTP model would load the wrapper's checkpoint)",
        )
    if ckpt.language_model_prefix is not None:
        prefix = ckpt.language_model_prefix
        if prefix in ("model", "lm_head") or prefix.startswith("lm_head."):
            report(
                ("checkpoint", "language_model_prefix"),
                f"{prefix!r}: the module of the wrapper's language model (e.g. "
                "model.language_model), not `model` or `lm_head`",
            )
        for i, skipped in enumerate(ckpt.skipped_prefixes):
            if skipped == prefix or skipped.startswith(prefix + "."):
                report(
                    ("checkpoint", "skipped_prefixes", i),
                    f"{skipped!r} is inside the language model ({prefix!r})",
                )
            elif skipped in ("model", "lm_head") or prefix.startswith(skipped + "."):
                report(
                    ("checkpoint", "skipped_prefixes", i),
                    f"{skipped!r} holds the language model's own tensors",
                )
    names = spec.checkpoint.tensor_names
    moe = spec.mlp.moe
    if spec.checkpoint.router_bias_2d and (
        moe is None or not moe.router.bias_correction
    ):
        report(
            ("checkpoint", "router_bias_2d"),
            "the model has no router bias (mlp.moe.router.bias_correction: false)",
        )
    bad_template = False
    for role, template in names.items():
        where: Path = ("checkpoint", "tensor_names", role)
        if role not in ROLES:
            hint = difflib.get_close_matches(role, ROLES, n=1)
            report(
                where,
                f"unknown role {role!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else ""),
            )
            continue
        problem = _template_problem(role, template)
        if problem:
            report(where, problem)
            bad_template = True
    if bad_template:
        return
    # Two roles on one path would be one tensor with two meanings.
    roles = used_roles(spec)
    for role in names:
        others = [
            r
            for r in roles
            if r != role
            and spec.tensor_path(r) == names[role]
            # The router's bias is a parameter of the router's module by default;
            # gpt-oss's and Mistral-4's stacked experts are one module holding
            # both stacks.
            and {r, role} != {"router", "router_bias"}
            and not (
                {r, role} == set(STACKED_EXPERT_ROLES) and experts_in_one_module(spec)
            )
        ]
        if role in roles and others:
            report(
                ("checkpoint", "tensor_names", role),
                f"{names[role]!r} is also the path of {', '.join(others)}",
            )
    unused = [role for role in names if role not in roles]
    for role in unused:
        report(
            ("checkpoint", "tensor_names", role),
            f"the model has no {role} (no checkpoint tensor of it is written or "
            "read): drop the override or the option that makes the role",
        )


# Roles of the features only the generated Hugging Face reference computes for a
# new model type (linear attention, the components' own: sparse MLA's indexer,
# attention sinks, ...): a path of theirs that does not fit the reference's
# module tree is refused. For the other roles the vLLM model renames what it
# loads, and generate writes hf/README.md with the reason instead of a reference
# (`spec check` warns: reference_tree_problem).
FEATURE_TREE_ROLES = frozenset(
    role for c in components.every() if c.reference_only for role in c.roles
)


def reference_tree_problem(spec: ModelSpec) -> Problem | None:
    """Why the generated Hugging Face reference cannot follow the spec's tensor
    paths (located at the role), or None where it can."""
    names = spec.checkpoint.tensor_names
    if any(
        role not in ROLES or _template_problem(role, path)
        for role, path in names.items()
    ):
        return None  # reported by _checkpoint_rules
    if spec.attention.type == "mla" and spec.attention.mla is None:
        return None  # reported by _attention_rules
    try:
        module_names(spec)
    except TensorTreeError as exc:
        return exc.path, exc.reason
    return None


def _module_tree_rules(spec: ModelSpec, report: Report) -> None:
    """The newer features' roles fit the module tree of the generated Hugging
    Face reference (onboard.spec.module_tree): the tree the reference builds,
    the tensor names a tiny checkpoint writes and transformers' own class loads
    (an attention sink is a parameter of the attention module itself)."""
    problem = reference_tree_problem(spec)
    if problem is None:
        return
    path, message = problem
    role = path[2] if len(path) > 2 else None
    overridden = set(spec.checkpoint.tensor_names)
    if role in FEATURE_TREE_ROLES or (role is None and overridden & FEATURE_TREE_ROLES):
        report(path, message)


def _fused_rules(spec: ModelSpec, report: Report) -> None:
    fused = spec.checkpoint.fused
    where: Path = ("checkpoint", "fused")
    if len(set(fused)) != len(fused):
        report(where, "list each fused projection once")
    if "qkv_proj" in fused:
        if spec.attention.type == "mla":
            report(where, "qkv_proj: MLA attention has no q/k/v projections to fuse")
    if "gate_up_proj" in fused and not has_dense_mlp(spec):
        report(where, "gate_up_proj: the model has no dense MLP (experts stay apart)")
    moe = spec.mlp.moe
    if "experts" in fused and moe is None:
        report(where, "experts: the model has no MoE layer")
    if "shared_gate_up_proj" in fused and not (moe and moe.num_shared_experts):
        report(where, "shared_gate_up_proj: the model has no shared expert")


def _template_problem(role: str, template: str) -> str | None:
    if len(template) > MAX_TEMPLATE_CHARS:
        return f"path longer than {MAX_TEMPLATE_CHARS} characters"
    if not _TEMPLATE.fullmatch(template):
        return (
            f"{template!r} is not a dotted module path (letters, digits, _ and . "
            "with {layer} and {expert} as placeholders)"
        )
    fields = set(re.findall(r"\{(layer|expert)\}", template))
    want = required_placeholders(role)
    if fields != want:
        need = ", ".join("{" + f + "}" for f in sorted(want)) or "no placeholders"
        return f"path must use exactly {need}, got {template!r}"
    for part in template.replace("{layer}", "0").replace("{expert}", "0").split("."):
        if not (part.isdigit() or part.isidentifier()):
            return f"{template!r} is not a dotted module path"
        if keyword.iskeyword(part) or part.startswith("_"):
            return f"{part!r} cannot be a module name (a Python keyword or private)"
        if part in NN_MODULE_ATTRIBUTES or part in REFERENCE_ATTRIBUTES:
            # The reference's module tree is this path: `self.training = ...`.
            return (
                f"{part!r} cannot be a module name: it is an attribute of "
                "torch.nn.Module or of the generated reference's modules"
            )
    return None


def _speculator_rules(spec: ModelSpec, report: Report) -> None:
    seen: set[str] = set()
    for i, s in enumerate(spec.speculators):
        where: Path = ("speculators", i)
        if s.method in seen:
            report(where + ("method",), f"method {s.method!r} listed twice")
        seen.add(s.method)
        if s.method == "mtp":
            if spec.mtp is None:
                report(where + ("method",), "mtp needs MTP heads: add an mtp section")
            elif (
                s.num_speculative_tokens % spec.mtp.num_heads
                and s.num_speculative_tokens > spec.mtp.num_heads
            ):
                report(
                    where + ("num_speculative_tokens",),
                    f"{s.num_speculative_tokens} draft tokens is not a multiple of "
                    f"the {spec.mtp.num_heads} MTP heads",
                )


# Module-level names the generated files import or define (vLLM model, MTP draft,
# plugin, Hugging Face reference). The architecture and the classes named after it
# may not be one of them: `architecture: Attention` would make `Attention(...)`
# call the generated class itself. tests/test_spec_robustness.py renders every
# template branch and checks this list is complete.
GENERATED_NAMES = frozenset(
    {
        "ACT2FN", "ARCHITECTURE", "Any", "Attention", "AutoConfig", "AutoWeightsLoader",
        "BaseModelOutputWithPast", "Cache", "CacheConfig", "CausalLMOutputWithPast",
        "ColumnParallelLinear", "DecoderLayer", "DynamicCache", "EagleModelMixin",
        "ExpertMLP", "F", "FusedMoEFactory", "GateLinear", "GeluAndMul", "GemmaRMSNorm",
        "GenerationMixin", "HeadNorm", "IntermediateTensors", "Iterable", "LayerNorm",
        "LogitsProcessor", "MLAModules", "MLP", "MODEL_CLASS", "MODEL_TYPE",
        "MTPLayer", "MTP_ARCHITECTURE", "MTP_CLASS", "MergedColumnParallelLinear",
        "MixtureOfExperts", "MoE", "ModelRegistry", "MultiHeadLatentAttentionWrapper",
        "PPMissingLayer", "ParallelLMHead", "PreTrainedConfig", "PreTrainedModel",
        "PretrainedConfig", "QKVParallelLinear", "QuantizationConfig", "RMSNorm",
        "ReplicatedLinear", "Router", "RowParallelLinear", "SharedExpertMLP",
        "SharedHead", "SiluAndMul", "SpeculativeConfig", "StackedExperts",
        "StackedLinear", "SupportsEagle3", "SupportsLoRA", "SupportsPP",
        "SupportsQuant", "VllmConfig", "VocabParallelEmbedding", "WeightsMapper",
        # the plugin's opt-in to replace an architecture vLLM serves
        "OVERRIDE_ENV",
        # linear attention (Gated DeltaNet)
        "GatedDeltaNet", "GatedRMSNorm", "HasInnerState", "IsHybrid", "LinearMixer",
        "MambaStateCopyFunc", "MambaStateCopyFuncCalculator",
        "MambaStateDtypeCalculator", "MambaStateShapeCalculator",
        "QwenGatedDeltaNetAttention",
        # linear attention (Kimi delta attention, the reference's classes)
        "KimiDeltaAttention", "KimiGatedRMSNorm",
        # ... and the vLLM model's (vLLM's KDA layer)
        "KimiGatedDeltaNetAttention",
        # sparse MLA (the reference's lightning indexer)
        "Indexer",
        # MLA layers sharing a latent cache (vLLM's layer; the plugin's patch)
        "MLAAttention", "VLLM_SERIES",
        # ... and the vLLM model's (vLLM's indexer op, key cache and helpers)
        "SparseAttnIndexer", "DeepseekV32IndexerCache",
        "get_current_vllm_config", "get_max_prefill_buffer_size",
        "per_token_group_quant_fp8",
        # modular files (onboard.spec.bases; the families' own classes are not
        # listed: find_base takes no spec named after one): transformers'
        # checkpoint conversions, the bridge's op and tensors
        "ConversionOps", "WeightConverter", "WeightRenaming", "Shift", "OFFSET_NORMS",
    }
)  # fmt: skip
# Python's builtins (ValueError, RuntimeError, ...): the generated files raise and
# call them, so a class of one of these names would shadow it.
PYTHON_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
# Classes the generated files name after the architecture's prefix.
CLASS_SUFFIXES = (
    "Attention", "Config", "DecoderLayer", "DeltaAttention",
    "HeadNorm", "Indexer", "MLP",
    "MTP", "MoE",
    "Model", "MultiTokenPredictor", "MultiTokenPredictorLayer", "PreTrainedModel",
    "SharedHead",
)  # fmt: skip


def generated_class_names(architecture: str) -> set[str]:
    prefix = class_prefix(architecture)
    return {prefix + suffix for suffix in CLASS_SUFFIXES}


def _name_rules(spec: ModelSpec, report: Report) -> None:
    arch = spec.architecture
    if arch in GENERATED_NAMES:
        report(
            ("architecture",),
            f"{arch!r} is reserved: the generated files import a name {arch} "
            "(docs/spec.md lists the reserved names)",
        )
        return
    if arch in PYTHON_BUILTINS:
        report(
            ("architecture",),
            f"{arch!r} is a Python builtin the generated files use (raise "
            f"{arch}(...)) and a class of that name would shadow; choose another",
        )
        return
    derived = generated_class_names(arch)
    if arch in derived:
        report(
            ("architecture",),
            f"{arch!r} is also the name of a class generated beside it; end the "
            "architecture in ForCausalLM",
        )
    clashes = sorted(derived & (GENERATED_NAMES | PYTHON_BUILTINS))
    if clashes:
        report(
            ("architecture",),
            f"{arch!r} makes class names the generated files import: "
            f"{', '.join(clashes)}; choose another",
        )


def _keep_unquantized_rules(spec: ModelSpec, report: Report) -> None:
    # The same reading as quantize's (onboard/quantize/selection.py), so an entry that
    # passes here cannot fail there.
    for i, entry in enumerate(spec.keep_unquantized):
        where: Path = ("keep_unquantized", i)
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                report(where, f"bad regular expression: {exc}")
        elif entry not in ROLES and "." not in entry:
            hint = difflib.get_close_matches(entry, ROLES, n=1)
            report(
                where,
                f"{entry!r} is neither a role, a module path nor `re:REGEX`"
                + (f"; did you mean {hint[0]!r}?" if hint else ""),
            )


# ---- tensor parallelism (a note, not an error: a spec is valid at any TP size) ----

# Sizes `spec check` reports on (1 always works).
TP_SIZES = (2, 4, 8, 16)
# vLLM pads the vocabulary to a multiple of 64 before splitting it across ranks
# (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


@dataclass(frozen=True)
class TPDims:
    """The sizes vLLM splits across tensor-parallel ranks."""

    num_heads: int
    num_kv_heads: int | None  # None: MLA (one latent, no KV heads to split)
    intermediate_size: int | None  # dense MLP width, where a layer is dense
    expert_intermediate_size: int | None
    shared_expert_intermediate_size: int | None
    num_experts: int | None
    vocab_size: int
    # Linear-attention heads (key, value); None without such layers.
    linear_heads: tuple[int, int] | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> TPDims:
        moe = spec.mlp.moe
        dense = any(not spec.is_moe_layer(i) for i in range(spec.num_hidden_layers))
        if spec.mtp is not None and spec.mtp.mlp == "dense":
            dense = True
        return cls(
            num_heads=spec.attention.num_heads,
            num_kv_heads=None if spec.attention.type == "mla" else spec.num_kv_heads,
            intermediate_size=spec.mlp.intermediate_size if dense else None,
            expert_intermediate_size=moe.expert_intermediate_size if moe else None,
            shared_expert_intermediate_size=(
                spec.shared_expert_intermediate_size or None
            ),
            num_experts=moe.num_experts if moe else None,
            vocab_size=spec.vocab_size,
            linear_heads=(
                None
                if spec.linear_attention is None
                else (
                    spec.linear_attention.num_key_heads,
                    spec.linear_attention.num_value_heads,
                )
            ),
        )


def tensor_parallel_rules(dims: TPDims, tp: int, report: Report) -> None:
    """What stops vLLM from splitting the model over ``tp`` ranks, as vLLM's own
    layers check it (spec paths, so a message names the field to change)."""
    if tp == 1:
        return
    if dims.num_heads % tp:
        report(
            ("attention", "num_heads"),
            f"{dims.num_heads} query heads do not split over {tp} ranks "
            "(QKVParallelLinear / the MLA layer divide them evenly)",
        )
    kv = dims.num_kv_heads
    # QKVParallelLinear: kv >= tp splits the KV heads, kv < tp replicates each KV
    # head on tp / kv ranks; both need an exact division.
    if kv is not None and (kv % tp if kv >= tp else tp % kv):
        report(
            ("attention", "num_kv_heads"),
            f"{kv} KV heads neither split evenly over {tp} ranks nor replicate "
            f"evenly ({tp} is not a multiple of {kv})",
        )
    for path, size, what in (
        (("mlp", "intermediate_size"), dims.intermediate_size, "dense MLP width"),
        (
            ("mlp", "moe", "expert_intermediate_size"),
            dims.expert_intermediate_size,
            "expert width (FusedMoE asserts intermediate_size % tp_size == 0)",
        ),
        (
            ("mlp", "moe", "shared_expert_intermediate_size"),
            dims.shared_expert_intermediate_size,
            "shared-expert width",
        ),
    ):
        if size is not None and size % tp:
            report(path, f"the {what} {size} does not split over {tp} ranks")
    for field, heads in zip(
        ("num_key_heads", "num_value_heads"), dims.linear_heads or (), strict=False
    ):
        if heads % tp:
            report(
                ("linear_attention", field),
                f"{heads} linear-attention heads do not split over {tp} ranks "
                "(vLLM's Gated DeltaNet layer divides them evenly)",
            )
    if dims.num_experts is not None and dims.num_experts < tp:
        report(
            ("mlp", "moe", "num_experts"),
            f"{dims.num_experts} experts are fewer than {tp} ranks",
        )
    padded = -(-dims.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        report(
            ("vocab_size",),
            f"the vocabulary padded to {padded} does not split over {tp} ranks",
        )


def tensor_parallel_problems(dims: TPDims, tp: int) -> list[Problem]:
    problems: list[Problem] = []
    tensor_parallel_rules(dims, tp, lambda p, m: problems.append((p, m)))
    return problems


def allowed_tensor_parallel_sizes(
    dims: TPDims, sizes: tuple[int, ...] = TP_SIZES
) -> list[int]:
    return [1] + [tp for tp in sizes if not tensor_parallel_problems(dims, tp)]


def tensor_parallel_note(spec: ModelSpec) -> str:
    """One line for `spec check`: the tensor-parallel sizes the spec's head counts
    and widths allow, and why the smallest refused one is refused."""
    dims = TPDims.from_spec(spec)
    allowed = allowed_tensor_parallel_sizes(dims)
    note = f"tensor_parallel_size {', '.join(map(str, allowed))} fit the spec's sizes"
    refused = [tp for tp in TP_SIZES if tp not in allowed]
    if refused:
        why = "; ".join(
            f"{'.'.join(map(str, path))}: {message}"
            for path, message in tensor_parallel_problems(dims, refused[0])
        )
        note += f"; not {', '.join(map(str, refused))} ({refused[0]}: {why})"
    return note
