"""The MTP draft model on vLLM 0.32: how it is selected, and which heads vLLM runs.

``onboard generate`` writes ``<module_name>_mtp.py`` next to the model file for a
spec with MTP heads (``templates/components/mtp/vllm.py.j2``): the MTP classes
only, each head's block being the model file's decoder layer, imported with
``from .<module_name> import ...`` (as vLLM's deepseek_mtp.py imports
deepseek_v2.py). vLLM builds the draft of
``speculative_config={"method": "mtp", ...}`` from the target's own config.json,
rewritten by ``SpeculativeConfig.hf_config_override`` (vllm/config/speculative.py):
that function maps a fixed list of model types to an MTP model type and draft
architecture (``deepseek_v3`` -> ``deepseek_mtp`` / ``DeepSeekMTPModel``), and the
architecture is then looked up in the model registry. So:

* a model type vLLM maps: the plugin registers the generated class under the
  architecture vLLM looks up (it replaces vLLM's in-tree MTP class while
  installed);
* a new model type: vLLM leaves its config as it is and refuses method "mtp"
  ("Unsupported speculative method") because the draft's model type is not one
  of its ``MTPModelTypes``. The plugin's ``register()`` therefore wraps
  ``SpeculativeConfig.hf_config_override`` (idempotently, in every process) to
  give such a config the generic MTP model type ``"mtp"``, ``n_predict`` and the
  draft architecture ``<Prefix>MTPModel``. The in-tree change is in
  :func:`in_tree_change`.
"""

from __future__ import annotations

from dataclasses import dataclass

from onboard.spec.model import ModelSpec

# model_type -> draft architecture that vLLM 0.32's hf_config_override gives a
# method="mtp" draft of that model type, for the DeepSeek-style MTP layout the
# generated class implements (enorm / hnorm / eh_proj / shared_head).
# tests/test_mtp_codegen.py checks this against the installed vLLM.
VLLM_MTP_ARCHITECTURES = {"deepseek_v3": "DeepSeekMTPModel"}

# Draft architectures whose forward vLLM's proposer unpacks as (hidden states for
# the logits, hidden states for the next draft step)
# (SpecDecodeBaseProposer.model_returns_tuple in
# vllm/v1/spec_decode/llm_base_proposer.py); any other MTP draft returns one
# tensor that serves both. Checked against vLLM by tests/test_mtp_codegen.py.
TUPLE_ARCHITECTURES = frozenset(
    {"DeepSeekMTPModel", "DeepseekV32MTPModel", "Glm5NextMTPModel", "KimiK3MTPModel"}
)

# The generic entry of vLLM's MTPModelTypes, given to the draft config of a new
# model type (vLLM keys nothing else on it).
GENERIC_MTP_MODEL_TYPE = "mtp"


@dataclass(frozen=True)
class MTPDraft:
    architecture: str  # the name vLLM looks up in its model registry
    # The generated class; None where the draft is vLLM's own class (a renamed
    # copy of a family vLLM ships, onboard.spec.bases).
    class_name: str | None
    override: bool  # the plugin extends hf_config_override for this model type
    returns_tuple: bool  # forward returns (logits hidden, next-step hidden)


def mtp_draft(spec: ModelSpec, standalone: bool = False) -> MTPDraft:
    """The draft of ``spec``'s MTP heads; ``standalone``: as the generated
    standalone model file has it, even where a family vLLM ships is the base."""
    from onboard.spec.hf import find_base
    from onboard.spec.model import class_prefix

    prefix = class_prefix(spec.architecture)
    base = None if standalone else find_base(spec)
    family_draft = base.base.mtp_architecture if base is not None else None
    if base is not None and family_draft is not None:
        # A subclass of the family's draft where it would not read this
        # checkpoint's heads as they are; else the family's draft itself.
        own = bool(base.deltas or base.base.mtp_paths)
        return MTPDraft(
            architecture=f"{prefix}MTPModel" if own else family_draft,
            class_name=f"{prefix}MTP" if own else None,
            override=True,
            returns_tuple=family_draft in TUPLE_ARCHITECTURES,
        )
    known = VLLM_MTP_ARCHITECTURES.get(spec.model_type)
    architecture = known or f"{prefix}MTPModel"
    return MTPDraft(
        architecture=architecture,
        class_name=f"{prefix}MTP",
        override=known is None,
        returns_tuple=architecture in TUPLE_ARCHITECTURES,
    )


def mtp_module_name(spec: ModelSpec) -> str:
    return f"{spec.module_name}_mtp"


def mtp_class_path(spec: ModelSpec) -> str:
    """What the plugin registers for the draft: ``package.module:Class``."""
    from onboard.spec.naming import package_name

    draft = mtp_draft(spec, standalone=True)
    return f"{package_name(spec)}.{mtp_module_name(spec)}:{draft.class_name}"


def speculative_config(spec: ModelSpec, k: int | None = None) -> dict:
    """The ``speculative_config`` that runs the generated MTP draft (plugin
    installed): no ``model`` (the heads are in the target checkpoint)."""
    if spec.mtp is None:
        raise ValueError(f"{spec.name}: the spec has no MTP heads")
    return {"method": "mtp", "num_speculative_tokens": k or spec.mtp.num_heads}


# Measured on vLLM 0.32's CPU engine (tests/test_mtp_codegen.py counts the calls
# of each head's module during generation): every draft step runs head 0.
HEAD_SELECTION_EVIDENCE = (
    "vLLM 0.32's V1 proposer (SpecDecodeBaseProposer.propose in "
    "vllm/v1/spec_decode/llm_base_proposer.py, used by the CPU model runner "
    "through GPUModelRunner's EagleProposer) calls the draft model and its "
    "compute_logits without spec_step_idx at every draft step, so the MTP "
    "model's default spec_step_idx=0 selects head 0 each time (vLLM warns: "
    '"Enabling num_speculative_tokens > 1 will run multiple times of forward on '
    'same MTP layer"). Only the model runner V2 (vllm/v1/worker/gpu/spec_decode/'
    "multi_module_mtp) passes spec_step_idx; the CPU engine does not use it."
)


def heads_run_by_vllm(spec: ModelSpec, k: int) -> list[int]:
    """The MTP head vLLM 0.32's CPU engine runs at each of ``k`` draft steps
    (see :data:`HEAD_SELECTION_EVIDENCE`): head 0 at every step."""
    if spec.mtp is None:
        raise ValueError(f"{spec.name}: the spec has no MTP heads")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return [0] * k


def in_tree_change(spec: ModelSpec, standalone: bool = False) -> list[str]:
    """What vLLM itself needs so that method "mtp" selects the draft of a new
    model type without the plugin's override (empty for a type vLLM maps)."""
    draft = mtp_draft(spec, standalone)
    if not draft.override:
        return []
    mtp_type = f"{spec.model_type}_mtp"
    registry = (
        []
        if draft.class_name is None
        else [
            "vllm/model_executor/models/registry.py: _SPECULATIVE_DECODING_MODELS["
            f'"{draft.architecture}"] = ("{spec.module_name}_mtp", '
            f'"{draft.class_name}").'
        ]
    )
    return [
        f'vllm/config/speculative.py: add "{mtp_type}" to MTPModelTypes.',
        "vllm/config/speculative.py: SpeculativeConfig.hf_config_override: "
        f'model_type "{spec.model_type}" -> "{mtp_type}", update n_predict = '
        f'num_nextn_predict_layers and architectures = ["{draft.architecture}"].',
        *registry,
    ]
