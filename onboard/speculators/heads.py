"""Speculators-format configs of draft heads (EAGLE-3, P-EAGLE, DFlash, DFlash2,
DSpark) from a spec.

The ``config.json`` of a draft head is built with the ``speculators`` package's own
config classes (``Eagle3SpeculatorConfig``, ``PEagleSpeculatorConfig``,
``DFlashSpeculatorConfig``, ``DFlash2SpeculatorConfig``,
``DSparkSpeculatorConfig``), so it is exactly what ``speculators train`` writes and
what vLLM's ``SpeculatorsConfig`` reads. Sizes come from the spec (see
:func:`head_layer` and :func:`aux_layer_ids`); docs/speculators.md has the rules.
"""

from __future__ import annotations

from typing import Any

from onboard.errors import InputError
from onboard.runtime.cpu_draft import HEAD_DIM
from onboard.spec.model import ModelSpec

HEAD_METHODS = ("eagle3", "p_eagle", "dflash", "dflash2", "dspark")
# speculators' defaults (speculators/train/config/schema.py): one decoder layer for
# EAGLE-3 and P-EAGLE, five for the DFlash family; DFlash blocks of 16, DSpark
# blocks of 8.
NUM_LAYERS = {"eagle3": 1, "p_eagle": 1, "dflash": 5, "dflash2": 5, "dspark": 5}
# The EAGLE family (a Llama layer reading [embedding, fc(states)]); the others are
# the DFlash family (Qwen3 layers).
EAGLE_METHODS = ("eagle3", "p_eagle")
# speculators' name of each head (its `speculators_model_type`), where it differs.
SPECULATORS_TYPE = {"p_eagle": "peagle"}


def speculators_type(method: str) -> str:
    return SPECULATORS_TYPE.get(method, method)


def mask_token_id(spec: ModelSpec) -> int:
    """The reserved id of the parallel drafters' mask slots: the last id, unused
    in the bundled tokenizers (set it to the tokenizer's mask token)."""
    return spec.vocab_size - 1


# EAGLE-3's reduced draft vocabulary (the published EAGLE-3 heads use 32k).
DRAFT_VOCAB = 32000


