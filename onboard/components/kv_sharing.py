"""Cross-layer KV sharing: a layer reads the KV cache of an earlier layer and
computes queries only (Gemma-3n, Hunyuan-style CLA; with MLA, the target's latent
and rope key, expanded by the sharing layer's own ``kv_b_proj``).

vLLM builds it into ``Attention``: a layer constructed with
``kv_sharing_target_layer_name`` allocates no cache and reads the target's
(``vllm/attention/layer.py``). config.json states it as
``kv_sharing_target_layers``: one entry per layer, the target's index or null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import (
    Component,
    ConfigProblem,
    LayerIndex,
    LayerKey,
    Report,
    Section,
)

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

CONFIG_KEY = "kv_sharing_target_layers"


class KVSharingFields(Section):
    kv_sharing: dict[LayerKey, LayerIndex] = Field(
        default_factory=dict,
        description="Cross-layer KV sharing: `layer: target_layer` means the layer "
        "reuses the KV cache of the earlier target layer and computes queries only "
        "(MLA: the target's latent and rope key, expanded by the layer's own "
        "`kv_b_proj`; with an indexer, the layer keeps its own indexer and index "
        "keys: only the latent cache is shared).",
    )


@dataclass(frozen=True)
class KVSource:
    """The earlier layer whose KV cache this attention reads."""

    layer: int


def targets_from_config(targets: Any, num_layers: int | None) -> dict[int, int]:
    """``{layer: target}`` from config.json's ``kv_sharing_target_layers`` (None:
    no sharing); ConfigProblem where it is not one index or null per layer (of
    ``num_layers``, where known)."""
    if targets is None:
        return {}
    if (
        not isinstance(targets, list)
        or (num_layers is not None and len(targets) != num_layers)
        or not all(t is None or type(t) is int for t in targets)
    ):
        count = "" if num_layers is None else f" ({num_layers} layers)"
        raise ConfigProblem(
            f"{CONFIG_KEY}: must list one layer index or null per layer{count}"
        )
    return {i: t for i, t in enumerate(targets) if t is not None}


class _KVSharing(Component):
    name = "kv_sharing"
    label = "cross-layer KV sharing"
    extends = "attention"
    Fields = KVSharingFields
    Node = KVSource
    field = "attention.kv_sharing"
    concept_fields = {CONFIG_KEY: ("attention.kv_sharing",)}
    # Its vLLM code (templates/components/kv_sharing/): each layer's target
    # found from the config by the model's layer factory, and handed through
    # the decoder layer and the attention to vLLM's Attention (which then
    # allocates no cache and reads the target's); each attention kind's
    # queries-only path: GQA's projection, forward and weights; MLA's latent
    # projection, the target's latent read in forward, and the weights.
    vllm_fragments = {
        **{f"{host}.args": "components/kv_sharing/vllm_args.py.j2"
           for host in ("gqa", "mla", "layer")},
        **{slot: "components/kv_sharing/vllm_attn_kwargs.py.j2"
           for slot in ("gqa.attn_kwargs", "mla.attn_kwargs", "layer.attn_kwargs",
                        "model.layer_kwargs")},
        "model.layer_plan": "components/kv_sharing/vllm_model_layer_plan.py.j2",
        **{f"gqa.{slot}": f"components/kv_sharing/vllm_gqa_{slot}.py.j2"
           for slot in ("projections", "forward", "methods")},
        **{f"mla.{slot}": f"components/kv_sharing/vllm_mla_{slot}.py.j2"
           for slot in ("attributes", "projections", "before_kv_b", "forward_args",
                        "latent", "indexer", "weights", "methods")},
    }  # fmt: skip
    # The reference's attention: its source, no k and v (GQA) or latent (MLA)
    # projection of its own where it has one, and the source's keys and values
    # or latent read (or its own kept for the layers reading them).
    hf_fragments = {
        **{f"{kind}.attributes": "components/kv_sharing/hf_attributes.py.j2"
           for kind in ("gqa", "mla")},
        **{f"gqa.{slot}": f"components/kv_sharing/hf_{slot}.py.j2"
           for slot in ("kv_projections", "kv_compute")},
        **{f"mla.{slot}": f"components/kv_sharing/hf_mla_{slot}.py.j2"
           for slot in ("doc", "latent_projection", "latent")},
    }  # fmt: skip

    def present(self, spec: ModelSpec) -> bool:
        return bool(spec.attention.kv_sharing)

    def plan(self, spec: ModelSpec, layer: int | None) -> KVSource | None:
        # An MTP head's block (layer None) keeps a cache of its own.
        target = None if layer is None else spec.attention.kv_sharing.get(layer)
        return None if target is None else KVSource(target)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        sharing = spec.attention.kv_sharing
        return {CONFIG_KEY: [sharing.get(i) for i in range(spec.num_hidden_layers)]}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        targets = get(CONFIG_KEY, None)
        if targets is None:
            return {}
        layers = get("num_hidden_layers", None)
        sharing = targets_from_config(targets, layers if type(layers) is int else None)
        return {"kv_sharing": sharing} if sharing else {}

    def remap_layers(
        self, section: dict[str, Any], position: Mapping[int, int]
    ) -> None:
        # A pair whose target the tiny copy leaves out is dropped.
        section["kv_sharing"] = {
            position[layer]: position[target]
            for layer, target in section["kv_sharing"].items()
            if layer in position and target in position
        }

    def rules(self, spec: ModelSpec, report: Report) -> None:
        att = spec.attention
        if not att.kv_sharing:
            return
        path = ("attention", "kv_sharing")
        n = spec.num_hidden_layers
        kinds = att.layer_types
        types = (
            spec.layer_attention_types() if kinds is None or len(kinds) == n else None
        )
        for layer, target in att.kv_sharing.items():
            where = (*path, layer)
            if layer >= n:
                report(
                    where, f"layer {layer} does not exist (num_hidden_layers is {n})"
                )
                continue
            if target >= layer:
                report(
                    where,
                    f"target layer {target} must come before layer {layer}: vLLM "
                    "shares only the cache of an earlier attention layer",
                )
                continue
            if target in att.kv_sharing:
                report(
                    where,
                    f"target layer {target} itself shares layer "
                    f"{att.kv_sharing[target]}'s cache; point at that layer instead",
                )
            if types is not None and types[layer] != types[target]:
                report(
                    where,
                    f"layer {layer} is {types[layer]} but its target {target} is "
                    f"{types[target]}: vLLM shares caches only between layers of "
                    "the same window type",
                )
        linear = [i for i, kind in enumerate(kinds or []) if kind == "linear_attention"]
        for layer, target in att.kv_sharing.items():
            if layer in linear or target in linear:
                report(
                    (*path, layer),
                    "a linear-attention layer has a recurrent state, not a KV cache "
                    "to share",
                )
            if spec.uses_rope(layer) != spec.uses_rope(target):
                report(
                    (*path, layer),
                    f"layer {layer} and its KV source {target} must both use rope or "
                    "both not (the shared keys carry the source's rotation)",
                )
        if att.indexer is not None and att.indexer.shared_layers:
            # A KV-sharing layer runs an indexer of its own (only the latent cache
            # is shared); one that also skips it has no family to follow yet.
            report(
                ("attention", "indexer", "shared_layers"),
                "shared indexer layers beside cross-layer KV sharing are not "
                "expressible yet",
            )
        if "qkv_proj" in spec.checkpoint.fused and att.type != "mla":
            report(
                ("checkpoint", "fused"),
                "qkv_proj: a layer that reads another layer's KV cache loads q "
                "alone; a fused q/k/v tensor is not generated for it",
            )
        if att.type == "mla":
            _mla_rules(spec, report)


def mla_limits(spec: ModelSpec) -> list[tuple[tuple[str, ...], str]]:
    """What MLA layers sharing a latent cache are generated without, present in
    ``spec``: (its path in the spec, what it is). They are generated (vLLM's
    MLAAttention called directly, the plugin's patch on released vLLM) for the
    plain MLA block that the CPU engine validates: docs/spec.md's limits, which
    the rules report and generate asserts."""
    att = spec.attention
    limits = (
        (spec.rope.scaling is not None, ("rope", "scaling"), "rope scaling"),
        (spec.mtp is not None, ("mtp",), "MTP heads"),
        (spec.norm.type != "rmsnorm", ("norm", "type"), f"{spec.norm.type} norms"),
        (
            spec.norm.placement != "pre",
            ("norm", "placement"),
            f"norm.placement {spec.norm.placement}",
        ),
        (
            bool(getattr(att, "output_gate", False)),
            ("attention", "output_gate"),
            "an output gate",
        ),
        (
            spec.residual_multiplier != 1.0,
            ("residual_multiplier",),
            "a residual_multiplier",
        ),
        (
            spec.linear_attention is not None,
            ("linear_attention",),
            "linear-attention layers",
        ),
        (
            att.llama_4_scaling is not None,
            ("attention", "llama_4_scaling"),
            "llama_4_scaling",
        ),
        (
            spec.mla_whole_head_rope,
            ("model_type",),
            f"{spec.model_type}'s whole-head rope",
        ),
    )
    return [(path, what) for present, path, what in limits if present]


def mla_limit_message(what: str) -> str:
    return (
        "MLA layers that share another layer's latent cache "
        f"(attention.kv_sharing) are generated without {what} only"
    )


def _mla_rules(spec: ModelSpec, report: Report) -> None:
    for path, what in mla_limits(spec):
        report(path, mla_limit_message(what))


COMPONENT = _KVSharing()
