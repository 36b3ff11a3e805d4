"""The families vLLM ships that a new architecture can be built on.

A new model type whose model equals one of these families, layer for layer, needs
no model code of its own: its vLLM file subclasses the family's class and maps the
checkpoint's tensor names onto the family's (as vLLM's ``mistral_large_3.py``
builds on DeepSeek-V3), and its reference subclasses transformers' class in the
style of transformers' ``modular_*.py`` files, and its config class is the
family's. :func:`onboard.spec.hf.find_base` decides, by writing the spec as the
family's own config.json and reading it back: where transformers' class of the
family reads back exactly the spec, the family computes the spec's model (the
same proof onboard runs for every family it knows); and the family's config class
must read the config.json onboard writes for the new model type as the spec.
Everything else about the checkpoint must be stored the family's way too, except
the tensor names: stacked or fused tensors and MTP heads are not renamed.

A spec may also differ from a family in a component that can be bridged where the
weights load (:class:`Delta`, offered by the component's ``family_delta``): a
model whose RMSNorms scale by ``weight`` is Qwen3-Next, whose norms scale by
``1 + weight``, once each norm weight is loaded less one. The subclasses then
convert those tensors too.

tests/test_modular.py checks every entry against the installed vLLM's registry and
transformers' auto classes.
"""

from __future__ import annotations

from dataclasses import dataclass

from onboard.components.base import Delta
from onboard.spec.model import ModelSpec

__all__ = ["BASES", "FAMILY_CLASSES", "Base", "BaseMatch", "Delta", "bridged"]


@dataclass(frozen=True)
class Base:
    """One family vLLM serves with a model file of its own."""

    model_type: str  # transformers' model type (onboard.spec.hf.FAMILIES)
    architecture: str  # the class vLLM registers (and transformers names)
    vllm_module: str  # under vllm.model_executor.models
    config_class: str  # transformers' config class
    # The architecture vLLM drafts MTP heads of this family with, if any, and
    # the module (under vllm.model_executor.models) and class its registry maps
    # that architecture to (which a generated draft subclasses).
    mtp_architecture: str | None = None
    mtp_module: str | None = None
    mtp_class: str | None = None
    # Where that draft reads an MTP head, where not where onboard's spec stores
    # it (DeepSeek-V3's layout, decoder layer num_hidden_layers + i): role ->
    # the family's module path ("" for the head's decoder block, None for a
    # tensor the draft takes from the model). Such a draft reads one head, and
    # the generated draft subclasses it to rename the tensors; the family's
    # config states no heads, so the proof is of the model without them.
    mtp_paths: tuple[tuple[str, str | None], ...] = ()
    # vLLM's class has an hf_to_vllm_mapper of its own (for its checkpoints'
    # names), which a subclass's renames come before.
    mapper: bool = True

    @property
    def vllm_import(self) -> str:
        return f"vllm.model_executor.models.{self.vllm_module}"


# In order of preference: the first family that reads back as the spec wins (a
# plain Llama block also reads back as Mistral's).
BASES: tuple[Base, ...] = (
    Base("llama", "LlamaForCausalLM", "llama", "LlamaConfig"),
    Base("qwen2", "Qwen2ForCausalLM", "qwen2", "Qwen2Config"),
    Base("qwen3", "Qwen3ForCausalLM", "qwen3", "Qwen3Config"),
    Base("mixtral", "MixtralForCausalLM", "mixtral", "MixtralConfig"),
    Base("qwen2_moe", "Qwen2MoeForCausalLM", "qwen2_moe", "Qwen2MoeConfig"),
    Base("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3MoeConfig"),
    Base(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        "deepseek_v2",
        "DeepseekV3Config",
        mtp_architecture="DeepSeekMTPModel",
        mtp_module="deepseek_mtp",
        mtp_class="DeepSeekMTP",
        mapper=False,
    ),
    Base("gpt_oss", "GptOssForCausalLM", "gpt_oss", "GptOssConfig"),
    Base(
        "qwen3_next",
        "Qwen3NextForCausalLM",
        "qwen3_next",
        "Qwen3NextConfig",
        mtp_architecture="Qwen3NextMTP",
        mtp_module="qwen3_next_mtp",
        mtp_class="Qwen3NextMTP",
        # vllm/model_executor/models/qwen3_next_mtp.py: mtp.fc over
        # [pre_fc_norm_embedding(embed), pre_fc_norm_hidden(hidden)], the block
        # mtp.layers.0, then mtp.norm and the model's lm_head.
        mtp_paths=(
            ("mtp_enorm", "mtp.pre_fc_norm_embedding"),
            ("mtp_hnorm", "mtp.pre_fc_norm_hidden"),
            ("mtp_eh_proj", "mtp.fc"),
            ("mtp_head_norm", "mtp.norm"),
            ("mtp_head", None),
            ("", "mtp.layers.0"),
        ),
    ),
)


# The classes a modular file imports: no spec subclassing them may take their name.
FAMILY_CLASSES = frozenset(
    name
    for base in BASES
    for name in (base.architecture, base.config_class, base.mtp_architecture)
    if name is not None
)


@dataclass(frozen=True)
class BaseMatch:
    """A spec that is ``base`` under a new name."""

    base: Base
    # The spec as the family itself would state it (its model type, class and
    # checkpoint naming): what the family's classes are proven against.
    as_base: ModelSpec
    # role -> (the checkpoint's module path, the family's), for the roles whose
    # names differ.
    renames: dict[str, tuple[str, str]]
    # The components bridged at load (empty for a family under a new name).
    deltas: tuple[Delta, ...] = ()


def bridged(spec: ModelSpec, match: BaseMatch) -> list[tuple[Delta, list[str]]]:
    """Each delta of ``match`` with the roles it converts that ``spec``'s
    checkpoint has (none: left out)."""
    from onboard.spec.module_tree import used_roles

    used = used_roles(spec)
    out = []
    for delta in match.deltas:
        roles = [role for role in delta.roles if role in used]
        if roles:
            out.append((delta, roles))
    return out
