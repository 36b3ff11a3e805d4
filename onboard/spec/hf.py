"""Map a spec to a Hugging Face ``config.json`` and back (docs/hf-mapping.md).

One alias table (:data:`ALIASES`) names, for each concept, every key that model
families use for it; the first name is the *canonical* one, written for model types
transformers does not know (``novel_launch``). For a model type transformers knows,
the writer uses the key names that transformers' own config class declares, so the
config loads there and in vLLM's in-tree model. What a family's config does not say
but its modeling code hard-codes (Qwen3 always has qk-norm, DeepSeek-V3 always routes
by sigmoid with a bias correction) is known for a few families (:data:`FAMILIES`)
and found by the proof for any other (onboard.reference.infer): the table holds
facts, it does not limit which families are read.

Reading is strict: every key is mapped, listed in :data:`IGNORED` (does not change
the forward pass), or refused with an :class:`~onboard.errors.InputError` that names
it. The writer reads its own output back and refuses a spec the target config class
cannot express, so neither direction writes a silently wrong file.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from onboard import components
from onboard.components import Component
from onboard.components.base import LAYER_TYPES, ConfigProblem, is_int
from onboard.components.router import TOPK_METHODS as KNOWN_TOPK_METHODS
from onboard.config_json import check_config_object
from onboard.errors import InputError, printable
from onboard.spec.bases import BASES, FAMILY_CLASSES, Base, BaseMatch, Delta
from onboard.spec.config_aliases import ALIASES, family_aliases
from onboard.spec.model import MLA_WHOLE_HEAD, ModelSpec, RopeScaling
from onboard.spec.rules import check_rules

# Keys that do not change the forward pass: ignored when read, never refused.
IGNORED: frozenset[str] = frozenset(
    {
        # generic PretrainedConfig and serialisation attributes
        "_name_or_path", "transformers_version", "dtype", "torch_dtype",
        "return_dict", "output_hidden_states", "output_attentions", "id2label",
        "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
        "auto_map", "tokenizer_class", "bos_token_id", "eos_token_id",
        "pad_token_id", "sep_token_id", "decoder_start_token_id", "eod_token_id",
        # inference-time switches
        "use_cache", "output_router_logits",
        # training only
        "initializer_range", "embedding_initializer_range", "attention_dropout",
        "hidden_dropout", "dropout",
        "embd_pdrop", "resid_pdrop", "residual_dropout", "embedding_dropout",
        "router_aux_loss_coef", "aux_loss_alpha",
        "seq_aux", "router_jitter_noise", "router_z_loss_coef", "pretraining_tp",
        "ep_size",
        # how the checkpoint's weights are stored: read as the spec's
        # checkpoint.source_quantization (source_quantization below)
        "quantization_config",
    }
)  # fmt: skip

_MTP_UNUSED = (
    "{}: the model's forward pass does not use it, and the spec has no MTP heads for it"
)
# Keys published configs carry that do not change the forward pass, with why:
# accepted, and named in the header `spec from-hf` writes.
ACCEPTED: dict[str, str] = {
    "cache_implementation": "the generation cache vLLM or transformers allocates",
    # An alias of max_position_embeddings only where the config class maps it so
    # (Kimi Linear; config_aliases.CLASS_MAPPED).
    "model_max_length": "the longest input a tokenizer or runtime accepts",
    "unsloth_fixed": "Unsloth's bookkeeping",
    "unsloth_version": "Unsloth's bookkeeping",
    # MTP heads that are not expressible as the spec's (DeepSeek-V3's
    # model.layers.{num_hidden_layers + i}): transformers' and vLLM's models run
    # the main model without them, so the spec has none.
    "use_mtp": _MTP_UNUSED.format("MiniMax's MTP modules"),
    "num_mtp_modules": _MTP_UNUSED.format("MiniMax's MTP modules"),
    "mtp_transformer_layers": _MTP_UNUSED.format("MiniMax's MTP modules"),
    # Qwen3-Next's and Qwen3.5's: the checkpoint's mtp.* tensors (fc,
    # pre_fc_norm_embedding / pre_fc_norm_hidden, layers.{i}, norm), which vLLM's
    # qwen3_next_mtp.py loads.
    "mtp_num_hidden_layers": _MTP_UNUSED.format("Qwen's MTP head (mtp.*)"),
    "mtp_use_dedicated_embeddings": _MTP_UNUSED.format("Qwen's MTP head (mtp.*)"),
    # Llama-4's: read by neither transformers' nor vLLM's Llama-4 model (older
    # transformers built the experts unstacked for llm-compressor with it).
    "for_llm_compressor": "llm-compressor's bookkeeping; no model reads it",
}


@dataclass(frozen=True)
class Duplicate:
    """A key that repeats what the spec reads from another (published configs
    keep both): accepted where it agrees, refused naming both where not."""

    canonical: str  # what it repeats, for messages
    value: Callable[[dict], Any]  # the spec data -> the value the key should have
    # The key's spelling -> the spec's (qk_norm_type's "per_layer": "projection").
    spelled: dict[Any, Any] | None = None
    # The open concept it states (infer starts from the value it says).
    concept: str | None = None


def _at(data: dict, path: str) -> Any:
    """The value at a dotted ``path`` of the spec data (None where absent)."""
    for key in path.split("."):
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _rotary_dim(data: dict) -> Any:
    head_dim = _at(data, "attention.head_dim") or (
        _at(data, "hidden_size") // _at(data, "attention.num_heads")
        if is_int(_at(data, "hidden_size")) and _at(data, "attention.num_heads")
        else None
    )
    partial = _at(data, "attention.partial_rotary_factor") or 1.0
    return None if head_dim is None else round(head_dim * partial)


DUPLICATES: dict[str, Duplicate] = {
    # gpt-oss
    "experts_per_token": Duplicate(
        "num_experts_per_tok", lambda d: _at(d, "mlp.moe.num_experts_per_tok")
    ),
    "initial_context_length": Duplicate(
        "rope_scaling.original_max_position_embeddings",
        lambda d: _at(d, "rope.scaling.original_max_position_embeddings"),
    ),
    # Gemma-2's legacy spelling
    "sliding_window_size": Duplicate(
        "sliding_window", lambda d: _at(d, "attention.sliding_window")
    ),
    # MiniMax-M2: transformers' class turns rotary_dim into the rope's partial
    # factor; its q/k norms span the whole projection; its router adds a bias.
    "rotary_dim": Duplicate("head_dim x partial_rotary_factor", _rotary_dim),
    "qk_norm_type": Duplicate(
        "qk_norm_scope",
        lambda d: _at(d, "attention.qk_norm_scope") or "head",
        spelled={"per_layer": "projection", "per_head": "head"},
        concept="qk_norm_scope",
    ),
    "use_routing_bias": Duplicate(
        "topk_method (noaux_tc: the router's bias correction)",
        lambda d: "noaux_tc" if _at(d, "mlp.moe.router.bias_correction") else None,
        spelled={True: "noaux_tc", False: None},
        concept="topk_method",
    ),
}


def _duplicates(cfg: dict, data: dict, used: set[str]) -> list[str]:
    """The :data:`DUPLICATES` keys of ``cfg`` that disagree with what they repeat
    (``data``: the spec data read from the other keys); marks them used."""
    out = []
    for key, dup in DUPLICATES.items():
        if key not in cfg:
            continue
        used.add(key)
        said = cfg[key]
        if dup.spelled is not None:
            if not isinstance(said, str | bool) or said not in dup.spelled:
                shown = ", ".join(map(repr, dup.spelled))
                out.append(f"{key}={said!r}: not one of {shown}")
                continue
            said = dup.spelled[said]
        want = dup.value(data)
        if said != want:
            out.append(
                f"{key}={cfg[key]!r} disagrees with {dup.canonical} ({want!r}): "
                "both keys state one setting of the forward pass, and a reader "
                "may take either (fix the config)"
            )
    return out


def stated_concepts(config: dict) -> dict[str, Any]:
    """The :data:`OPEN_CONCEPTS` a config states, through any alias or a
    :data:`DUPLICATES` key (MiniMax's use_qk_norm, qk_norm_type,
    use_routing_bias): where the family's class reads no key for them, the
    proof starts from what the config says (and must confirm it)."""
    out: dict[str, Any] = {}
    for concept in OPEN_CONCEPTS:
        values = [
            config[k] for k in ALIASES.get(concept, ()) if config.get(k) is not None
        ]
        if values:
            out[concept] = values[0]
    for key, dup in DUPLICATES.items():
        said = config.get(key)
        if dup.concept and dup.spelled and isinstance(said, str | bool):
            if said in dup.spelled:
                out.setdefault(dup.concept, dup.spelled[said])
    return out


def accepted_keys(config: dict) -> list[str]:
    """The keys of ``config`` (and of a wrapper's ``text_config``) accepted as
    not changing the forward pass, each with why: for the spec's header."""
    out = []
    text = config.get("text_config")
    for where, cfg in (("", config), ("text_config.", text)):
        if not isinstance(cfg, dict):
            continue
        for key in sorted(cfg):
            if key in ACCEPTED:
                out.append(f"{where}{key} ({ACCEPTED[key]})")
            elif key in DUPLICATES:
                out.append(f"{where}{key} (repeats {DUPLICATES[key].canonical})")
    return out


_QUANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def source_quantization(
    config: dict, hf_quant: Any = None, source: str = "config.json"
) -> dict | None:
    """How the published checkpoint is already quantized (the spec's
    checkpoint.source_quantization), from config.json's ``quantization_config``
    or, for NVIDIA ModelOpt's releases, ``hf_quant_config.json`` beside it
    (``hf_quant``, parsed); None for 16-bit weights."""
    qc = config.get("quantization_config")
    if qc is not None:
        where, file = f"{source}: quantization_config", "config.json"
        if not isinstance(qc, dict) or not isinstance(qc.get("quant_method"), str):
            raise InputError(f"{where}: expected an object with a quant_method")
        method = qc["quant_method"]
    elif hf_quant is not None:
        where, file = "hf_quant_config.json: quantization", "hf_quant_config.json"
        qc = hf_quant.get("quantization") if isinstance(hf_quant, dict) else None
        if not isinstance(qc, dict) or not isinstance(qc.get("quant_algo"), str):
            raise InputError(f"{where}: expected an object with a quant_algo")
        method = "modelopt"
    else:
        return None
    algorithm = next(
        (qc[k] for k in ("quant_algo", "format", "fmt") if isinstance(qc.get(k), str)),
        None,
    )
    for name in (method, algorithm):
        if name is not None and not _QUANT_NAME.match(name):
            raise InputError(f"{where}: {printable(repr(name), 60)}: not a name")
    out: dict[str, Any] = {"method": method, "algorithm": algorithm, "file": file}
    block = qc.get("weight_block_size")
    if isinstance(block, list) and block and all(is_int(b) and b > 0 for b in block):
        out["weight_block_size"] = block
    return out


def source_quantization_note(quant: dict) -> str:
    """The header's phrase for a checkpoint.source_quantization."""
    what = " ".join(str(quant[k]) for k in ("method", "algorithm") if quant.get(k))
    if quant.get("weight_block_size"):
        what += f", blocks {'x'.join(map(str, quant['weight_block_size']))}"
    key = (
        "its quantization_config"
        if quant["file"] == "config.json"
        else "hf_quant_config.json beside it"
    )
    return (
        f"the checkpoint is already quantized ({what}, as {key} says): recorded as "
        "checkpoint.source_quantization, and the proof builds the family's model "
        "unquantized"
    )


# Keys accepted only at the value that leaves the forward pass as the spec has it.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "mlp_bias": (False,),
    "use_bias": (False,),  # ERNIE-4.5: biases on every projection
    "clip_qkv": (None,),  # OLMo: clamps q, k and v when set
    # ERNIE-4.5-MoE: the floor of the top-k weights' sum it divides by; released
    # configs' 1e-12 is never reached by softmax weights.
    "moe_norm_min": (1e-12,),
    "is_causal": (True,),
    "use_bidirectional_attention": (False, None),
}

