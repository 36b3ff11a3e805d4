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

# The versions the table below compares: the pinned one, and the older 0.x
# releases whose model files used the "before" APIs (vLLM's model sources of the
# 0.11 line import SharedFusedMoE from vllm.model_executor.layers.shared_fused_moe).
KNOWN_VERSIONS = ("0.11", PINNED_VLLM)


@dataclass(frozen=True)
class ApiChange:
    version: str  # the version that has the new API (the pinned one)
    area: str
    before: str
    after: str
    used_by: str  # what in onboard depends on it


# The "after" side is read from the installed vLLM 0.32.0 (tests/test_pr.py checks
# the fused-MoE exports); the "before" side from vLLM's older model sources.
API_CHANGES: tuple[ApiChange, ...] = (
    ApiChange(
        PINNED_VLLM,
        "fused MoE layer",
        "`from vllm.model_executor.layers.fused_moe import FusedMoE`; the model "
        "builds `FusedMoE(num_experts=, top_k=, hidden_size=, intermediate_size=, "
        "renormalize=, ...)` and calls its own router (`ReplicatedLinear` gate) "
        "before the experts",
        "`from vllm.model_executor.layers.fused_moe import FusedMoEFactory, "
        "GateLinear`; the factory returns a `MoERunner` that owns the "
        "`GateLinear` router and the shared experts; `FusedMoE` is no longer "
        "exported",
        "templates/components/moe/vllm.py.j2",
    ),
    ApiChange(
        PINNED_VLLM,
        "shared experts",
        "`SharedFusedMoE(shared_experts=..., ...)`, first from "
        "`vllm.model_executor.layers.shared_fused_moe`, later "
        "`vllm.model_executor.layers.fused_moe.shared_fused_moe`, then merged "
        "into `FusedMoE`",
        "`FusedMoEFactory(shared_experts=..., gate=...)`; the `MoERunner` runs "
        "them (`vllm.model_executor.layers.fused_moe.runner.shared_experts`)",
        "templates/components/moe/vllm.py.j2",
    ),
    ApiChange(
        PINNED_VLLM,
        "expert weight loading",
        "`FusedMoE.make_expert_params_mapping(...)` and per-expert "
        "`weight_loader` calls in the model's `load_weights`",
        "`AutoWeightsLoader` reaches the `MoERunner`'s own `load_weights` (the "
        "mapping helper is module-level: `fused_moe_make_expert_params_mapping`)",
        "templates/vllm/causal_lm.py.j2",
    ),
    ApiChange(
        PINNED_VLLM,
        "MLA model types",
        "`ModelConfig.is_deepseek_mla` in vllm/config/model.py",
        "`is_deepseek_mla` of the config convertor in "
        "vllm/transformers_utils/model_arch_config_convertor.py",
        "onboard/pr/build.py (CONVERTOR edit)",
    ),
    ApiChange(
        PINNED_VLLM,
        "config classes of new model types",
        "`_CONFIG_REGISTRY` in vllm/transformers_utils/config.py maps model "
        "types to imported classes",
        "`_CONFIG_REGISTRY` is a `LazyConfigDict` of class *names*, resolved "
        "through `_CLASS_TO_MODULE` in vllm/transformers_utils/configs/__init__.py",
        "onboard/pr/build.py (CONFIG_PY, CONFIGS edits)",
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