def aux_layer_ids(num_layers: int) -> list[int]:
    """Verifier layers whose hidden states feed the head (vLLM's numbering: id i is
    the input of decoder layer i, id ``num_layers`` the last layer's output before
    the final norm).

    vLLM's and speculators' default is (2, n // 2, n - 3); a model too shallow for
    it takes the first layer's output, the middle and the last. Id 0 (the
    embeddings) is never used: vLLM 0.32's in-tree DeepSeek-V2/V3 model adds a
    residual that does not exist yet at layer 0.
    """
    if num_layers >= 7:  # three distinct ids
        return [2, num_layers // 2, num_layers - 3]
    return sorted({1, max(1, num_layers // 2), num_layers})


def draft_vocab_size(spec: ModelSpec) -> int:
    return min(DRAFT_VOCAB, spec.vocab_size)


def head_layer(
    spec: ModelSpec,
    method: str,
    num_kv_heads: int | None = None,
    num_layers: int | None = None,
) -> dict[str, Any]:
    """The head's decoder-layer config (a Llama layer for EAGLE-3, a Qwen3 layer for
    the DFlash family, the two kinds vLLM 0.32 has draft models for).

    Width and vocabulary are the verifier's (the head reads its hidden states and
    embeddings); attention copies the verifier's GQA shape, or uses heads of
    ``HEAD_DIM`` for an MLA verifier (``num_kv_heads`` of them, default up to 8);
    the MLP is the verifier's dense width."""
    att = spec.attention
    if att.type == "gqa":
        heads, kv_heads, head_dim = att.num_heads, spec.num_kv_heads, spec.head_dim
    else:
        head_dim = HEAD_DIM
        heads = max(1, spec.hidden_size // head_dim)
        kv_heads = min(num_kv_heads or 8, heads)
        while heads % kv_heads:
            kv_heads -= 1
    intermediate = spec.mlp.intermediate_size
    if intermediate is None:
        moe = spec.mlp.moe
        assert moe is not None
        intermediate = moe.expert_intermediate_size * moe.num_experts_per_tok
    n_aux = len(aux_layer_ids(spec.num_hidden_layers))
    layer: dict[str, Any] = {
        "model_type": "llama" if method in EAGLE_METHODS else "qwen3",
        "hidden_size": spec.hidden_size,
        "intermediate_size": intermediate,
        "num_hidden_layers": num_layers or NUM_LAYERS[method],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.norm.eps,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        # Plain rope at the verifier's base: the head sees short contexts only.
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope.theta},
        "tie_word_embeddings": False,
        # vLLM 0.32's EAGLE-3 head sizes its fc layer from this field (default 3),
        # not from eagle_aux_hidden_state_layer_ids: say it explicitly.
        "num_aux_hidden_states": n_aux,
    }
    if method in EAGLE_METHODS:
        layer["mlp_bias"] = False
    return layer


def verifier_name(spec: ModelSpec, verifier: str | None) -> str:
    return verifier or spec.base_checkpoint or spec.name


def head_config(
    spec: ModelSpec,
    method: str,
    num_speculative_tokens: int,
    *,
    verifier: str | None = None,
    draft_vocab: int | None = None,
    norm_before_fc: bool = True,
    norm_output: bool = True,
    num_kv_heads: int | None = None,
    num_layers: int | None = None,
) -> dict[str, Any]:
    """The speculators-format config.json of a ``method`` head for ``spec``'s model.

    ``verifier`` is the verifier's Hub id or path (default: the spec's
    base_checkpoint). EAGLE-3 defaults follow ``speculators train`` (norm before the
    fc layer, normed output fed back across steps). ``num_kv_heads``: the head's
    KV heads beside an MLA verifier (see :func:`head_layer`); ``num_layers``:
    the head's decoder layers (default: speculators' default for the method)."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals import GreedyTokenProposalConfig

    if method not in HEAD_METHODS:
        raise InputError(f"{method!r} has no draft head (heads: {HEAD_METHODS})")
    layer_dict = head_layer(spec, method, num_kv_heads, num_layers)
    aux = aux_layer_ids(spec.num_hidden_layers)
    vocab = draft_vocab or draft_vocab_size(spec)
    common = {
        "transformer_layer_config": layer_dict,
        "draft_vocab_size": vocab,
        "target_hidden_size": spec.hidden_size,
        "speculators_config": SpeculatorsConfig(
            algorithm=speculators_type(method),
            proposal_methods=[
                GreedyTokenProposalConfig(speculative_tokens=num_speculative_tokens)
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig(
                name_or_path=verifier_name(spec, verifier),
                architectures=[spec.architecture],
            ),
        ),
    }
    if method in EAGLE_METHODS:
        from speculators import Eagle3SpeculatorConfig, PEagleSpeculatorConfig

        eagle = {
            "eagle_aux_hidden_state_layer_ids": aux,
            "norm_before_residual": False,
            "norm_before_fc": norm_before_fc,
            "norm_output": norm_output,
        }
        if method == "eagle3":
            config = Eagle3SpeculatorConfig(**common, **eagle)
        else:
            # vLLM fills the k - 1 slots after the bonus token with this token and
            # the head's learned `mask_hidden` (its `pard_token`, algos.py:83).
            config = PEagleSpeculatorConfig(
                **common, **eagle, mask_token_id=mask_token_id(spec)
            )
    else:
        from speculators import (
            DFlash2SpeculatorConfig,
            DFlashSpeculatorConfig,
            DSparkSpeculatorConfig,
        )

        cls = {
            "dflash": DFlashSpeculatorConfig,
            "dflash2": DFlash2SpeculatorConfig,
            "dspark": DSparkSpeculatorConfig,
        }[method]
        # DFlash predicts block_size - 1 tokens after the anchor; DSpark samples
        # from the anchor too, so its block is the draft length itself.
        block = num_speculative_tokens + (0 if method == "dspark" else 1)
        config = cls(
            **common,
            aux_hidden_state_layer_ids=aux,
            block_size=block,
            mask_token_id=mask_token_id(spec),
        )
    return config.to_dict()


def load_head_config(data: dict[str, Any]):
    """Parse a speculators-format config.json with speculators' own classes."""
    from speculators import SpeculatorModelConfig

    return SpeculatorModelConfig.from_dict(data)