REQUIRED = object()  # marker: a concept the config must state
# A family fact with no key: full-attention layers use no rope once a sliding
# window is set (EXAONE-4, Cohere-2). Open (found by the proof) for a family
# whose config class has no per-layer rope key.
NOPE_WHEN_SLIDING = "nope_when_sliding"
# A family fact with no key: no attention layer uses rope (Kimi Linear's MLA
# layers between its linear-attention layers).
NOPE_ATTENTION = "nope_attention"
# A family fact: the topk_method values its transformers router implements.
TOPK_METHODS = "topk_methods"
# A family fact: the text rope is multimodal (rope_parameters' mrope_section and
# mrope_interleaved split its frequencies between a time, a height and a width
# position). A language model's positions are the same on all three, so it is
# the plain rope: those keys change nothing (Qwen3.5).
TEXT_MROPE = "text_mrope"
# A family fact: config keys that mean another concept in this family than the
# alias table's (Llama-4's use_qk_norm is its weightless L2 norm on the rope
# layers, not Qwen3's q/k norms): key -> concept.
KEY_MEANS = "key_means"
# A family fact: concepts its config class defaults on, written off where the
# spec lacks them (Llama-4's attn_temperature_tuning and use_qk_norm).
WRITTEN_OFF = "written_off"


@dataclass(frozen=True)
class Family:
    """What one transformers model type implies beyond its config keys."""

    layout: str
    # Concept -> the value the family's transformers modeling code hard-codes.
    facts: dict[str, Any] = field(default_factory=dict)
    # Alias keys vLLM's in-tree model reads although transformers' class does not.
    vllm_keys: tuple[str, ...] = ()
    # How its checkpoints store tensors, beyond the layout (spec `checkpoint`).
    checkpoint: dict[str, Any] = field(default_factory=dict)


_GEMMA = {"scale_embedding": True, "norm_unit_offset": True}

