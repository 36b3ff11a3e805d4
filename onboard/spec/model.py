"""The declarative model spec: pydantic models, one per section of the YAML.

Field-level rules (types, ranges, safe identifiers) live on the fields; rules that
relate several fields live in :mod:`onboard.spec.rules`, so that a spec with many
problems reports all of them at once.
"""

from __future__ import annotations

import keyword
from typing import Annotated, Literal

from pydantic import Field, field_validator

from onboard.components import section_fields
from onboard.components.base import (
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_LAYERS,
    ExpertCount,
    HeadCount,
    HeadDim,
    LayerCount,
    LayerIndex,
    PositiveInt,
    Width,
)
from onboard.components.base import Section as _Section

SPEC_VERSION = 1

QUANT_SCHEMES = (
    "fp8-dynamic", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4",
    "w4a16", "w4a16-asym", "w8a8-int8",
)  # fmt: skip
# vLLM's method names, plus two of onboard's own for heads vLLM serves under
# another method: p_eagle (P-EAGLE: vLLM's eagle3 with parallel_drafting) and
# dflash2 (vLLM's dflash with a DFlash2DraftModel head); see
# onboard.speculators.methods.VLLM_METHOD.
SPEC_METHODS = (
    "ngram", "mtp", "eagle3", "draft_model", "dflash", "dspark", "suffix",
    "p_eagle", "dflash2",
)  # fmt: skip
TARGETS = ("cpu", "h100", "h200", "b200", "gb200", "b300", "mi300x", "mi355x")

QuantScheme = Literal[
    "fp8-dynamic", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4",
    "w4a16", "w4a16-asym", "w8a8-int8",
]  # fmt: skip
SpecMethod = Literal[
    "ngram", "mtp", "eagle3", "draft_model", "dflash", "dspark", "suffix",
    "p_eagle", "dflash2",
]  # fmt: skip
Target = Literal["cpu", "h100", "h200", "b200", "gb200", "b300", "mi300x", "mi355x"]
LayerAttention = Literal["full_attention", "sliding_attention", "linear_attention"]
MAX_NAME = 40  # name, model_type
MAX_ARCHITECTURE = 48

# Model types whose config's rope_parameters.partial_rotary_factor is relative to
# the whole q/k head (Mistral-4), not to qk_rope_head_dim.
MLA_WHOLE_HEAD = ("mistral4",)


def _check_identifier(value: str, what: str) -> str:
    # Spec strings end up as Python names in generated code: only plain identifiers.
    if not value.isidentifier() or not value.isascii() or keyword.iskeyword(value):
        raise ValueError(
            f"{what} must be a plain ASCII Python identifier, got {value!r}"
        )
    return value


def class_prefix(architecture: str) -> str:
    """``NovelLaunchForCausalLM`` -> ``NovelLaunch``: the prefix of every class the
    generated files define (``NovelLaunchModel``, ``NovelLaunchConfig``, ...)."""
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model"):
        if architecture.endswith(suffix) and len(architecture) > len(suffix):
            return architecture[: -len(suffix)]
    return architecture


class Norm(*section_fields("norm")):
    """Normalisation layers used throughout the model."""


class RopeScaling(_Section):
    """Rotary-embedding context extension. Parameters apply per scaling type."""

    type: Literal["linear", "yarn", "llama3", "longrope"] = Field(
        description="Scaling kind: `linear`, `yarn`, `llama3` or `longrope` "
        "(Phi-3's LongRoPE: each rotary pair's wavelength multiplied by its "
        "`short_factor`, or by its `long_factor` where the context outgrows "
        "`original_max_position_embeddings`; config.json's legacy `su` reads as it)."
    )
    factor: float | None = Field(
        None,
        gt=0,
        description="Context extension factor (required but for longrope, where "
        "null means max_position_embeddings / original_max_position_embeddings; "
        "it sets longrope's default attention_factor only).",
    )
    original_max_position_embeddings: PositiveInt | None = Field(
        None,
        description="Pre-extension context length (yarn, llama3; longrope: "
        "required, the length up to which the short factors apply).",
    )
    beta_fast: float | None = Field(
        None, description="yarn: fast boundary (default 32)."
    )
    beta_slow: float | None = Field(
        None, description="yarn: slow boundary (default 1)."
    )
    mscale: float | None = Field(None, description="yarn: attention-scale multiplier.")
    mscale_all_dim: float | None = Field(
        None, description="yarn (DeepSeek): mscale applied to all dims."
    )
    low_freq_factor: float | None = Field(
        None, description="llama3: low-frequency factor."
    )
    high_freq_factor: float | None = Field(
        None, description="llama3: high-frequency factor."
    )
    truncate: bool | None = Field(
        None,
        description="yarn: round the correction range out to whole dims (null: "
        "true, the default); false keeps it fractional (gpt-oss).",
    )
    short_factor: list[Annotated[float, Field(gt=0)]] | None = Field(
        None,
        description="longrope: per rotary pair (rotary_dim / 2 of them), the "
        "factor its wavelength is multiplied by within "
        "original_max_position_embeddings: in transformers, a forward pass whose "
        "largest position + 1 is at most it; in vLLM, an engine whose "
        "max_model_len is at most it (docs/validation.md).",
    )
    long_factor: list[Annotated[float, Field(gt=0)]] | None = Field(
        None,
        description="longrope: per rotary pair, the factor beyond "
        "original_max_position_embeddings.",
    )
    attention_factor: float | None = Field(
        None,
        gt=0,
        description="longrope: the factor on cos and sin (so on the attention "
        "logits, squared); null: sqrt(1 + ln(s) / ln(original_max_position_"
        "embeddings)) with s the factor, 1 where s <= 1.",
    )


