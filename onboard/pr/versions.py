"""The vLLM version the PR tree targets, and what changed in vLLM's APIs.

``PINNED_VLLM`` is the one place the target version is written: the generated
model imports (templates/vllm) and the registry edits (:mod:`onboard.pr.edits`)
are written against it, ``onboard pr apply`` refuses any other tree, and the
``vllm/`` part of ``changes.patch`` is computed from the installed vLLM, which
must be this version. Moving to a new vLLM means: bump ``PINNED_VLLM``, add the
rows of ``API_CHANGES`` that the new version brings, update the templates they
name, and regenerate the goldens; each of those is a reviewable diff.
"""

from __future__ import annotations

from dataclasses import dataclass

PINNED_VLLM = "0.32.0"

# Versions whose APIs the table below describes (oldest first).
KNOWN_VERSIONS = ("0.11.0", "0.14.0", "0.32.0")


@dataclass(frozen=True)
class ApiChange:
    version: str  # first vLLM version with the new API
    area: str
    before: str
    after: str
    used_by: str  # what in the generated code depends on it


# Each row was read from the vLLM sources of both versions (the "after" side from
# the installed 0.32.0: vllm/model_executor/layers/fused_moe/__init__.py,
# registry.py, transformers_utils/).
API_CHANGES: tuple[ApiChange, ...] = (
    ApiChange(
        "0.32.0",
        "fused MoE layer",
        "`from vllm.model_executor.layers.fused_moe import FusedMoE`; "
        "`FusedMoE(num_experts, top_k, hidden_size, intermediate_size, "
        "renormalize, ...)` built in the model, router a `ReplicatedLinear` gate "
        "called before the experts",
        "`from vllm.model_executor.layers.fused_moe import FusedMoEFactory, "
        "GateLinear`; the factory returns a `MoERunner` that owns the "
        "`GateLinear` router and the shared experts (`SharedExperts`); "
        "`FusedMoE` is no longer exported",
        "templates/vllm/components/moe.py.j2",
    ),
    ApiChange(
        "0.32.0",
        "shared experts",
        "`SharedFusedMoE(shared_experts=..., ...)` from "
        "`vllm.model_executor.layers.fused_moe.shared_fused_moe`",
        "shared experts handed to `FusedMoEFactory` and run by the `MoERunner` "
        "(`vllm.model_executor.layers.fused_moe.runner.shared_experts`)",
        "templates/vllm/components/moe.py.j2",
    ),
    ApiChange(
        "0.32.0",
        "expert weight loading",
        "`FusedMoE.make_expert_params_mapping(...)` + per-expert "
        "`weight_loader` calls in the model's `load_weights`",
        "`MoERunner.load_weights` (`fused_moe_make_expert_params_mapping` "
        "for models that still map by hand)",
        "templates/vllm/components/causal_lm.py.j2",
    ),
    ApiChange(
        "0.14.0",
        "rope arguments",
        "`get_rope(head_size, rotary_dim, max_position, base, rope_scaling)`",
        "`get_rope(..., rope_parameters=config.rope_parameters)` (theta, "
        "scaling and partial rotary factor in one dict)",
        "templates/vllm/components/attention_gqa.py.j2",
    ),
    ApiChange(
        "0.14.0",
        "attention layer import",
        "`from vllm.attention import Attention`",
        "`from vllm.model_executor.layers.attention import Attention`",
        "templates/vllm/components/attention_gqa.py.j2",
    ),
    ApiChange(
        "0.32.0",
        "MLA model types",
        "`ModelConfig.is_deepseek_mla` in vllm/config/model.py",
        "`ModelArchConfigConvertorBase.is_deepseek_mla` in "
        "vllm/transformers_utils/model_arch_config_convertor.py",
        "onboard/pr/edits.py (mla_model_type)",
    ),
    ApiChange(
        "0.32.0",
        "config classes of new model types",
        "`_CONFIG_REGISTRY` in vllm/transformers_utils/config.py imports each "
        "class from vllm.transformers_utils.configs",
        "`_CONFIG_REGISTRY` is a `LazyConfigDict` of class *names*, resolved "
        "through `_CLASS_TO_MODULE` in vllm/transformers_utils/configs/__init__.py",
        "onboard/pr/edits.py (config_registry, configs_export)",
    ),
)


def api_changes_markdown() -> str:
    """The table, as docs/pr.md and PR.md show it."""
    rows = [
        "| since | area | before | now | used by |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| {c.version} | {c.area} | {c.before} | {c.after} | {c.used_by} |"
        for c in API_CHANGES
    ]
    return "\n".join(rows) + "\n"