# Families whose hard-coded facts are known. Another model type transformers knows
# is read with the Llama naming and the open concepts' defaults (or the caller's
# ``facts``): its block structure is not in config.json, so `spec from-hf` finds
# it by the proof (onboard.reference.infer), which also proves these.
FAMILIES: dict[str, Family] = {
    "llama": Family("llama"),
    "mistral": Family("llama"),
    "qwen2": Family("llama", {"qkv_bias": True}),
    "qwen3": Family("llama", {"qk_norm": True}),
    "qwen2_moe": Family("qwen", {"shared_expert_gate": True}),
    "qwen3_moe": Family("qwen", {"qk_norm": True}),
    # Gated DeltaNet and gated attention layers (layer_types), a gated shared
    # expert on every MoE block; the gate and the shared expert are hard-coded.
    # Its decoder-layer, q/k and final RMSNorms scale by (1 + weight), as Gemma's;
    # the linear-attention layers' gated norm by its weight.
    "qwen3_next": Family(
        "qwen",
        {
            "qk_norm": True,
            "attn_output_gate": True,
            "n_shared_experts": 1,
            "shared_expert_gate": True,
            "norm_unit_offset": True,
        },
    ),
    # Qwen3.5's language models: Qwen3-Next's block with the linear-attention
    # projections split (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); the MoE
    # router always renormalises its top-k (the config has no key for it); the
    # text rope is multimodal (TEXT_MROPE).
    "qwen3_5_text": Family(
        "llama",
        {
            TEXT_MROPE: True,
            "qk_norm": True,
            "attn_output_gate": True,
            "norm_unit_offset": True,
            "linear_projections": "split",
        },
    ),
    "qwen3_5_moe_text": Family(
        "qwen",
        {
            TEXT_MROPE: True,
            "qk_norm": True,
            "attn_output_gate": True,
            "n_shared_experts": 1,
            "shared_expert_gate": True,
            "norm_topk_prob": True,
            "norm_unit_offset": True,
            "linear_projections": "split",
        },
    ),
    "mixtral": Family("mixtral", {"norm_topk_prob": True}),
    "deepseek_v2": Family(
        "deepseek",
        # Complex-number (interleaved) rope; the router never renormalises top-k,
        # and has no noaux_tc branch (transformers fails on it; vLLM would add a
        # bias correction).
        {
            "rope_interleave": True,
            "scoring_func": "softmax",
            "norm_topk_prob": False,
            TOPK_METHODS: ("greedy", "group_limited_greedy"),
        },
        vllm_keys=("scoring_func",),
    ),
    "deepseek_v3": Family(
        "deepseek",
        # Sigmoid scores plus e_score_correction_bias; vLLM builds that bias only
        # when the config says topk_method: noaux_tc (docs/vllm-cpu-notes.md).
        {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
        vllm_keys=("topk_method", "scoring_func"),
    ),
    # DeepSeek-V3's block with sparse MLA: every layer's lightning indexer rotates
    # NeoX halves (its MLA interleaved pairs); the MLA latent norms' eps is fixed
    # at 1e-6.
    "deepseek_v32": Family(
        "deepseek",
        {
            "rope_interleave": True,
            "indexer_rope_interleave": False,
            # Its latent norms (q_a, kv_a) keep their default eps, not rms_norm_eps.
            "mla_norm_eps": 1e-6,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
        },
        # Its class declares no MTP key; vLLM's DeepSeek MTP reads this one.
        vllm_keys=("topk_method", "scoring_func", "num_nextn_predict_layers"),
    ),
    # GLM-5: the same with an interleaved index rope (vLLM reads
    # indexer_rope_interleave, transformers' class hard-codes it).
    "glm_moe_dsa": Family(
        "deepseek",
        {
            "rope_interleave": True,
            "indexer_rope_interleave": True,
            "mla_norm_eps": 1e-6,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
        },
        vllm_keys=("topk_method", "scoring_func", "indexer_rope_interleave"),
    ),
    # Attention sinks, a biased router whose softmax spans the top-k logits
    # (softmax, then top-k renormalised), and experts with biases stacked in one
    # module.
    "gpt_oss": Family(
        "gpt_oss",
        {
            "attention_sinks": True,
            "moe_router_bias": True,
            "moe_expert_bias": True,
            "scoring_func": "softmax",
            "norm_topk_prob": True,
        },
        checkpoint={"fused": ["experts"], "experts_format": "gpt_oss"},
    ),
    # DeepSeek-V3's MLA and MoE with a softmax router; its routed experts stacked
    # as two parameters of one module, output dim first (docs/hf-mapping.md).
    "mistral4": Family(
        "deepseek",
        checkpoint={
            "fused": ["experts"],
            "experts_format": "parameters",
            "tensor_names": {
                "experts_gate_up_proj": "model.layers.{layer}.mlp.experts",
                "experts_down_proj": "model.layers.{layer}.mlp.experts",
            },
        },
    ),
    # Post-norm blocks with per-head q/k norms. With a sliding window its
    # full-attention layers skip rope (NoPE).
    "exaone4": Family(
        "llama",
        {"qk_norm": True, "norm_placement": "post", NOPE_WHEN_SLIDING: True},
    ),
    # Gemma: the embeddings scaled by sqrt(hidden_size), every RMSNorm by
    # (1 + weight); Gemma-2/3 add the output norms (sandwich blocks), Gemma-3
    # per-head q/k norms. Gemma-3's attention never reads attn_logit_softcapping.
    "gemma": Family("llama", dict(_GEMMA)),
    "gemma2": Family("llama", {**_GEMMA, "norm_placement": "sandwich"}),
    "gemma3_text": Family(
        "llama",
        {
            **_GEMMA,
            "norm_placement": "sandwich",
            "qk_norm": True,
            "attn_logit_softcapping": None,
        },
    ),
    # Gemma-2's block without the output norms: its MLP's input norm keeps
    # Gemma-2's name.
    "vaultgemma": Family(
        "llama",
        dict(_GEMMA),
        checkpoint={
            "tensor_names": {
                "post_attention_norm": "model.layers.{layer}.pre_feedforward_layernorm"
            }
        },
    ),
    # GLM's block (interleaved partial rope, gate and up in one tensor, biases on
    # q/k/v but not o_proj) with sandwich norms under GLM-4's names: its MLP's
    # input norm is Llama's post_attention_layernorm.
    "glm4": Family(
        "llama",
        {"norm_placement": "sandwich", "rope_interleave": True, "o_bias": False},
        checkpoint={
            "fused": ["gate_up_proj"],
            "tensor_names": {
                role: "model.layers.{layer}." + name
                for role, name in (
                    ("attention_output_norm", "post_self_attn_layernorm"),
                    ("mlp_input_norm", "post_attention_layernorm"),
                    ("mlp_output_norm", "post_mlp_layernorm"),
                )
            },
        },
    ),
    # Llama blocks with four multipliers, all config keys.
    "granite": Family("llama"),
    # Mixtral's MoE with the router one module down, the experts saved fused; the
    # router takes the softmax of the top-k logits (renormalised top-k).
    "granitemoe": Family(
        "granite", {"norm_topk_prob": True}, checkpoint={"fused": ["experts"]}
    ),
    # ... and a shared expert beside the MoE block (shared_intermediate_size),
    # its gate and up in one tensor.
    "granitemoeshared": Family(
        "granite",
        {"norm_topk_prob": True},
        checkpoint={"fused": ["shared_gate_up_proj", "experts"]},
    ),
    # Llama-4's language model: complex-number (interleaved) rope; MoE layers
    # (moe_layers, interleave_moe_layer_step) beside dense ones of their own
    # width (intermediate_size_mlp; intermediate_size is the experts'); a router
    # whose sigmoid of the top-1 logit scales the expert's input, and one shared
    # expert of the experts' width; the experts stacked as two parameters of one
    # module, input dim first; every MLP under feed_forward.
    "llama4_text": Family(
        "llama",
        {
            "rope_interleave": True,
            "scoring_func": "sigmoid",
            "norm_topk_prob": False,
            "moe_router_weight_on_input": True,
            "n_shared_experts": 1,
            KEY_MEANS: {"use_qk_norm": "qk_l2_norm"},
            WRITTEN_OFF: ("qk_l2_norm", "attn_temperature_tuning"),
        },
        checkpoint={
            "fused": ["experts"],
            "experts_format": "parameters_transposed",
            "tensor_names": {
                role: f"model.layers.{{layer}}.feed_forward.{path}"
                for role, path in (
                    ("gate_proj", "gate_proj"),
                    ("up_proj", "up_proj"),
                    ("down_proj", "down_proj"),
                    ("router", "router"),
                    ("experts_gate_up_proj", "experts"),
                    ("experts_down_proj", "experts"),
                    ("shared_gate_proj", "shared_expert.gate_proj"),
                    ("shared_up_proj", "shared_expert.up_proj"),
                    ("shared_down_proj", "shared_expert.down_proj"),
                )
            },
        },
    ),
    # Kimi delta attention layers between MLA layers without rope; DeepSeek-V3's
    # MoE (sigmoid scores, bias correction, a shared expert). transformers saves
    # every layer's MLP under block_sparse_moe, the experts as w1/w2/w3.
    "kimi_linear": Family(
        "mixtral",
        {
            "linear_attention_type": "kimi_delta",
            NOPE_ATTENTION: True,
            # KimiLinearRMSNorm(kv_lora_rank): its default eps, not rms_norm_eps.
            "mla_norm_eps": 1e-6,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
        },
        checkpoint={
            "tensor_names": {
                role: f"model.layers.{{layer}}.block_sparse_moe.{path}"
                for role, path in (
                    ("gate_proj", "gate_proj"),
                    ("up_proj", "up_proj"),
                    ("down_proj", "down_proj"),
                    ("shared_gate_proj", "shared_experts.gate_proj"),
                    ("shared_up_proj", "shared_experts.up_proj"),
                    ("shared_down_proj", "shared_experts.down_proj"),
                )
            }
        },
    ),
}

# Concepts a family's modeling code may fix instead of reading a key, with the
# values a spec can give them (the first is what the reader assumes). For a family
# outside FAMILIES whose config class has no key for one, the value is the spec's
# own: `spec from-hf` tries each and keeps what its proof accepts
# (onboard.reference.infer), and the writer's round trip takes the spec's value.
OPEN_CONCEPTS: dict[str, tuple[Any, ...]] = {
    "qk_norm": (False, True),
    "qk_norm_scope": ("head", "projection", "head_weights"),
    "qk_norm_after_rope": (False, True),
    "attention_sinks": (False, True),
    "qkv_bias": (False, True),
    "o_bias": (False, True),
    "norm_placement": ("pre", "post", "parallel", "sandwich"),
    "norm_bias": (True, False),  # layernorm only
    "rope_interleave": (False, True),
    "n_shared_experts": (0, 1),  # HunYuan-MoE: one shared MLP, no count key
    "shared_expert_gate": (False, True),
    "topk_method": (None, "noaux_tc"),
    "scoring_func": ("softmax", "sigmoid"),
    "norm_topk_prob": (False, True),
    "moe_router_bias": (False, True),
    "moe_expert_bias": (False, True),
    # EXAONE-4 style: once a sliding window is set, the full-attention layers
    # use no rope (no config key says so; EXAONE-MoE's code does it too).
    NOPE_WHEN_SLIDING: (False, True),
}
# One key sets the q/k/v biases where the family has it. The output projection's
# bias stays open beside it: GLM's attention_bias leaves o_proj without one.
_BIAS_CONCEPTS = {"qkv_bias": "attention_bias"}
# The keys that say per layer which layers rotate (then NoPE is not open).
_NOPE_KEYS = ("no_rope_layers", "no_rope_layer_interval")

LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
# MLA families whose config class sets head_dim to the whole q/k head (nope +
# rope) and rope_parameters.partial_rotary_factor to the rope's share of it:
# MLA_WHOLE_HEAD (onboard.spec.model, which the rules read too).
# _rope_entry's key for Mistral-4's query scaling (attention.llama_4_scaling).
LLAMA_4_SCALING = "_llama_4_scaling"
ROPE_FIELDS = {
    "linear": ("factor",),
    "yarn": (
        "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
        "mscale", "mscale_all_dim", "truncate",
    ),
    "llama3": (
        "factor", "original_max_position_embeddings", "low_freq_factor",
        "high_freq_factor",
    ),
    # Phi-3's LongRoPE (transformers' _compute_longrope_parameters).
    "longrope": (
        "short_factor", "long_factor", "original_max_position_embeddings",
        "factor", "attention_factor",
    ),
}  # fmt: skip
# Scaling kinds under the names older configs give them (Phi-3's "su", which
# vLLM's config loader renames the same way).
LEGACY_ROPE_TYPES = {"su": "longrope"}
# Keys transformers' class writes that carry no information for the spec.
_NOISE = ("_name_or_path", "id2label", "label2id", "problem_type",
          "chunk_size_feed_forward", "is_encoder_decoder", "return_dict",
          "output_attentions", "output_hidden_states", "bos_token_id",
          "eos_token_id", "pad_token_id")  # fmt: skip
# The spec fields a config.json carries (the rest are launch wishes and file names).
_HF_CARRIED = (
    "architecture",
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "max_position_embeddings",
    "norm",
    "attention",
    "rope",
    "mlp",
    # The top-level fields of components (linear attention's, the embeddings',
    # the logits', MTP's).
    *(f for c in components.every() if c.extends == "" for f in c.Fields.model_fields),
)


# ---- transformers' config classes ------------------------------------------------


@contextmanager
def quiet_transformers() -> Iterator[None]:
    # Config classes log rope-validation warnings; problems are reported by us.
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@dataclass(frozen=True)
class _Known:
    cls: type
    declared: frozenset[str]  # keys the class writes
    attribute_map: dict[str, str]  # alias -> declared key
    reads: frozenset[str]  # declared keys and those its modeling code reads
    # rope_parameters keyed by layer type (Gemma-3, OLMo-3), not one for all layers
    rope_by_kind: bool = False


_CONFIG_READ = re.compile(
    r"\bconfig\.([A-Za-z_]\w*)|getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)[\"']"
)


def _modeling_reads(config_cls: type) -> set[str]:
    """Config attributes transformers' modeling code reads (some, such as Qwen's
    ``head_dim``, are optional and not declared by the config class)."""
    name = config_cls.__module__.replace(".configuration_", ".modeling_")
    try:
        found = importlib.util.find_spec(name)
    except ImportError:
        return set()
    if found is None or not found.origin:
        return set()
    text = Path(found.origin).read_text(encoding="utf-8")
    return {a or b for a, b in _CONFIG_READ.findall(text)}


def transformers_knows(model_type: str) -> bool:
    """Whether the installed transformers has a config class for ``model_type``."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError as exc:  # pragma: no cover - the cpu/gpu extras install it
        raise InputError(
            "transformers is needed to map Hugging Face configs "
            "(pip install 'onboard[cpu]')"
        ) from exc
    return model_type in CONFIG_MAPPING


@cache
def _known(model_type: str) -> _Known:
    """transformers' config class for a verified family, and the keys it reads."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    with quiet_transformers():
        defaults = cls().to_dict()
    declared = frozenset(defaults)
    attribute_map = dict(getattr(cls, "attribute_map", {}) or {})
    reads = declared | {attribute_map.get(k, k) for k in _modeling_reads(cls)}
    return _Known(
        cls,
        declared,
        attribute_map,
        frozenset(reads),
        rope_by_kind=_by_kind(defaults.get("rope_parameters")),
    )


def _by_kind(params: Any) -> bool:
    """Whether ``rope_parameters`` holds one dict per layer type."""
    return (
        isinstance(params, dict)
        and bool(params)
        and all(isinstance(v, dict) for v in params.values())
    )


# What a family without known facts is read as, before its proof: the Llama
# naming and nothing its config does not say.
UNVERIFIED = Family("llama")


def _family(model_type: str) -> tuple[_Known | None, Family | None]:
    """(transformers' class, family facts); (None, None) for a new model type. A
    family not in :data:`FAMILIES` is read as :data:`UNVERIFIED`: what its code
    hard-codes is for its proof to find (onboard.reference.infer)."""
    if not transformers_knows(model_type):
        return None, None
    return _known(model_type), FAMILIES.get(model_type, UNVERIFIED)


def open_concepts(model_type: str) -> list[str]:
    """The :data:`OPEN_CONCEPTS` that ``model_type``'s config class cannot state:
    empty for a verified family (its facts fix them) and for a new model type (the
    spec writes every key)."""
    if model_type in FAMILIES or not transformers_knows(model_type):
        return []
    known = _known(model_type)
    return _unstated(lambda concept: _key_for(concept, known) is not None)


def unstated_concepts(keys: set[str]) -> list[str]:
    """The :data:`OPEN_CONCEPTS` that no key in ``keys`` states: for a family whose
    code ships beside its config (``auto_map``), what that code may hard-code."""
    return _unstated(lambda concept: bool(keys.intersection(ALIASES[concept])))


def _unstated(stated: Callable[[str], bool]) -> list[str]:
    """The open concepts no key states (``stated``: whether a concept's key is
    there)."""
    return [
        concept
        for concept in OPEN_CONCEPTS
        if (concept not in ALIASES or not stated(concept))
        and (concept not in _BIAS_CONCEPTS or not stated(_BIAS_CONCEPTS[concept]))
        # A key saying which layers have no rope settles it (SmolLM3).
        and (concept != NOPE_WHEN_SLIDING or not any(map(stated, _NOPE_KEYS)))
    ]


def spec_facts(spec: ModelSpec, concepts: list[str]) -> dict[str, Any]:
    """The spec's values of ``concepts``, as config values."""
    att, moe = spec.attention, spec.mlp.moe
    values: dict[str, Any] = {
        "rope_interleave": spec.rope.interleaved,
        NOPE_WHEN_SLIDING: _nope_when_sliding(spec),
    }
    if att.type == "gqa":
        values.update(qkv_bias=att.qkv_bias, o_bias=att.o_bias)
    if moe is not None:
        values.update(
            n_shared_experts=moe.num_shared_experts,
            shared_expert_gate=moe.shared_expert_gate,
            moe_expert_bias=moe.expert_bias,
        )
    for component in components.every():
        values.update(component.facts(spec))
    return {c: values[c] for c in concepts if c in values}


def _nope_when_sliding(spec: ModelSpec) -> bool:
    """Whether the spec's NoPE layers are exactly its full-attention layers beside
    sliding ones (what :data:`NOPE_WHEN_SLIDING` makes of a config)."""
    kinds = spec.layer_attention_types()
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    return (
        "sliding_attention" in kinds
        and bool(full)
        and sorted(spec.rope.nope_layers) == full
    )


# ---- reading a config ------------------------------------------------------------


class _Reader:
    """One pass over a config dict: concept lookups, used keys, problems."""

    def __init__(
        self,
        cfg: dict,
        facts: dict[str, Any],
        fixed: bool,
        aliases: dict[str, tuple[str, ...]] | None = None,
    ):
        self.cfg = cfg
        self.facts = facts
        self.fixed = fixed  # facts win over keys (what transformers' class does)
        # The family's alias table (config_aliases.family_aliases).
        self.aliases = aliases if aliases is not None else family_aliases({})
        self.used: set[str] = set()
        self.problems: list[str] = []
        # Concepts the reader makes of others (components.base.LAYER_TYPES).
        self.derived: dict[str, Any] = {}

    def get(self, concept: str, default: Any = None) -> Any:
        if concept in self.derived:
            return self.derived[concept]
        means = self.facts.get(KEY_MEANS, {})
        keys = [k for k in self.aliases[concept] if k in self.cfg and k not in means]
        keys += [k for k, c in means.items() if c == concept and k in self.cfg]
        self.used.update(keys)
        if self.fixed and concept in self.facts:
            return self.facts[concept]
        # An alias set to null is unset (vLLM's Gemma reads hidden_activation
        # so, beside hidden_act).
        values = [self.cfg[k] for k in keys if self.cfg[k] is not None]
        if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            shown = ", ".join(f"{k}={self.cfg[k]!r}" for k in keys)
            self.problems.append(
                f"{shown}: aliases of one concept disagree ({concept}): a reader "
                "takes either key, and the model it builds differs with the value "
                "(fix the config)"
            )
        if values:
            return values[0]
        if not keys and concept in self.facts:
            return self.facts[concept]
        if default is REQUIRED:
            self.problems.append(f"{concept}: required, but the config does not set it")
            return None
        return None if keys else default

    def count(self, concept: str, default: int, minimum: int) -> int:
        """An integer concept; a wrong type or a too small value is a problem."""
        value = self.get(concept)
        if value is None:
            return default
        if not is_int(value) or value < minimum:
            keys = "/".join(self.aliases[concept])
            self.bad(f"{keys}={value!r}: must be an integer >= {minimum}")
            return default
        return value

    def bad(self, message: str) -> None:
        self.problems.append(message)


def _read(
    cfg: dict,
    facts: dict[str, Any],
    fixed: bool,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> tuple[dict, _Reader]:
    """Spec data (before validation) from a config dict."""
    r = _Reader(cfg, facts, fixed, aliases)
    spec: dict[str, Any] = {
        "vocab_size": r.get("vocab_size", REQUIRED),
        "hidden_size": r.get("hidden_size", REQUIRED),
        "num_hidden_layers": r.get("num_hidden_layers", REQUIRED),
        "max_position_embeddings": r.get("max_position_embeddings", REQUIRED),
    }
    spec["norm"] = {}  # the norms' components read theirs
    n_layers = (
        spec["num_hidden_layers"] if isinstance(spec["num_hidden_layers"], int) else 0
    )
    spec["attention"], spec["rope"] = _read_attention(r, n_layers)
    r.derived[LAYER_TYPES] = spec["attention"].get("layer_types")
    spec["mlp"] = _read_mlp(r, n_layers)
    for component in components.every():
        _read_component(spec, component, r)
    return spec, r


def _read_component(spec: dict, component: Component, r: _Reader) -> None:
    """A component's fields, read from the config into its spec section (a
    section the config does not have, e.g. MLA's for a GQA model, takes none)."""
    try:
        fields = component.read(r.get)
    except ConfigProblem as exc:
        for message in exc.args:
            r.bad(message)
        fields = exc.read
    if not fields or component.extends is None:
        return
    section: Any = spec
    for key in filter(None, component.extends.split(".")):
        section = section.get(key) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        names = ", ".join(fields)
        r.bad(f"{names}: set, but the config has no {component.extends} for it")
        return
    section.update(fields)


def _read_attention(r: _Reader, n_layers: int) -> tuple[dict, dict]:
    att: dict[str, Any] = {"num_heads": r.get("num_attention_heads", REQUIRED)}
    kv_heads = r.get("num_key_value_heads")
    head_dim = r.get("head_dim")
    sinks = bool(r.get("attention_sinks", False))
    both = r.get("attention_bias")
    qkv_bias = r.get("qkv_bias", both if both is not None else False)
    o_bias = r.get("o_bias", both if both is not None else False)
    partial = r.get("partial_rotary_factor")
    rope, rope_partial = _read_rope(r)
    llama_4 = rope.pop(LLAMA_4_SCALING, None)
    if partial is not None and rope_partial is not None and partial != rope_partial:
        r.bad(
            f"partial_rotary_factor={partial!r} disagrees with "
            f"rope_parameters.partial_rotary_factor={rope_partial!r}"
        )
    partial = partial if partial is not None else rope_partial
    windows = _read_windows(r, n_layers)
    if windows.get("sliding_window") is None or "sliding_attention" not in (
        _layer_kinds(windows, n_layers)
    ):
        rope.pop("sliding", None)  # no layer reads the sliding layers' rope
    rope["nope_layers"] = _read_nope(r, n_layers, windows)
    _check_chunked(r, n_layers, rope["nope_layers"])
    mla = {
        k: r.get(k)
        for k in (
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        )
    }
    qk_head_dim = r.get("qk_head_dim")
    if mla["kv_lora_rank"] is None:
        stray = [k for k, v in mla.items() if v is not None]
        if stray:
            r.bad(f"{', '.join(stray)}: MLA fields set but kv_lora_rank is not")
        att.update(
            type="gqa",
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            qkv_bias=bool(qkv_bias),
            o_bias=bool(o_bias),
            **windows,
        )
        if partial is not None:
            att["partial_rotary_factor"] = partial
        if llama_4 is not None:
            att["llama_4_scaling"] = llama_4  # refused by the spec rules
        return att, rope
    # MLA: the GQA knobs must be absent or at their neutral values.
    latent_eps = r.get("mla_norm_eps")
    if latent_eps is not None:
        mla["latent_norm_eps"] = latent_eps
    # Sharing layers read their target's latent and rope key (docs/spec.md).
    att.update(type="mla", mla=mla)
    if llama_4 is not None:
        att["llama_4_scaling"] = llama_4
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if mla[key] is None:
            r.bad(f"{key}: required for MLA (kv_lora_rank is set)")
    if kv_heads is not None and kv_heads != att["num_heads"]:
        r.bad(
            f"num_key_value_heads={kv_heads}: MLA needs it equal to "
            f"num_attention_heads ({att['num_heads']})"
        )
    nope, rope_dims = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"]
    if partial not in (None, 1.0) and is_int(nope) and is_int(rope_dims):
        # Mistral-4: the rope's share of the whole q/k head (its class sets
        # head_dim to nope + rope whatever the key says): qk_rope_head_dim's dims.
        if abs(partial * (nope + rope_dims) - rope_dims) > 1e-9:
            r.bad(
                f"partial_rotary_factor={partial!r}: rotates "
                f"{partial * (nope + rope_dims):g} dims of each MLA head's "
                f"{nope + rope_dims}, the spec qk_rope_head_dim ({rope_dims})"
            )
        partial = None
    elif head_dim is not None and head_dim != rope_dims:
        r.bad(f"head_dim={head_dim}: for MLA it must equal qk_rope_head_dim")
    if (
        qk_head_dim is not None
        and is_int(mla["qk_nope_head_dim"])
        and is_int(mla["qk_rope_head_dim"])
        and qk_head_dim != mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    ):
        r.bad(f"qk_head_dim={qk_head_dim}: must be qk_nope_head_dim + qk_rope_head_dim")
    if qkv_bias or o_bias:
        r.bad("attention_bias: biased MLA projections are not expressible")
    if sinks:
        r.bad("attention_sinks: not expressible for MLA attention")
    if partial not in (None, 1.0):
        r.bad(f"partial_rotary_factor={partial!r}: not expressible for MLA")
    if windows.get("sliding_window") is not None:
        r.bad("sliding_window: not expressible for MLA attention")
    if "layer_types" in windows:
        # Linear-attention layers between the MLA layers (Kimi Linear).
        att["layer_types"] = windows["layer_types"]
    return att, rope


def _read_rope(r: _Reader) -> tuple[dict, float | None]:
    params = r.get("rope_parameters") or {}
    legacy = r.get("rope_scaling") or {}
    theta_legacy = r.get("rope_theta")
    interleaved = bool(r.get("rope_interleave", False))
    if not isinstance(params, dict) or not isinstance(legacy, dict):
        r.bad("rope_parameters / rope_scaling: must be a mapping")
        return {}, None
    if _by_kind(params):
        return _read_rope_by_kind(r, params, legacy or theta_legacy, interleaved)
    rope, partial = _rope_entry(
        r, {**legacy, **params}, theta_legacy, "rope_parameters"
    )
    return {**rope, "interleaved": interleaved}, partial


def _read_rope_by_kind(
    r: _Reader, params: dict, legacy: Any, interleaved: bool
) -> tuple[dict, float | None]:
    """Gemma-3 / OLMo-3: ``rope_parameters`` per layer type. The full-attention
    layers' is the spec's rope, the sliding layers' its ``sliding`` where it
    differs."""
    other = sorted(set(params) - set(LAYER_KINDS))
    if other:
        r.bad(
            f"rope_parameters: per-layer-type rope parameters for {other} are not "
            f"expressible (only {' / '.join(LAYER_KINDS)})"
        )
        return {}, None
    if legacy:
        r.bad("rope_parameters per layer type beside rope_theta / rope_scaling")
    if "full_attention" not in params:
        r.bad("rope_parameters.full_attention: required beside sliding_attention")
        return {}, None
    full, partial = _rope_entry(
        r, dict(params["full_attention"]), None, "rope_parameters.full_attention"
    )
    rope = {**full, "interleaved": interleaved}
    if "sliding_attention" in params:
        sliding, sliding_partial = _rope_entry(
            r,
            dict(params["sliding_attention"]),
            None,
            "rope_parameters.sliding_attention",
        )
        if sliding_partial != partial:
            r.bad(
                "rope_parameters: partial_rotary_factor differs between the layer "
                f"types ({partial!r}, {sliding_partial!r})"
            )
        if sliding != full:
            rope["sliding"] = sliding
    return rope, partial


def _rope_entry(
    r: _Reader, merged: dict, theta_legacy: Any, where: str
) -> tuple[dict, float | None]:
    """One rope's theta and scaling (``where`` names it in messages), and its
    partial rotary factor."""
    theta = merged.pop("rope_theta", None)
    if theta is not None and theta_legacy is not None and theta != theta_legacy:
        r.bad(f"rope_theta={theta_legacy!r} disagrees with {where}.rope_theta")
    theta = theta if theta is not None else theta_legacy
    kind, legacy_kind = merged.pop("rope_type", None), merged.pop("type", None)
    if (
        kind
        and legacy_kind
        and LEGACY_ROPE_TYPES.get(kind, kind)
        != LEGACY_ROPE_TYPES.get(legacy_kind, legacy_kind)
    ):
        r.bad(f"{where}: rope_type={kind!r} but type={legacy_kind!r}")
    kind = kind or legacy_kind or "default"
    kind = LEGACY_ROPE_TYPES.get(kind, kind)
    partial = merged.pop("partial_rotary_factor", None)
    # Phi-3's top-level copy: transformers moves it into a scaling's parameters
    # and reads it nowhere else, so without a scaling it changes nothing.
    original = r.get("original_max_position_embeddings")
    if kind != "default" and original is not None:
        inner = merged.get("original_max_position_embeddings")
        if inner is None:
            merged["original_max_position_embeddings"] = original
        elif inner != original:
            r.bad(
                f"original_max_position_embeddings={original!r} disagrees with "
                f"rope_parameters.original_max_position_embeddings={inner!r}"
            )
    if merged.get("truncate", True) is True:
        merged.pop("truncate", None)  # yarn's default (false: yarn's field below)
    # Mistral-4 repeats the context length here; transformers reads the config's.
    if "max_position_embeddings" in merged and merged[
        "max_position_embeddings"
    ] == r.get("max_position_embeddings"):
        merged.pop("max_position_embeddings")
    # Mistral-4's query scaling reads the original_max_position_embeddings yarn
    # reads too (attention.llama_4_scaling).
    beta = merged.pop("llama_4_scaling_beta", None)
    llama_4 = None
    if beta not in (None, 0, 0.0):
        steps = merged.get("original_max_position_embeddings")
        if not is_int(steps) or steps < 1:
            r.bad(
                f"{where}.llama_4_scaling_beta={beta!r}: needs "
                f"{where}.original_max_position_embeddings, got {steps!r}"
            )
        else:
            llama_4 = {"beta": beta, "original_max_position_embeddings": steps}
    if r.facts.get(TEXT_MROPE):
        merged.pop("mrope_section", None)
        merged.pop("mrope_interleaved", None)
    rope: dict[str, Any] = {"theta": theta if theta is not None else 10000.0}
    if llama_4 is not None:
        rope[LLAMA_4_SCALING] = llama_4  # the caller moves it to attention
        if "original_max_position_embeddings" not in ROPE_FIELDS.get(kind, ()):
            merged.pop("original_max_position_embeddings")
    if kind not in ("default", *ROPE_FIELDS):
        r.bad(
            f"{where}.rope_type={kind!r}: not expressible (default, "
            f"{', '.join(ROPE_FIELDS)})"
        )
        return rope, partial
    if kind != "default":
        # longrope's factor defaults to the context's ratio (transformers').
        if "factor" not in merged and kind != "longrope":
            r.bad(f"{where}.factor: required for rope_type {kind}")
        rope["scaling"] = {
            "type": kind,
            **{k: merged.pop(k) for k in ROPE_FIELDS[kind] if k in merged},
        }
    for key in merged:
        r.bad(f"{where}.{key}: not expressible for rope_type {kind}")
    return rope, partial


def _read_windows(r: _Reader, n_layers: int) -> dict[str, Any]:
    window = r.get("sliding_window")
    use = r.get("use_sliding_window")
    kinds = r.get("layer_types")
    if isinstance(kinds, list) and "indexed_attention" in kinds:
        # Sparse MLA (DeepSeek-V3.2, GLM-5): every layer attends through its
        # indexer, which the attention.indexer section states.
        if set(kinds) != {"indexed_attention"} or r.get("index_topk") is None:
            r.bad(
                f"layer_types: indexed_attention layers are expressible only as "
                f"every layer, with index_topk set, got {_short(kinds)}"
            )
        kinds = None
    if isinstance(kinds, list) and "chunked_attention" in kinds:
        # Llama-4's chunked local attention (attention.chunk_size): its layers
        # attend without a window.
        kinds = ["full_attention" if k == "chunked_attention" else k for k in kinds]
    pattern = r.get("sliding_window_pattern")
    max_window_layers = r.get("max_window_layers")
    if window == 0 or use is False:
        window = None  # Qwen: the window is off unless use_sliding_window
    if kinds is not None:
        if not isinstance(kinds, list) or any(k not in LAYER_KINDS for k in kinds):
            r.bad(
                f"layer_types: only {' / '.join(LAYER_KINDS)} layers are "
                f"expressible, got {_short(kinds)}"
            )
            return {"sliding_window": window}
        if len(kinds) != n_layers:
            r.bad(f"layer_types: {len(kinds)} entries for {n_layers} layers")
    if window is None:
        if kinds is not None and "linear_attention" in kinds:
            # The other layers attend fully (no window to slide).
            return {
                "sliding_window": None,
                "layer_types": [
                    k if k == "linear_attention" else "full_attention" for k in kinds
                ],
            }
        return {"sliding_window": None}  # every layer attends fully
    if kinds is None and max_window_layers not in (None, 0, n_layers):
        # Families disagree on what max_window_layers means without layer_types.
        r.bad("max_window_layers: ambiguous without an explicit layer_types list")
    out: dict[str, Any] = {"sliding_window": window}
    if isinstance(pattern, str):
        # EXAONE-4's spelling: "LLLG", one letter per layer (L sliding, G full),
        # repeated from layer 0; the last layer is full whatever it says.
        letters = _letter_kinds(pattern, n_layers)
        if letters is None:
            r.bad(
                f"sliding_window_pattern={pattern!r}: expected the letters L "
                "(sliding) and G (full attention), or an integer"
            )
        elif kinds is not None and kinds != letters:
            pairs = zip(kinds, letters, strict=False)
            i = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
            where = (
                f"layer {i} is {kinds[i]} in layer_types, {letters[i]} by the pattern"
                if i is not None
                else f"{len(kinds)} layer_types for {n_layers} layers"
            )
            r.bad(
                f"layer_types disagrees with sliding_window_pattern={pattern!r}: "
                f"{where} (which layers slide changes what each layer attends to)"
            )
        elif pattern == "L" * (len(pattern) - 1) + "G" and n_layers % len(pattern) == 0:
            out["sliding_window_pattern"] = len(pattern)  # every Nth layer full
        else:
            out["layer_types"] = letters
        return out
    if pattern is not None:
        out["sliding_window_pattern"] = pattern
        expect = (
            [
                "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(n_layers)
            ]
            if isinstance(pattern, int) and pattern > 0
            else None
        )
        if kinds is not None and kinds != expect:
            r.bad("layer_types disagrees with sliding_window_pattern")
    elif kinds is not None and {"full_attention", "linear_attention"} & set(kinds):
        out["layer_types"] = kinds
    return out


def _check_chunked(r: _Reader, n_layers: int, nope: list[int]) -> None:
    """Llama-4's chunked_attention layers (attention.chunk_size, read by its
    component) must be the layers that rotate, as vLLM's llama4.py chunks them."""
    kinds = r.get("layer_types")
    if not isinstance(kinds, list) or "chunked_attention" not in kinds:
        return
    chunked = [i for i, k in enumerate(kinds) if k == "chunked_attention"]
    rotating = [i for i in range(n_layers) if i not in nope]
    if chunked != rotating:
        r.bad(
            f"layer_types: the chunked_attention layers {_short(chunked)} are not "
            f"the layers that rotate {_short(rotating)}: vLLM chunks the rope "
            "layers (Llama-4), and no spec says other layers"
        )
    size = r.get("attention_chunk_size")
    if not is_int(size) or size < 1:
        r.bad(f"attention_chunk_size={size!r}: chunked_attention layers need it")


def _letter_kinds(pattern: str, n_layers: int) -> list[str] | None:
    """A letter pattern (``"LLLG"``) as per-layer kinds; None if not one."""
    if not pattern or set(pattern) - {"L", "G"}:
        return None
    kinds = [
        "full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention"
        for i in range(n_layers)
    ]
    return kinds[:-1] + ["full_attention"] if kinds else kinds


def _read_nope(r: _Reader, n_layers: int, windows: dict[str, Any]) -> list[int]:
    """The layers without rope: SmolLM3's no_rope_layers (0 = NoPE; its class
    fills the list from no_rope_layer_interval), or EXAONE-4's full-attention
    layers when a window is set."""
    flags = r.get("no_rope_layers")
    interval = r.get("no_rope_layer_interval")
    if flags is None and interval is not None:
        if not is_int(interval) or interval < 1:
            r.bad(f"no_rope_layer_interval={interval!r}: must be an integer >= 1")
            return []
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if flags is not None:
        if (
            not isinstance(flags, list)
            or len(flags) != n_layers
            or any(f not in (0, 1) or isinstance(f, float) for f in flags)
        ):
            r.bad(
                f"no_rope_layers={_short(flags)}: must list 1 (rope) or 0 (NoPE) "
                f"for each of the {n_layers} layers"
            )
            return []
        return [i for i, f in enumerate(flags) if f == 0]
    if r.facts.get(NOPE_ATTENTION):
        return [
            i
            for i, kind in enumerate(_layer_kinds(windows, n_layers))
            if kind != "linear_attention"
        ]
    if r.facts.get(NOPE_WHEN_SLIDING) and windows.get("sliding_window") is not None:
        return [
            i
            for i, kind in enumerate(_layer_kinds(windows, n_layers))
            if kind == "full_attention"
        ]
    return []


def _layer_kinds(windows: dict[str, Any], n_layers: int) -> list[str]:
    """Per layer full_attention / sliding_attention, as the spec reads windows."""
    if windows.get("layer_types") is not None:
        return list(windows["layer_types"])
    pattern = windows.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n_layers)
        ]
    return ["sliding_attention"] * n_layers