class SlidingRope(_Section):
    """The rotary embedding of the sliding-attention layers."""

    theta: float = Field(gt=0, description="Rotary base frequency.")
    scaling: RopeScaling | None = Field(
        None, description="Context-extension scaling; null for plain rope."
    )


class _RopeFields(_Section):
    # Rope's own fields; components add theirs (onboard.components).
    theta: float = Field(10000.0, gt=0, description="Rotary base frequency.")
    scaling: RopeScaling | None = Field(
        None, description="Context-extension scaling; null for plain rope."
    )
    interleaved: bool = Field(
        False,
        description="Rotate interleaved pairs (GPT-J style, DeepSeek "
        "`rope_interleave`) instead of the two halves (NeoX style).",
    )
    nope_layers: list[LayerIndex] = Field(
        default_factory=list,
        description="Layers whose attention uses no rotary embedding (NoPE; "
        "SmolLM3's every fourth layer, EXAONE-4's full-attention layers).",
    )
    sliding: SlidingRope | None = Field(
        None,
        description="Theta and scaling of the sliding-attention layers where they "
        "differ from the full-attention layers' (Gemma-3's local base frequency); "
        "`theta` and `scaling` above are then the full-attention layers'. Null: "
        "every layer rotates alike.",
    )


class Rope(*section_fields("rope"), _RopeFields):
    """Rotary position embedding."""


class _MLAFields(_Section):
    # MLA's own fields; components add theirs (onboard.components).
    q_lora_rank: Width | None = Field(
        None, description="Rank of the query down-projection; null for a full q_proj."
    )
    kv_lora_rank: Width = Field(description="Rank of the compressed KV latent.")
    qk_nope_head_dim: HeadDim = Field(
        description="Per-head query/key dims without rope."
    )
    qk_rope_head_dim: HeadDim = Field(description="Per-head query/key dims with rope.")
    v_head_dim: HeadDim = Field(description="Per-head value dims.")
    latent_norm_eps: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Epsilon of the latent norms (q_a, kv_a); null means norm.eps. "
        "transformers' Kimi Linear and GLM-MoE-DSA fix it at 1e-6 whatever "
        "rms_norm_eps says (the generated vLLM model reads `mla_norm_eps` where the "
        "config has it, else prints the value).",
    )


class MLA(*section_fields("attention.mla"), _MLAFields):
    """Multi-head latent attention (DeepSeek-V2/V3 style)."""


class Llama4Scaling(_Section):
    """Position-dependent query scaling (Llama-4's attention temperature as
    Mistral-4 has it)."""

    beta: float = Field(gt=0, description="Growth of the scale per log step.")
    original_max_position_embeddings: PositiveInt = Field(
        description="Positions per step: the scale is 1 + beta * log(1 + "
        "floor(position / original_max_position_embeddings))."
    )


