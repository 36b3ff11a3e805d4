"""Attention sinks (gpt-oss): a learned logit per query head in every softmax.

Each query head's ``sinks`` logit joins its softmax as one more key without a
value: it takes probability mass from the real keys and is then dropped. The
tensor is a parameter of the attention module (``self_attn.sinks``, [num_heads]);
vLLM's ``Attention`` takes it as ``sinks=`` (each tensor-parallel rank holds its
own heads' sinks), as vLLM's ``gpt_oss.py`` does. transformers' ``gpt_oss`` is the
family that has them (its config has no key: the family fixes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import Component, Report, Role, Section, TensorPlan

if TYPE_CHECKING:
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec


class AttentionSinksFields(Section):
    sinks: bool = Field(
        False,
        description="A learned logit per query head (its `sinks` tensor) joins the "
        "softmax of every query as one more key with no value: an attention sink "
        "that takes probability mass from the real keys (gpt-oss).",
    )


@dataclass(frozen=True)
class Sinks:
    """The sink logits of one attention layer."""

    num_heads: int


class _AttentionSinks(Component):
    name = "attention_sinks"
    label = "attention sinks"
    extends = "attention"
    Fields = AttentionSinksFields
    Node = Sinks
    field = "attention.sinks"
    concept = "attention_sinks"
    roles = {
        # A parameter of the attention module itself.
        "sinks": Role(
            "model.layers.{layer}.self_attn",
            ("attn",),
            linear=False,
            param="sinks",
            guard="sinks",
            spec_field="attention.sinks",
            dims=("attention.num_heads",),
        )
    }
    # A checkpoint's tensor names show it (spec from-hf, onboard.reference.infer).
    visible = ("attention_sinks",)
    attend_inputs = ("self.sinks",)
    vllm_slots = ("gqa.init", "gqa.attn_kwargs")
    hf_slots = ("gqa.init", "attend")

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if self.present(spec) and spec.attention.type == "mla":
            message = "attention sinks are not expressible for MLA"
            report(("attention", "sinks"), message)

    def plan(self, spec: ModelSpec, layer: int | None) -> Sinks:
        return Sinks(spec.attention.num_heads)

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.attention.type != "gqa":
            return {}
        return {"attention_sinks": spec.attention.sinks}

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        sinks = layer.mixer.part(Sinks)
        assert sinks is not None
        name = self.tensor_name(spec, "sinks", layer.index)
        return [TensorPlan(f"{name}.sinks", (sinks.num_heads,), "sinks", layer.index)]

    def describe(self, node: Sinks) -> str:
        return "a learned sink logit per head in each softmax"


COMPONENT = _AttentionSinks()