def _read_mlp(r: _Reader, n_layers: int) -> dict:
    dense_size = r.get("intermediate_size")
    # Llama-4: the dense layers' own width; intermediate_size is the experts'.
    dense_mlp = r.get("intermediate_size_mlp")
    experts = r.get("n_routed_experts")
    moe_keys = (
        "moe_layers",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_shared_experts",
        "shared_expert_intermediate_size",
        "shared_expert_gate",
        "first_k_dense_replace",
        "decoder_sparse_step",
        "moe_layer_freq",
        "mlp_only_layers",
        "mlp_layer_types",
        "moe_layer_end_index",
        "moe_expert_bias",
        "swiglu_alpha",
        "swiglu_limit",
    )
    if not experts:
        for key in moe_keys:  # a dense model: MoE keys (class defaults) mean nothing
            r.get(key)
        return {"intermediate_size": dense_mlp if dense_mlp is not None else dense_size}
    expert_size = r.get("moe_intermediate_size")
    first_k = r.count("first_k_dense_replace", 0, minimum=0)
    step = r.count("decoder_sparse_step", 1, minimum=1)
    deepseek_freq = r.count("moe_layer_freq", 1, minimum=1)
    dense_layers = r.get("mlp_only_layers", []) or []
    if not isinstance(dense_layers, list) or not all(is_int(i) for i in dense_layers):
        r.bad(f"mlp_only_layers={dense_layers!r}: must be a list of layer indices")
        dense_layers = []
    dense_layers = list(dense_layers)
    if deepseek_freq != 1:
        if step != 1:
            r.bad("decoder_sparse_step and moe_layer_freq: give only one")
        # DeepSeek's rule is i % N == 0; the spec's is (i + 1) % N == 0: list them.
        dense_layers += [
            i
            for i in range(first_k, n_layers)
            if i % deepseek_freq and i not in dense_layers
        ]
    last = r.get("moe_layer_end_index")
    if last is not None:
        if not is_int(last):
            r.bad(f"moe_layer_end_index={last!r}: must be a layer index")
        else:
            dense_layers += [
                i for i in range(last + 1, n_layers) if i not in dense_layers
            ]
    dense_layers += _dense_by_kind(r, n_layers, first_k, step, dense_layers)
    dense_layers += _dense_by_list(r, n_layers, first_k, step, dense_layers)
    if expert_size is None and dense_mlp is not None:
        # Llama-4: intermediate_size is the experts' width.
        expert_size, dense_size = dense_size, dense_mlp
    elif expert_size is None:
        # Mixtral: no expert-width key; the experts use intermediate_size.
        expert_size, dense_size = dense_size, None
        if first_k or dense_layers or step != 1:
            r.bad("moe_intermediate_size: missing, and some layers are dense")
    shared_size = r.get("shared_expert_intermediate_size") or None
    # Qwen2-MoE has no count: a shared size means one shared expert.
    n_shared = r.count("n_shared_experts", 1 if shared_size else 0, minimum=0)
    gate = bool(r.get("shared_expert_gate", False)) and n_shared > 0
    moe = {
        "num_experts": experts,
        "num_experts_per_tok": r.get("num_experts_per_tok", REQUIRED),
        "expert_intermediate_size": expert_size,
        "num_shared_experts": n_shared,
        "shared_expert_intermediate_size": shared_size if n_shared else None,
        "shared_expert_gate": gate,
        "first_k_dense": first_k,
        "layer_frequency": step,
        "dense_layers": dense_layers,
        "expert_bias": bool(r.get("moe_expert_bias", False)),
        "swiglu_alpha": r.get("swiglu_alpha"),
        "swiglu_limit": r.get("swiglu_limit"),
        "router": {},  # its component reads it (onboard.components.router)
    }
    _check_topk_method(r)
    return {"intermediate_size": dense_size, "moe": moe}