class _AttentionFields(_Section):
    # Attention's own fields; components add theirs (onboard.components).
    type: Literal["gqa", "mla"] = Field(
        "gqa", description="`gqa` (covers MHA and MQA) or `mla` (latent attention)."
    )
    num_heads: HeadCount = Field(description="Query heads.")
    num_kv_heads: HeadCount | None = Field(
        None, description="Key/value heads (gqa); null means equal to num_heads."
    )
    head_dim: HeadDim | None = Field(
        None, description="Per-head dims (gqa); null means hidden_size / num_heads."
    )
    qkv_bias: bool = Field(False, description="Bias on the q/k/v projections.")
    o_bias: bool = Field(False, description="Bias on the output projection.")
    partial_rotary_factor: float = Field(
        1.0, gt=0, le=1, description="Share of each head's dims that get rope."
    )
    llama_4_scaling: Llama4Scaling | None = Field(
        None,
        description="(mla) The queries, after rope, are multiplied by 1 + beta * "
        "log(1 + floor(position / original_max_position_embeddings)): 1 up to that "
        "position, growing after it (Mistral-4's "
        "`rope_parameters.llama_4_scaling_beta`); null: none.",
    )
    sliding_window: PositiveInt | None = Field(
        None, description="Window of sliding-attention layers, in tokens."
    )
    sliding_window_pattern: LayerCount | None = Field(
        None,
        description="Every Nth layer is full attention, the others slide "
        "(layer i is full when (i + 1) % N == 0). Null: all layers slide when "
        "`sliding_window` is set, unless `layer_types` says otherwise.",
    )
    layer_types: list[LayerAttention] | None = Field(
        None,
        description="Explicit per-layer kind, `full_attention`, `sliding_attention` "
        "or `linear_attention` (one entry per layer; a linear-attention layer's "
        "token mixer is the `linear_attention` section's instead of attention).",
    )
    mla: MLA | None = Field(
        None, description="MLA dimensions; required when type is mla."
    )


class Attention(*section_fields("attention"), _AttentionFields):
    """Attention for every layer; `layer_types` and `kv_sharing` vary it per layer."""


class Router(*section_fields("mlp.moe.router")):
    """How tokens pick experts."""


class _MoEFields(_Section):
    # MoE's own fields; components add theirs (onboard.components).
    num_experts: ExpertCount = Field(description="Routed experts per MoE layer.")
    num_experts_per_tok: ExpertCount = Field(
        description="Experts each token uses (top-k)."
    )
    expert_intermediate_size: Width = Field(description="Each routed expert's width.")
    num_shared_experts: Annotated[int, Field(ge=0, le=MAX_EXPERTS)] = Field(
        0, description="Always-on shared experts."
    )
    shared_expert_intermediate_size: Width | None = Field(
        None,
        description="Total width of the shared expert MLP; null means "
        "num_shared_experts x expert_intermediate_size.",
    )
    shared_expert_gate: bool = Field(
        False, description="Sigmoid gate on the shared expert output (Qwen2-MoE)."
    )
    first_k_dense: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(
        0, description="The first k layers stay dense."
    )
    layer_frequency: LayerCount = Field(
        1, description="Every Nth layer is MoE (layer i when (i + 1) % N == 0)."
    )
    dense_layers: list[LayerIndex] = Field(
        default_factory=list, description="Further layers that stay dense."
    )
    expert_bias: bool = Field(
        False,
        description="Bias on each routed expert's gate/up and down projections "
        "(gpt-oss; stored with checkpoint.experts_format: gpt_oss).",
    )
    swiglu_alpha: float | None = Field(
        None,
        gt=0,
        description="With swiglu_limit: the routed experts use the clamped SwiGLU "
        "of gpt-oss instead of the spec's activation: gate clamped above at the "
        "limit, up clamped to [-limit, limit], then (up + 1) * gate * "
        "sigmoid(alpha * gate). Null: act(gate) * up.",
    )
    swiglu_limit: float | None = Field(
        None, gt=0, description="The clamp of the clamped SwiGLU (see swiglu_alpha)."
    )
    router: Router = Field(default_factory=Router, description="Routing function.")


class MoE(*section_fields("mlp.moe"), _MoEFields):
    """Mixture of experts; layers not excluded below are MoE layers."""


class _MLPFields(_Section):
    # MLP's own fields, after the components' (onboard.components: the dense
    # MLP's width).
    moe: MoE | None = Field(
        None, description="Mixture of experts; null for a dense model."
    )


class MLP(_MLPFields, *section_fields("mlp")):
    """Feed-forward blocks."""


# A dotted module path (checkpoint.language_model_prefix), printed into code.
_MODULE_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


_QUANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class SourceQuantization(_Section):
    """How the published checkpoint's weights are already quantized."""

    method: Annotated[str, Field(pattern=_QUANT_NAME, max_length=64)] = Field(
        description="config.json's `quantization_config.quant_method` (`fp8`, "
        "`mxfp4`, `compressed-tensors`, ...), or `modelopt` for NVIDIA ModelOpt's "
        "`hf_quant_config.json`."
    )
    algorithm: Annotated[str, Field(pattern=_QUANT_NAME, max_length=64)] | None = Field(
        None,
        description="The format the method names: ModelOpt's `quant_algo` "
        "(`FP8`, `NVFP4`), compressed-tensors' `format` (`float-quantized`), "
        "fp8's `fmt` (`e4m3`); null where it names none (`mxfp4`).",
    )
    weight_block_size: list[PositiveInt] | None = Field(
        None, description="The weight scales' block, where stated (fp8: [128, 128])."
    )
    file: Literal["config.json", "hf_quant_config.json"] = Field(
        "config.json",
        description="Where it is stated: config.json's `quantization_config`, or "
        "`hf_quant_config.json` beside it (ModelOpt).",
    )


class Checkpoint(_Section):
    """Tensor names (and stored shapes) of the checkpoint."""

    layout: Literal["llama", "deepseek", "qwen", "mixtral", "granite", "gpt_oss"] = (
        Field(
            "llama",
            description="Preset naming (see docs/spec.md for each role's path).",
        )
    )
    fused: list[
        Literal["qkv_proj", "gate_up_proj", "shared_gate_up_proj", "experts"]
    ] = Field(
        default_factory=list,
        description="Projections the checkpoint stores as one tensor: `qkv_proj` "
        "(q, k and v stacked in that order, Phi-3), `gate_up_proj` (the dense "
        "MLP's gate then up, Phi-3, GLM), `shared_gate_up_proj` (the shared "
        "expert's gate then up, Granite-MoE-Shared), `experts` (a layer's routed "
        "experts stacked in two tensors, `experts_gate_up_proj` [experts, 2 x "
        "width, hidden] with each expert's gate rows then its up rows, and "
        "`experts_down_proj` [experts, hidden, width]: Granite-MoE; "
        "checkpoint.experts_format says how the stack is stored).",
    )
    tensor_names: dict[str, str] = Field(
        default_factory=dict,
        description="Per-role override of the preset's module path, e.g. "
        "`router: model.layers.{layer}.mlp.router`.",
    )
    router_bias_2d: bool = Field(
        False,
        description="The router's e_score_correction_bias is stored as "
        "[1, num_experts] (ERNIE-4.5-MoE's `mlp.moe_statics`), not [num_experts].",
    )
    experts_format: Literal[
        "linear", "gpt_oss", "parameters", "parameters_transposed"
    ] = Field(
        "linear",
        description="With `experts` in `fused`, how the stacked experts are "
        "stored. `linear`: each stack is the `.weight` of its role's module, "
        "output dim first like a Linear weight (Granite-MoE, above). `gpt_oss`: "
        "both roles are one module holding parameters named after them, input "
        "dim first, as gpt-oss stores them: `gate_up_proj` [experts, hidden, 2 x "
        "width] with each expert's gate and up columns interleaved (gate, up, "
        "gate, up, ...), `down_proj` [experts, width, hidden], and with "
        "mlp.moe.expert_bias `gate_up_proj_bias` [experts, 2 x width] and "
        "`down_proj_bias` [experts, hidden]. `parameters`: `linear`'s stacks as "
        "parameters of one module, named after the roles (`gate_up_proj`, "
        "`down_proj`), as transformers' Mistral-4 stores them. "
        "`parameters_transposed`: as `parameters`, input dim first: "
        "`gate_up_proj` [experts, hidden, 2 x width] (each expert's gate columns, "
        "then its up columns), `down_proj` [experts, width, hidden], as "
        "transformers' Llama-4 stores them.",
    )
    language_model_prefix: (
        Annotated[str, Field(pattern=_MODULE_PATH, max_length=100)] | None
    ) = Field(
        None,
        description="The checkpoint is a multimodal wrapper's (Qwen3.5's "
        "`Qwen3_5ForConditionalGeneration`): config.json nests this model's "
        "config under `text_config`, and the tensors the layout names under "
        "`model.` are stored under this prefix instead, e.g. "
        "`model.language_model` (`model.language_model.layers.{layer}...`); "
        "`lm_head` stays where it is. The generated model is the language model "
        "alone (text-only serving): it loads these tensors, unprefixed ones too, "
        "and not those under checkpoint.skipped_prefixes.",
    )
    skipped_prefixes: list[
        Annotated[str, Field(pattern=_MODULE_PATH, max_length=100)]
    ] = Field(
        default_factory=list,
        description="With language_model_prefix: the wrapper's other modules, "
        "whose tensors the generated model does not load (the vision tower, "
        "`model.visual`).",
    )
    source_quantization: SourceQuantization | None = Field(
        None,
        description="The published checkpoint is already quantized (`spec from-hf` "
        "reads it from its quantization_config or hf_quant_config.json): `onboard "
        "quantize` refuses that checkpoint (it quantizes 16-bit weights) and notes "
        "it beside a 16-bit one of this spec (new-model's tiny checkpoint). Null: "
        "16-bit weights.",
    )


