"""Soft-capped attention scores (Gemma-2): ``cap * tanh(scores / cap)`` before
the softmax, so no score leaves (-cap, cap).

vLLM's ``Attention`` applies it as ``logits_soft_cap=`` (as vLLM's ``gemma2.py``
does); the reference's softmax core (its fragment at slot ``attend``) caps the
scaled scores before the mask. It has no tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    field = "attention.logit_softcap"
    concept = "attn_logit_softcapping"
    attributes = ("softcap",)
    attend_inputs = ("self.softcap",)
    vllm_slots = ("gqa.attn_kwargs",)
    hf_slots = ("gqa.init", "attend")

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

    def code_context(self, node: Softcap, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"key": keys.need("attn_logit_softcapping", node.cap)}

    def describe(self, node: Softcap) -> str:
        return "soft-capped scores"


COMPONENT = _AttentionSoftcap()