def _check_topk_method(r: _Reader) -> None:
    """The family's own limit on its router: the ``topk_method`` values its
    transformers router implements (a family fact)."""
    method = r.get("topk_method")
    implemented = r.facts.get(TOPK_METHODS, (method,))
    if method in KNOWN_TOPK_METHODS and method not in implemented:
        r.bad(
            f"topk_method={method!r}: this family's transformers router implements "
            f"only {', '.join(implemented)}"
        )


def _dense_by_kind(
    r: _Reader, n_layers: int, first_k: int, step: int, dense: list[int]
) -> list[int]:
    """The layers ``mlp_layer_types`` makes dense beyond the other placement keys
    (GLM-4-MoE-Lite has only this list); a layer it calls sparse must be MoE by
    them too."""
    kinds = r.get("mlp_layer_types")
    if kinds is None:
        return []
    if (
        not isinstance(kinds, list)
        or len(kinds) != n_layers
        or any(k not in ("dense", "sparse") for k in kinds)
    ):
        r.bad(
            f"mlp_layer_types={_short(kinds)}: must list dense or sparse for each "
            f"of the {n_layers} layers"
        )
        return []
    more = []
    for i, kind in enumerate(kinds):
        moe = i >= first_k and (i + 1) % step == 0 and i not in dense
        if kind == "dense" and moe:
            more.append(i)
        elif kind == "sparse" and not moe:
            r.bad(
                f"mlp_layer_types[{i}]='sparse', but the other MoE placement keys "
                "make that layer dense"
            )
    return more


def _dense_by_list(
    r: _Reader, n_layers: int, first_k: int, step: int, dense: list[int]
) -> list[int]:
    """The layers Llama-4's ``moe_layers`` list leaves dense beyond the other
    placement keys (its class fills the list from interleave_moe_layer_step); a
    layer it lists must be MoE by them too."""
    listed = r.get("moe_layers")
    if listed is None:
        return []
    if not isinstance(listed, list) or not all(
        is_int(i) and 0 <= i < n_layers for i in listed
    ):
        r.bad(f"moe_layers={_short(listed)}: must list layer indices below {n_layers}")
        return []
    more = []
    for i in range(n_layers):
        moe = i >= first_k and (i + 1) % step == 0 and i not in dense
        if moe and i not in listed:
            more.append(i)
        elif i in listed and not moe:
            r.bad(
                f"moe_layers lists layer {i}, but the other MoE placement keys "
                "make that layer dense"
            )
    return more


def _default_architecture(model_type: str, known: _Known | None) -> str:
    if known is not None:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )

        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    return "".join(p[:1].upper() + p[1:] for p in model_type.split("_")) + "ForCausalLM"


def _normalised(known: _Known, config: dict, source: str) -> dict:
    """The config as transformers' class reads it (defaults filled, aliases mapped)."""
    try:
        with quiet_transformers():
            return known.cls.from_dict(dict(config)).to_dict()
    except Exception as exc:  # the class's own validation, e.g. a wrong type
        detail = " ".join(str(exc).split())
        raise InputError(
            f"{source}: transformers' {known.cls.__name__} rejects this config: "
            f"{detail}"
        ) from None