class Speculator(_Section):
    """One speculative-decoding method to configure and validate."""

    method: SpecMethod = Field(
        description="vLLM speculative method, or `p_eagle` (vLLM's `eagle3` with "
        "`parallel_drafting`) or `dflash2` (vLLM's `dflash` with a DFlash2 head)."
    )
    num_speculative_tokens: Annotated[int, Field(gt=0, le=16)] = Field(
        3, description="Draft length k."
    )
    model: str | None = Field(
        None,
        description="Draft checkpoint (Hub id or local directory): required for "
        "`draft_model`; for `eagle3`/`p_eagle`/`dflash`/`dflash2`/`dspark` an "
        "existing trained head (null: `onboard speculators` writes the head's "
        "config and training recipe).",
    )


class _Blocks(_Section):
    # The spec's identity, dimensions and blocks; components add their
    # top-level sections after them (onboard.components: MTP heads).

    spec_version: Literal[1] = Field(1, description="Version of this spec format.")
    # Lengths: the generated module, package and class names derive from these,
    # and past them a generated line (an import, a class statement) cannot fit
    # vLLM's line length 88.
    name: str = Field(
        pattern=r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$",
        max_length=MAX_NAME,
        description="Short lowercase name (dashes allowed); the generated module is "
        "its snake_case form.",
    )
    architecture: str = Field(
        max_length=MAX_ARCHITECTURE,
        description="Architecture class name, e.g. `NovelLaunchForCausalLM`.",
    )
    model_type: str = Field(
        max_length=MAX_NAME, description="config.json `model_type`, snake_case."
    )
    license: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9.\-]*$",
        description="The weights' licence, an SPDX-style id for the Hub card "
        "(`apache-2.0`, `llama3.1`, `gemma`). null: not stated (config.json carries "
        "none, so `spec from-hf` leaves it null); `onboard publish` then needs "
        "`--license`.",
    )
    base_checkpoint: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$",
        description="Hub repo id of the base (bf16) checkpoint.",
    )
    vocab_size: PositiveInt = Field(description="Vocabulary size.")
    hidden_size: Annotated[int, Field(gt=0, le=MAX_HIDDEN)] = Field(
        description="Model (residual) width."
    )
    num_hidden_layers: LayerCount = Field(description="Decoder layers (MTP excluded).")
    max_position_embeddings: PositiveInt = Field(description="Maximum context length.")
    norm: Norm = Field(default_factory=Norm, description="Norm layers.")
    attention: Attention = Field(description="Attention layers.")
    rope: Rope = Field(default_factory=Rope, description="Rotary embedding.")


class _MLPs(_Section):
    # After the token mixers components add (linear attention).
    mlp: MLP = Field(description="Feed-forward layers.")


class _Launch(_Section):
    # What the launch makes of the model: checkpoints, drafts and targets.
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="Tensor names."
    )
    quantization: list[QuantScheme] = Field(
        default_factory=list, description="Quantized checkpoints to produce."
    )
    keep_unquantized: list[str] = Field(
        default_factory=list,
        description="Modules every quantized checkpoint keeps in 16 bits, beyond "
        "those always kept (embeddings, output head, norms, routers, MTP heads): a "
        "role name (`o_proj`), a module path (`model.layers.0.mlp.down_proj`) or "
        "`re:` and a regular expression matched against module paths.",
    )
    speculators: list[Speculator] = Field(
        default_factory=list, description="Speculative-decoding methods to configure."
    )
    targets: list[Target] = Field(
        default_factory=lambda: ["cpu"], description="Hardware targets to validate on."
    )


