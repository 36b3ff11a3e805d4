"""Soft-capped attention scores (Gemma-2): ``cap * tanh(scores / cap)`` before
the softmax, so no score leaves (-cap, cap).

vLLM's ``Attention`` applies it as ``logits_soft_cap=`` (as vLLM's ``gemma2.py``
does); the reference's softmax core (its fragment at slot ``attend``) caps the
scaled scores before the mask. It has no tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import Component, Report, Section

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec


class AttentionSoftcapFields(Section):
    logit_softcap: float | None = Field(
        None,
        gt=0,
        description="Soft-cap of the attention scores before the softmax: "
        "cap * tanh(scores / cap) (Gemma-2); null: none.",
    )


@dataclass(frozen=True)
class Softcap:
    """The soft-cap of one attention layer's scores."""

    cap: float


class _AttentionSoftcap(Component):
    name = "attention_softcap"
    label = "soft-capped scores"
    extends = "attention"
    Fields = AttentionSoftcapFields
    Node = Softcap
    config_aliases = MappingProxyType(
        {"attn_logit_softcapping": ("attn_logit_softcapping",)}
    )
    concept_fields = MappingProxyType(
        {"attn_logit_softcapping": ("attention.logit_softcap",)}
    )
    attributes = ("softcap",)
    attend_inputs = ("self.softcap",)
    vllm_fragments = MappingProxyType(
        {"gqa.attn_kwargs": "components/attention_softcap/vllm_attn_kwargs.py.j2"}
    )
    hf_fragments = MappingProxyType(
        {
            "gqa.init": "components/attention_softcap/hf_init.py.j2",
            "attend": "components/attention_softcap/hf_attend.py.j2",
        }
    )

    def present(self, spec: ModelSpec) -> bool:
        return spec.attention.logit_softcap is not None

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if not self.present(spec):
            return
        where = ("attention", "logit_softcap")
        if spec.attention.type == "mla":
            report(where, "logit_softcap does not apply to MLA attention")
        elif spec.attention.sinks:
            # Each has its own softmax core in the reference.
            report(where, "a soft-cap is not generated beside attention sinks")

    def plan(self, spec: ModelSpec, layer: int | None) -> Softcap | None:
        cap = spec.attention.logit_softcap
        return None if cap is None else Softcap(cap)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        return {"attn_logit_softcapping": spec.attention.logit_softcap}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        cap = get("attn_logit_softcapping", None)
        return {} if cap is None else {"logit_softcap": cap}

    def vllm_context(self, node: Softcap, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"key": keys.need("attn_logit_softcapping", node.cap)}

    def reference_context(self, node: Softcap, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"key": keys.need("attn_logit_softcapping", node.cap)}

    def describe(self, node: Softcap) -> str:
        return "soft-capped scores"


COMPONENT = _AttentionSoftcap()