def spec_from_hf_config(
    config: dict,
    *,
    name: str | None = None,
    source: str = "config.json",
    facts: dict[str, Any] | None = None,
) -> ModelSpec:
    """Read a spec from a Hugging Face config dict; refuse what it cannot map.

    This is the reading, not the proof: what a family's code hard-codes beyond its
    config is known for the families of :data:`FAMILIES`, and otherwise taken
    from ``facts`` (values of :data:`OPEN_CONCEPTS`, a hypothesis) or the
    concepts' defaults. ``onboard.reference.infer.infer_spec`` (what
    `onboard spec from-hf` runs) finds those values and proves the spec against
    the family's own class."""
    check_config_object(config, source)
    model_type = model_type_of(config, source)
    wrapped = _wrapped_text(config, model_type, source)
    if wrapped is not None:
        return _wrapper_spec(
            config, model_type, wrapped, name=name, source=source, facts=facts
        )
    known, family = _family(model_type)
    facts = {**(family.facts if family else {}), **(facts or {})}
    cfg = _normalised(known, config, source) if known else dict(config)

    try:
        # What every reader sees: all keys, the family's facts only where absent.
        aliases = family_aliases(known.attribute_map if known else {})
        data, reader = _read(cfg, facts, fixed=False, aliases=aliases)
        problems = list(reader.problems)
        problems += _duplicates(cfg, data, reader.used)
        if known is not None and not known.rope_by_kind:
            if _by_kind(cfg.get("rope_parameters")):
                problems.append(
                    f"rope_parameters: per layer type, but transformers' "
                    f"{known.cls.__name__} has one rope for every layer"
                )
        if known is not None:
            # What transformers' class computes: the keys it reads, facts enforced.
            declared = {k: v for k, v in cfg.items() if k in known.reads}
            as_class, class_reader = _read(declared, facts, fixed=True, aliases=aliases)
            problems += [p for p in class_reader.problems if p not in problems]
            contradictions = _contradictions(data, as_class, model_type, known)
            unread = sorted(
                k for k in reader.used - known.reads if cfg.get(k) is not None
            )
            if contradictions and unread:
                # Name the keys behind them that the class never reads.
                contradictions.append(
                    f"{', '.join(unread)}: transformers' {known.cls.__name__} does "
                    "not read it, so its model ignores what it says"
                )
            problems += contradictions
    except (TypeError, ValueError, AttributeError) as exc:
        # Safety net for value types the checks above do not anticipate.
        raise InputError(
            f"{source}: a field has a value of the wrong type ({exc})"
        ) from None
    problems += _interval_copy(cfg, reader.used)
    for key in sorted(
        set(cfg) - reader.used - IGNORED - {"model_type", "architectures"}
    ):
        if key.startswith("_"):
            continue
        if key in ACCEPTED:
            continue
        if key in NEUTRAL:
            if cfg[key] not in NEUTRAL[key]:
                problems.append(
                    f"{key}={cfg[key]!r}: only {NEUTRAL[key][0]!r} is expressible"
                )
            continue
        problems.append(
            f"{key}={cfg[key]!r}: not mapped to the spec (it may change "
            "the forward pass)"
        )
    architectures = cfg.get("architectures") or [
        _default_architecture(model_type, known)
    ]
    if not isinstance(architectures, list) or len(architectures) != 1:
        problems.append(f"architectures={architectures!r}: expected exactly one")
        architectures = [_default_architecture(model_type, known)]
    if problems:
        raise InputError(
            f"{source}: cannot map this config to a spec without changing the model:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    data = {
        "name": name or model_type.replace("_", "-"),
        "architecture": architectures[0],
        "model_type": model_type,
        **data,
        "checkpoint": _family_checkpoint(family, data),
    }
    return _validated(data, source)


def _interval_copy(cfg: dict, used: set[str]) -> list[str]:
    """Qwen3-Next's and Qwen3.5's full_attention_interval, which their classes
    read only to fill an absent layer_types (published configs state both): a
    copy of layer_types is accepted, another value refused."""
    interval, kinds = cfg.get("full_attention_interval"), cfg.get("layer_types")
    if interval is None or not isinstance(kinds, list):
        return []
    expect = (
        [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(len(kinds))
        ]
        if is_int(interval) and interval > 0
        else None
    )
    used.add("full_attention_interval")
    if kinds != expect:
        return [
            f"full_attention_interval={interval!r} disagrees with layer_types "
            f"({_short(kinds)}), which transformers' class reads instead"
        ]
    return []


def _family_checkpoint(family: Family | None, data: dict) -> dict:
    """The checkpoint section a family implies: its layout preset and how it
    stores tensors (a shared expert's fused gate and up where it has one; stacked
    experts, and as gpt-oss stores them where the experts use its clamped
    SwiGLU)."""
    moe = (data.get("mlp") or {}).get("moe") or {}
    out: dict[str, Any] = (
        {"layout": family.layout, **family.checkpoint}
        if family is not None
        else {"layout": "llama"}
    )
    if not moe.get("num_shared_experts") and "fused" in out:
        out["fused"] = [f for f in out["fused"] if f != "shared_gate_up_proj"]
    mtp = data.get("mtp") or {}
    dense = (
        not moe
        or moe.get("first_k_dense")
        or moe.get("layer_frequency", 1) != 1
        or moe.get("dense_layers")
        or mtp.get("mlp") == "dense"
    )
    if not dense and "tensor_names" in out:
        # Every layer MoE (Llama-4 Scout): no dense MLP's names to give.
        out["tensor_names"] = {
            role: path
            for role, path in out["tensor_names"].items()
            if role not in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
        }
    if moe.get("swiglu_limit") is not None and "experts_format" not in out:
        # Where the family does not say, experts with the clamped SwiGLU are
        # stacked as gpt-oss stores them: the one storage vLLM's swigluoai kernel
        # reads (spec rules).
        fused = [f for f in out.get("fused", []) if f != "experts"]
        out.update(fused=[*fused, "experts"], experts_format="gpt_oss")
    return out


@dataclass(frozen=True)
class Wrapper:
    """How a multimodal wrapper's checkpoint stores its language model."""

    # Where the language model's `model.*` tensors are (lm_head stays at the top).
    language_model_prefix: str = "model.language_model"
    # The wrapper's other modules, which a text-only model does not load; for a
    # wrapper outside WRAPPERS the proof finds them (onboard.reference.infer).
    skipped_prefixes: tuple[str, ...] = ()


# Multimodal wrappers whose checkpoint form is verified: config.json nests the
# language model's config under text_config; the vision tower is not part of the
# generated model (text-only serving).
WRAPPERS: dict[str, Wrapper] = {
    "qwen3_5": Wrapper(skipped_prefixes=("model.visual",)),
    "qwen3_5_moe": Wrapper(skipped_prefixes=("model.visual",)),
}


def text_model_type(model_type: str) -> str | None:
    """The model_type of the language model a multimodal wrapper's config class
    nests under ``text_config`` (None: not a wrapper transformers knows)."""
    if not transformers_knows(model_type):
        return None
    sub = getattr(_known(model_type).cls, "sub_configs", None) or {}
    text = sub.get("text_config")
    inner = getattr(text, "model_type", None)
    if text is not None and not inner:
        # A class that nests any language model (Mistral-3's AutoConfig): the one
        # its default config nests.
        try:
            with quiet_transformers():
                inner = _known(model_type).cls().get_text_config().model_type
        except Exception:  # its own validation: no default to take
            return None
    return inner if isinstance(inner, str) and inner else None


def _nests_any(model_type: str) -> bool:
    """Whether ``model_type``'s config class takes any language model as its
    text_config (Mistral-3's), not one family."""
    sub = getattr(_known(model_type).cls, "sub_configs", None) or {}
    text = sub.get("text_config")
    return text is not None and not getattr(text, "model_type", None)


def hf_text_config(config: dict) -> dict:
    """The language model's part of a config.json: ``text_config`` for a
    multimodal wrapper's, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _wrapped_text(
    config: dict, model_type: str, source: str
) -> tuple[str, dict] | None:
    """A multimodal wrapper's (text model type, text_config); None for a config
    without ``text_config``. Refused where the language model is not a family
    onboard proves (:data:`FAMILIES`)."""
    text = config.get("text_config")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InputError(f"{source}: text_config: expected a JSON object")
    inner = text_model_type(model_type)
    stated = text.get("model_type")
    if inner is not None and stated in FAMILIES and _nests_any(model_type):
        inner = stated  # the language model text_config names (Mistral-3's)
    if inner is None:
        what = f" (here {stated!r})" if isinstance(stated, str) else ""
        raise InputError(
            f"{source}: text_config: model_type {model_type!r} nests a language "
            f"model's config{what}, but transformers' class for it does not fix "
            "which family that is; a wrapper is read only where it does, around a "
            "family onboard proves"
        )
    if stated is not None and stated != inner:
        raise InputError(
            f"{source}: text_config.model_type: {stated!r}, but transformers' "
            f"{_known(model_type).cls.__name__} nests a {inner!r} language model"
        )
    if inner not in FAMILIES:
        why = ""
        try:  # what of the language model itself is not expressible, if any
            spec_from_hf_config({**text, "model_type": inner}, source="text_config")
        except InputError as exc:
            why = "; read alone, " + " ".join(str(exc).split())
        raise InputError(
            f"{source}: text_config: model_type {model_type!r} wraps a language "
            f"model of model_type {inner!r}, which is not a family onboard proves "
            f"(docs/hf-mapping.md); a wrapper is read only around one that is{why}"
        )
    if model_type in UNREAD_WRAPPERS:
        raise InputError(
            f"{source}: model_type {model_type!r}: a wrapper of a family onboard "
            f"proves ({inner!r}), but {UNREAD_WRAPPERS[model_type]}; its "
            f"text_config alone, as a {inner!r} config.json, is read and proven"
        )
    return inner, {**text, "model_type": inner}


# Wrappers around a family onboard proves whose checkpoint form is not yet
# expressible, and why.
UNREAD_WRAPPERS: dict[str, str] = {
    "llama4": "its checkpoint keeps the language model's lm_head under the "
    "wrapper (language_model.lm_head beside language_model.model), and "
    "checkpoint.language_model_prefix keeps lm_head at the top",
}


def _wrapper_spec(
    config: dict,
    model_type: str,
    wrapped: tuple[str, dict],
    *,
    name: str | None,
    source: str,
    facts: dict[str, Any] | None,
) -> ModelSpec:
    """The spec of a wrapper's language model alone (text-only): its
    text_config read as the family's, with the wrapper's model type,
    architecture and checkpoint prefixes. The wrapper's other keys configure
    the vision tower and the image and video tokens, which text input never
    reaches."""
    inner, text = wrapped
    top = _normalised(_known(model_type), config, source)
    text_spec = spec_from_hf_config(
        text, name=name, source=f"{source}: text_config", facts=facts
    )
    architectures = config.get("architectures") or [
        _default_wrapper_architecture(model_type)
    ]
    if not isinstance(architectures, list) or len(architectures) != 1:
        raise InputError(
            f"{source}: architectures={architectures!r}: expected exactly one"
        )
    wrapper = WRAPPERS.get(model_type, Wrapper())
    data = text_spec.model_dump(mode="json", exclude_unset=False)
    data.update(
        name=name or model_type.replace("_", "-"),
        architecture=architectures[0],
        model_type=model_type,
        # transformers' wrapper ties its lm_head by its own key, not text_config's.
        tie_word_embeddings=bool(top.get("tie_word_embeddings", False)),
    )
    data["checkpoint"].update(
        language_model_prefix=wrapper.language_model_prefix,
        skipped_prefixes=list(wrapper.skipped_prefixes),
    )
    return _validated(data, source)


def _default_wrapper_architecture(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(
        model_type, _default_architecture(model_type, _known(model_type))
    )


def model_type_of(config: Any, source: str) -> str:
    """``config``'s model_type; InputError when it has none."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"{source}: model_type: required, as a string")
    return model_type