class ModelSpec(
    _Launch,
    *section_fields("", mixers=False),
    _MLPs,
    *section_fields("", mixers=True),
    _Blocks,
):
    """A whole model: identity, dimensions, blocks and the launch wishes."""

    @field_validator("name")
    @classmethod
    def _name_gives_a_module_name(cls, value: str) -> str:
        # The generated module is named after it (``novel-launch`` -> novel_launch).
        if keyword.iskeyword(value.replace("-", "_")):
            raise ValueError(f"name {value!r} would make a Python keyword module name")
        return value

    @field_validator("architecture")
    @classmethod
    def _architecture_is_class_name(cls, value: str) -> str:
        _check_identifier(value, "architecture")
        if not value[0].isupper():
            raise ValueError(
                f"architecture must be a CapWords class name, got {value!r}"
            )
        return value

    @field_validator("model_type")
    @classmethod
    def _model_type_is_snake(cls, value: str) -> str:
        _check_identifier(value, "model_type")
        if value != value.lower():
            raise ValueError(f"model_type must be lowercase snake_case, got {value!r}")
        return value

    # ---- derived views used by every later stage -------------------------------

    @property
    def module_name(self) -> str:
        """Module name of generated files (``novel-launch`` -> ``novel_launch``)."""
        return self.name.replace("-", "_")

    @property
    def multipliers(self) -> dict[str, float]:
        """Granite's whole-model multipliers, by field name (1.0: neutral): their
        components' fields (the embeddings', the residual's, the logits')."""
        return {
            "embedding_multiplier": self.embedding_multiplier,
            "residual_multiplier": self.residual_multiplier,
            "logits_scaling": self.logits_scaling,
        }

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim or self.hidden_size // self.attention.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.attention.num_kv_heads or self.attention.num_heads

    def layer_attention_types(self) -> list[str]:
        """Per decoder layer: ``full_attention``, ``sliding_attention`` or
        ``linear_attention``; one entry per layer even where ``layer_types`` has
        another length (which the rules refuse: the rules that run beside that
        refusal read full attention for the missing layers)."""
        att = self.attention
        n = self.num_hidden_layers
        if att.layer_types is not None:
            types = list(att.layer_types[:n])
            return types + ["full_attention"] * (n - len(types))
        if att.sliding_window is None:
            return ["full_attention"] * n
        if att.sliding_window_pattern is None:
            return ["sliding_attention"] * n
        p = att.sliding_window_pattern
        return [
            "full_attention" if (i + 1) % p == 0 else "sliding_attention"
            for i in range(n)
        ]

    def is_linear_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` mixes tokens by linear attention (False
        past the end of a layer_types list the rules refuse as too short)."""
        types = self.attention.layer_types
        return (
            types is not None
            and layer < len(types)
            and types[layer] == "linear_attention"
        )

    def layer_rope(self, layer: int) -> tuple[float, RopeScaling | None]:
        """Theta and scaling of decoder layer ``layer``'s rotary embedding (MTP
        blocks, which attend fully, have the full-attention layers')."""
        sliding = self.rope.sliding
        if (
            sliding is not None
            and layer < self.num_hidden_layers
            and self.layer_attention_types()[layer] == "sliding_attention"
        ):
            return sliding.theta, sliding.scaling
        return self.rope.theta, self.rope.scaling

    @property
    def mla_whole_head_rope(self) -> bool:
        """Whether the model type's MLA rope factor is a share of the whole q/k
        head (Mistral-4's), not of qk_rope_head_dim (MLA_WHOLE_HEAD)."""
        return self.model_type in MLA_WHOLE_HEAD

    def uses_rope(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` rotates q and k (MTP blocks always do)."""
        return layer not in self.rope.nope_layers

    def is_moe_layer(self, layer: int) -> bool:
        moe = self.mlp.moe
        if moe is None:
            return False
        return (
            layer >= moe.first_k_dense
            and (layer + 1) % moe.layer_frequency == 0
            and layer not in moe.dense_layers
        )

    @property
    def shared_expert_intermediate_size(self) -> int:
        moe = self.mlp.moe
        if moe is None or moe.num_shared_experts == 0:
            return 0
        return moe.shared_expert_intermediate_size or (
            moe.num_shared_experts * moe.expert_intermediate_size
        )

    def tensor_path(self, role: str) -> str:
        """Module path of a role in this spec's checkpoint layout."""
        from onboard.spec.layouts import role_path

        return role_path(self.checkpoint.layout, self.checkpoint.tensor_names, role)