def _contradictions(
    data: dict, as_class: dict, model_type: str, known: _Known
) -> list[str]:
    """Fields where the config's keys say one thing and the class does another."""
    out = []
    ours_all, theirs_all = (
        _flatten(_kinds_listed(data)),
        _flatten(_kinds_listed(as_class)),
    )
    for path, ours in ours_all.items():
        if path.startswith("mtp."):
            continue  # no transformers class computes MTP heads (not proven)
        theirs = theirs_all.get(path)
        if ours != theirs:
            out.append(
                f"{path}: the config says {ours!r}, but transformers' "
                f"{known.cls.__name__} ({model_type}) computes {theirs!r} (vLLM may "
                "read either; fix the config)"
            )
    return out


def _kinds_listed(data: dict) -> dict:
    """``data`` with its sliding layers as a per-layer list, however the config
    placed them (Gemma-3's class derives layer_types from a sliding_window_pattern
    key it does not declare)."""
    att = data.get("attention")
    n = data.get("num_hidden_layers")
    if not isinstance(att, dict) or att.get("sliding_window") is None:
        return data
    if not isinstance(n, int) or "sliding_window_pattern" not in att:
        return data
    att = {k: v for k, v in att.items() if k != "sliding_window_pattern"}
    att["layer_types"] = _layer_kinds(data["attention"], n)
    return {**data, "attention": att}


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def _validated(data: dict, source: str) -> ModelSpec:
    try:
        spec = ModelSpec.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"  - {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        ]
        raise InputError(
            f"{source}: the inferred spec is invalid:\n" + "\n".join(lines)
        ) from None
    problems = check_rules(spec)
    if problems:
        lines = [f"  - {'.'.join(map(str, p))}: {m}" for p, m in problems]
        raise InputError(
            f"{source}: the inferred spec breaks spec rules:\n" + "\n".join(lines)
        )
    return spec


def spec_from_hf_config_file(path: Path, name: str | None = None) -> ModelSpec:
    """Infer a spec from ``config.json`` or a directory that contains one."""
    config, source = read_hf_config(path)
    return spec_from_hf_config(config, name=name, source=source)


def read_hf_config(path: Path) -> tuple[Any, str]:
    """The parsed ``config.json`` (or a directory's), and its path for messages."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    return config, str(path)


# ---- writing a config --------------------------------------------------------------


def _concepts(spec: ModelSpec) -> dict[str, Any]:
    """The spec as HF concepts (canonical keys), in config.json order."""
    att, moe = spec.attention, spec.mlp.moe
    c: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "max_position_embeddings": spec.max_position_embeddings,
        **_component_concepts(spec, "dims"),
        **_component_concepts(spec, "norm"),
        "num_attention_heads": att.num_heads,
    }
    # The model-wide components' (Gemma's and Granite's factors, the head's
    # tie, MTP's heads), each where not neutral.
    c.update(_component_concepts(spec, "model"))
    rope = _rope_params(spec, spec.rope.theta, spec.rope.scaling)
    sliding_rope = spec.rope.sliding and _rope_params(
        spec, spec.rope.sliding.theta, spec.rope.sliding.scaling
    )
    if att.type == "mla":
        mla = att.mla
        c.update(
            num_key_value_heads=att.num_heads,
            head_dim=mla.qk_rope_head_dim,
            q_lora_rank=mla.q_lora_rank,
            kv_lora_rank=mla.kv_lora_rank,
            qk_nope_head_dim=mla.qk_nope_head_dim,
            qk_rope_head_dim=mla.qk_rope_head_dim,
            v_head_dim=mla.v_head_dim,
        )
        if spec.model_type in MLA_WHOLE_HEAD:
            whole = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            c["head_dim"] = whole
            rope["partial_rotary_factor"] = mla.qk_rope_head_dim / whole
        if mla.latent_norm_eps is not None:
            c["mla_norm_eps"] = mla.latent_norm_eps
        c.update(_component_concepts(spec, "attention"))
        if att.layer_types is not None:
            c["layer_types"] = spec.layer_attention_types()
    else:
        c.update(
            num_key_value_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            qkv_bias=att.qkv_bias,
            o_bias=att.o_bias,
        )
        c.update(_component_concepts(spec, "attention"))
        if att.partial_rotary_factor != 1.0:
            c["partial_rotary_factor"] = att.partial_rotary_factor
            for params in (rope, sliding_rope or {}):
                params["partial_rotary_factor"] = att.partial_rotary_factor
        sliding = att.sliding_window is not None
        c.update(sliding_window=att.sliding_window, use_sliding_window=sliding)
        c["layer_types"] = spec.layer_attention_types()
        if att.chunk_size is not None:
            # Llama-4's: the rope layers attend within chunks.
            c["layer_types"] = [
                "chunked_attention" if spec.uses_rope(i) else kind
                for i, kind in enumerate(c["layer_types"])
            ]
        if att.sliding_window_pattern is not None:
            c["sliding_window_pattern"] = att.sliding_window_pattern
    # Per layer type where the sliding layers rotate otherwise (Gemma-3's keys).
    c["rope_parameters"] = (
        {"sliding_attention": sliding_rope, "full_attention": rope}
        if sliding_rope
        else rope
    )
    if att.llama_4_scaling is not None:
        # Mistral-4's keys: yarn's original_max_position_embeddings, if any, is
        # the same (the spec rules).
        rope["llama_4_scaling_beta"] = att.llama_4_scaling.beta
        rope["original_max_position_embeddings"] = (
            att.llama_4_scaling.original_max_position_embeddings
        )
    c["rope_interleave"] = spec.rope.interleaved
    c.update(_component_concepts(spec, "mixers"))
    if spec.rope.nope_layers:
        c["no_rope_layers"] = [
            int(spec.uses_rope(i)) for i in range(spec.num_hidden_layers)
        ]
    c["intermediate_size"] = spec.mlp.intermediate_size
    if moe is not None:
        c.update(
            n_routed_experts=moe.num_experts,
            num_experts_per_tok=moe.num_experts_per_tok,
            moe_intermediate_size=moe.expert_intermediate_size,
            n_shared_experts=moe.num_shared_experts,
            shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
            shared_expert_gate=moe.shared_expert_gate,
            first_k_dense_replace=moe.first_k_dense,
            decoder_sparse_step=moe.layer_frequency,
            mlp_only_layers=list(moe.dense_layers),
        )
        c.update(_component_concepts(spec, "moe"))
        # Written only where set, so configs of specs without them are unchanged.
        if moe.expert_bias:
            c["moe_expert_bias"] = True
        if moe.swiglu_limit is not None:
            c.update(swiglu_alpha=moe.swiglu_alpha, swiglu_limit=moe.swiglu_limit)
    c.update(_component_concepts(spec, "other"))
    # vLLM's DeepSeek classes read it; written without MTP heads too.
    c.setdefault("num_nextn_predict_layers", 0)
    return c


def _component_concepts(spec: ModelSpec, part: str) -> dict[str, Any]:
    """The config of the components ``spec`` has, by where config.json lists
    them (:attr:`Component.config_place`)."""
    out: dict[str, Any] = {}
    for component in components.present(spec):
        if component.config_place == part:
            out.update(component.config(spec))
    return out


def _rope_params(
    spec: ModelSpec, theta: float, scaling: RopeScaling | None
) -> dict[str, Any]:
    """One rope as config.json's ``rope_parameters`` states it."""
    rope: dict[str, Any] = {
        "rope_type": scaling.type if scaling else "default",
        "rope_theta": theta,
    }
    if scaling:
        rope.update(scaling.model_dump(exclude={"type"}, exclude_none=True))
        if rope.get("truncate") is True:
            del rope["truncate"]  # yarn's default: written only when false
        if rope["rope_type"] in ("yarn", "llama3", "longrope"):
            # transformers fills it in and vLLM's get_rope needs it: be explicit.
            rope.setdefault(
                "original_max_position_embeddings", _original_max(spec, scaling)
            )
    return rope


# ---- renamed families (onboard.spec.bases) ----------------------------------------


def find_base(spec: ModelSpec) -> BaseMatch | None:
    """The family vLLM and transformers ship that ``spec`` is a renamed copy of,
    or None (see onboard.spec.bases)."""
    return _find_base(spec.model_dump_json())


@cache
def _find_base(spec_json: str) -> BaseMatch | None:
    spec = ModelSpec.model_validate_json(spec_json)
    if transformers_knows(spec.model_type):
        return None  # the family itself (or a type transformers already has)
    if spec.checkpoint.language_model_prefix is not None:
        return None
    if spec.architecture in FAMILY_CLASSES:
        return None  # its modular file would subclass its own name
    scaling = spec.rope.scaling
    if scaling is not None and scaling.type == "longrope":
        if scaling.attention_factor is not None or scaling.factor is not None:
            # vLLM's in-tree classes hand rope_parameters to get_rope as they
            # are, and its LongRoPE derives the factor on cos and sin from
            # max_position_embeddings alone: the generated model passes it.
            return None
    # A family the spec is exactly comes before one it differs from in
    # components bridged at load.
    for bridge in (False, True):
        for base in BASES:
            match = _match(spec, base, bridge)
            if match is not None:
                return match
    return None


def _match(spec: ModelSpec, base: Base, bridge: bool) -> BaseMatch | None:
    """``spec`` as ``base`` under a new name; ``bridge``: with the components that
    can be bridged at load stated the family's way (at least one)."""
    from onboard.spec.module_tree import used_roles

    data = spec.model_dump(mode="json")
    data.update(model_type=base.model_type, architecture=base.architecture)
    deltas: tuple[Delta, ...] = ()
    if bridge:
        # All at once: no two families of BASES differ from a spec in different
        # bridgeable components yet.
        offered = (c.family_delta(data) for c in components.every())
        deltas = tuple(d for d in offered if d is not None)
        if not deltas:
            return None
    heads = spec.mtp
    if heads is not None and base.mtp_architecture is None:
        return None
    if heads is not None and base.mtp_paths:
        # The family's draft reads one head, of the family's first layer's MLP
        # (its block is the family's decoder layer at index 0).
        if heads.num_heads != 1 or (heads.mlp == "moe") != spec.is_moe_layer(0):
            return None
        data["mtp"] = None
        data["speculators"] = [s for s in data["speculators"] if s["method"] != "mtp"]
    stored = _family_checkpoint(FAMILIES[base.model_type], data)
    checkpoint = data["checkpoint"]
    # Stacked or fused tensors, their storage and the router bias's shape must be
    # the family's: a rename cannot split or reshape a tensor.
    fused = sorted(checkpoint["fused"])
    if fused != sorted(stored.get("fused", [])):
        return None
    if "experts" in fused and checkpoint["experts_format"] != stored.get(
        "experts_format", "linear"
    ):
        return None
    if checkpoint["router_bias_2d"] != stored.get("router_bias_2d", False):
        return None
    checkpoint.update(
        layout=stored["layout"], tensor_names=stored.get("tensor_names", {})
    )
    try:
        as_base = ModelSpec.model_validate(data)
        with quiet_transformers():
            # The family computes the spec: written as its config, it reads back.
            # The new type's config.json is that config (hf_config_from_spec).
            hf_config_from_spec(as_base)
    except (InputError, ValueError):
        return None
    renames = {
        role: (spec.tensor_path(role), as_base.tensor_path(role))
        for role in used_roles(spec)
        if spec.tensor_path(role) != as_base.tensor_path(role)
    }
    if spec.mtp is not None and renames:
        # The family's MTP loader reads its own names only (the heads' blocks
        # included).
        return None
    return BaseMatch(base, as_base, renames, deltas)


def hf_config_from_spec(spec: ModelSpec) -> dict:
    """The config.json content for a spec.

    A model type transformers knows gets exactly its config class's key names (plus
    the keys vLLM's in-tree model reads, e.g. DeepSeek-V3's ``topk_method``); a new
    model type gets the canonical names of :data:`ALIASES`. Raises InputError when
    the model type's config class cannot express the spec.
    """
    source = f"spec {spec.name!r} (model_type {spec.model_type})"
    if spec.checkpoint.language_model_prefix is not None:
        return _write_wrapper(spec, source)
    # A family outside FAMILIES is written with the Llama naming; the round trip
    # below and the proof or validation against transformers check the result.
    known, family = _family(spec.model_type)
    facts = spec_facts(spec, open_concepts(spec.model_type))
    concepts = _concepts(spec)
    match = find_base(spec) if known is None else None
    if match is not None:
        # A family vLLM ships under a new name: the family's own keys, which its
        # config class (the new type's, onboard.spec.bases) reads, beside the
        # canonical ones (which state what the family implies, e.g. Qwen3-Next's
        # q/k norms); where both name one key, they agree.
        family_cfg = hf_config_from_spec(match.as_base)
        del family_cfg["dtype"]
        cfg = {**concepts, **family_cfg}
        cfg.update(architectures=[spec.architecture], model_type=spec.model_type)
    elif known is None:
        cfg = {
            "architectures": [spec.architecture],
            "model_type": spec.model_type,
            **concepts,
        }
    else:
        cfg = _write_known(spec, concepts, known, family)
    cfg["dtype"] = "bfloat16"
    _check_round_trip(spec, cfg, source, facts)
    return cfg


def _write_wrapper(spec: ModelSpec, source: str) -> dict:
    """A multimodal wrapper's config.json: the language model's config as
    text_config (its own family's keys), the wrapper's vision tower at its
    class's defaults (the generated model does not build it)."""
    inner = text_model_type(spec.model_type)
    if inner is None or inner not in FAMILIES:
        raise InputError(
            f"{source}: checkpoint.language_model_prefix: model_type "
            f"{spec.model_type!r} is not a multimodal wrapper around a family "
            "onboard proves"
        )
    data = spec.model_dump(mode="json")
    data.update(model_type=inner, architecture=_default_architecture(inner, None))
    data["checkpoint"].update(language_model_prefix=None, skipped_prefixes=[])
    text = hf_config_from_spec(ModelSpec.model_validate(data))
    text.pop("architectures", None)
    text.pop("dtype", None)
    cfg = {
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "text_config": text,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "dtype": "bfloat16",
    }
    back = spec_from_hf_config(cfg, name=spec.name, source=source)
    carried = set(_HF_CARRIED)
    if back.model_dump(include=carried) != spec.model_dump(include=carried):
        raise InputError(
            f"{source}: transformers' {_known(spec.model_type).cls.__name__} "
            "cannot express this spec (its config does not read back as the spec)"
        )
    return cfg


def _write_known(
    spec: ModelSpec, concepts: dict, known: _Known, family: Family
) -> dict:
    kwargs: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    if "attention_multiplier" not in concepts and _key_for(
        "attention_multiplier", known
    ):
        # Granite's class defaults it to 1.0: state the default scale.
        concepts = {**concepts, "attention_multiplier": spec.head_dim**-0.5}
    if (
        spec.mlp.moe is not None
        and spec.mlp.moe.num_shared_experts
        and concepts.get("shared_expert_intermediate_size") is None
    ):
        # A class without a shared-expert count takes the total width (Granite's
        # shared_intermediate_size).
        concepts = {
            **concepts,
            "shared_expert_intermediate_size": spec.shared_expert_intermediate_size,
        }
    if (
        spec.mlp.moe is not None
        and not spec.mlp.moe.num_shared_experts
        and _key_for("shared_expert_intermediate_size", known)
    ):
        # No shared expert: width 0 (Qwen2-MoE, Qwen3-Next; their classes take an
        # int, and vLLM's qwen2_moe.py / qwen3_next.py build none at 0).
        concepts = {**concepts, "shared_expert_intermediate_size": 0}
    if spec.mlp.moe is not None and not _key_for("moe_intermediate_size", known):
        # Mixtral-style: the experts' width is intermediate_size.
        concepts = {**concepts, "intermediate_size": concepts["moe_intermediate_size"]}
        if _key_for("intermediate_size_mlp", known):
            # Llama-4: the dense layers' width beside it (unused without one).
            dense = spec.mlp.intermediate_size or spec.mlp.moe.expert_intermediate_size
            concepts = {**concepts, "intermediate_size_mlp": dense}
    if spec.mlp.moe is not None and _key_for("moe_layers", known):
        # Llama-4's class reads the list (it fills it from the step otherwise).
        n = spec.num_hidden_layers
        concepts = {
            **concepts,
            "moe_layers": [i for i in range(n) if spec.is_moe_layer(i)],
        }
    scaling = spec.rope.scaling
    if scaling is not None and _key_for("original_max_position_embeddings", known):
        # Phi-3's class keeps it beside rope_parameters, and its copy wins there.
        concepts = {
            **concepts,
            "original_max_position_embeddings": _original_max(spec, scaling),
        }
    # The class's defaults are Gemma's: state what the spec has instead.
    defaults: dict[str, Any] = {
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    }
    if spec.attention.type == "gqa":
        defaults["query_pre_attn_scalar"] = spec.head_dim
    concepts = {**defaults, **concepts}
    if known.rope_by_kind and not _by_kind(concepts["rope_parameters"]):
        rope = concepts["rope_parameters"]
        concepts = {
            **concepts,
            "rope_parameters": {
                "sliding_attention": dict(rope),
                "full_attention": rope,
            },
        }
    moe = spec.mlp.moe
    if (
        moe is not None
        and moe.first_k_dense
        and not _key_for("first_k_dense_replace", known)
        and _key_for("mlp_only_layers", known)
    ):
        # Qwen-MoE has no first-k key: list those layers as MLP-only instead.
        dense = sorted(set(moe.dense_layers) | set(range(moe.first_k_dense)))
        concepts = {**concepts, "first_k_dense_replace": 0, "mlp_only_layers": dense}
    if moe is not None and _key_for("mlp_layer_types", known):
        n = spec.num_hidden_layers
        concepts = {
            **concepts,
            "mlp_layer_types": [
                "sparse" if spec.is_moe_layer(i) else "dense" for i in range(n)
            ],
        }
    if _key_for("no_rope_layers", known):
        # SmolLM3's class fills an absent list with its own NoPE layers.
        concepts = {
            **concepts,
            "no_rope_layers": [
                int(spec.uses_rope(i)) for i in range(spec.num_hidden_layers)
            ],
        }
    kinds = concepts.get("layer_types") or []
    full = kinds.count("full_attention")
    if spec.attention.sliding_window and kinds == ["full_attention"] * full + [
        "sliding_attention"
    ] * (len(kinds) - full):
        # Qwen2/Qwen3 rule: layers from max_window_layers on slide.
        concepts = {**concepts, "max_window_layers": full}
    if _key_for("logit_scale", known):
        concepts = {**concepts, "logit_scale": spec.logit_scale}  # a class default
    qkv = concepts.get("qkv_bias")
    if qkv is not None and not _key_for("qkv_bias", known):
        # Llama/Qwen3: all four; GLM: q/k/v only (o_proj's from its facts).
        concepts = {**concepts, "attention_bias": qkv}
    means = family.facts.get(KEY_MEANS, {})
    # A concept the spec leaves off, which the class defaults on.
    concepts = {**dict.fromkeys(family.facts.get(WRITTEN_OFF, ()), False), **concepts}
    for concept, value in concepts.items():
        key = next((k for k, c in means.items() if c == concept), None)
        if key is None and _key_for(concept, known) not in means:
            key = _key_for(concept, known)
        if key is not None:
            kwargs[key] = value
        elif concept in family.vllm_keys:
            extras[concept] = value
    cfg = _normalised(known, kwargs, f"spec {spec.name!r}")
    for key in _NOISE:
        cfg.pop(key, None)
    cfg.update(extras)
    cfg["architectures"] = [spec.architecture]
    return cfg


def _key_for(concept: str, known: _Known) -> str | None:
    """The key transformers' class declares (or its modeling code reads) for a
    concept, if any."""
    for alias in ALIASES[concept]:
        if alias in known.declared:
            return alias
        if known.attribute_map.get(alias) in known.declared:
            return known.attribute_map[alias]
    for alias in ALIASES[concept]:
        if alias in known.reads:
            return alias
    return None


def _short(value: Any) -> str:
    """A value for a message: a per-layer list of 1,000 entries is not read."""
    return printable(repr(value), 120)


def _check_round_trip(
    spec: ModelSpec, cfg: dict, source: str, facts: dict[str, Any]
) -> None:
    """Refuse a spec whose config would read back as a different model."""
    try:
        back = spec_from_hf_config(cfg, name=spec.name, source=source, facts=facts)
    except InputError as exc:
        raise InputError(
            f"{source}: cannot be written as a {spec.model_type} config.json:\n{exc}"
        ) from None
    ours, theirs = _flatten(hf_fields(spec)), _flatten(hf_fields(back))
    # Both ways: a section the spec leaves out (an MoE) may come back.
    diff = [
        f"  - {path}: the spec says {_short(ours.get(path))}, the "
        f"{spec.model_type} config would give {_short(theirs.get(path))}"
        for path in [*ours, *(p for p in theirs if p not in ours)]
        if ours.get(path) != theirs.get(path)
    ]
    if diff:
        raise InputError(
            f"{source}: transformers' config class for {spec.model_type!r} cannot "
            "express this spec (use a new model_type for a new architecture):\n"
            + "\n".join(diff)
        )


def _original_max(spec: ModelSpec, scaling: RopeScaling | None = None) -> int:
    """yarn / llama3 pre-extension length of ``scaling`` (default: the spec's);
    unset means max_position_embeddings."""
    scaling = scaling or spec.rope.scaling
    if scaling is not None and scaling.original_max_position_embeddings is not None:
        return scaling.original_max_position_embeddings
    return spec.max_position_embeddings


def hf_fields(spec: ModelSpec) -> dict:
    """What a config.json carries of a spec, with redundant spellings resolved.

    Resolved: default kv heads and head_dim, sliding patterns as per-layer kinds, the
    yarn / llama3 pre-extension length (unset: max_position_embeddings),
    the MoE layer placement as a per-layer list, one expert group as no groups, the
    shared experts' total width, the dense width only where a layer is dense, an
    unset query_pre_attn_scalar as the head_dim, and a sliding layers' rope equal
    to the full layers' (or with no sliding layer) as none.
    """
    data = spec.model_dump(mode="json", include=set(_HF_CARRIED))
    rope = data["rope"]
    for part, scaling in (
        (rope, spec.rope.scaling),
        (rope["sliding"], spec.rope.sliding and spec.rope.sliding.scaling),
    ):
        if scaling is not None and scaling.type != "linear":
            part["scaling"]["original_max_position_embeddings"] = _original_max(
                spec, scaling
            )
        if scaling is not None and scaling.truncate is True:
            part["scaling"]["truncate"] = None  # yarn's default
    if rope["sliding"] is not None and (
        rope["sliding"] == {"theta": rope["theta"], "scaling": rope["scaling"]}
        or "sliding_attention" not in spec.layer_attention_types()
    ):
        rope["sliding"] = None  # every layer rotates alike
    att = data["attention"]
    if spec.attention.type == "gqa":
        att.update(num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
        if att["query_pre_attn_scalar"] is None:
            att["query_pre_attn_scalar"] = spec.head_dim
        att["softmax_scale"] = att["softmax_scale"] or spec.head_dim**-0.5
    att["layer_types"] = spec.layer_attention_types()
    att.pop("sliding_window_pattern")
    moe = data["mlp"]["moe"]
    n = spec.num_hidden_layers
    if moe is not None:
        moe["moe_layers"] = [spec.is_moe_layer(i) for i in range(n)]
        for key in ("first_k_dense", "layer_frequency", "dense_layers"):
            moe.pop(key)
        moe["shared_expert_intermediate_size"] = spec.shared_expert_intermediate_size
        router = moe["router"]
        if router["num_groups"] == 1 and router["topk_groups"] == 1:
            router["num_groups"] = router["topk_groups"] = None
    needs_dense = not all(spec.is_moe_layer(i) for i in range(n)) or (
        spec.mtp is not None and spec.mtp.mlp == "dense"
    )
    if not needs_dense:
        data["mlp"]["intermediate_size"] = None
    return data
