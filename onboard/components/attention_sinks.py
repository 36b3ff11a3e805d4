"""Attention sinks (gpt-oss): a learned logit per query head in every softmax.

Each query head's ``sinks`` logit joins its softmax as one more key without a
value: it takes probability mass from the real keys and is then dropped. The
tensor is a parameter of the attention module (``self_attn.sinks``, [num_heads]);
vLLM's ``Attention`` takes it as ``sinks=`` (each tensor-parallel rank holds its
own heads' sinks), as vLLM's ``gpt_oss.py`` does. transformers' ``gpt_oss`` is the
family that has them (its config has no key: the family fixes them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
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
    roles = MappingProxyType(
        {
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
    )
    config_aliases = MappingProxyType({"attention_sinks": ("attention_sinks",)})
    concept_fields = MappingProxyType({"attention_sinks": ("attention.sinks",)})
    # A checkpoint's tensor names show it (spec from-hf, onboard.reference.infer).
    visible = ("attention_sinks",)
    attend_inputs = ("self.sinks",)
    vllm_fragments = MappingProxyType(
        {
            "gqa.init": "components/attention_sinks/vllm_init.py.j2",
            "gqa.attn_kwargs": "components/attention_sinks/vllm_attn_kwargs.py.j2",
        }
    )
    hf_fragments = MappingProxyType(
        {
            "gqa.init": "components/attention_sinks/hf_init.py.j2",
            "attend": "components/attention_sinks/hf_attend.py.j2",
        }
    )

    def present(self, spec: ModelSpec) -> bool:
        return spec.attention.sinks

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if self.present(spec) and spec.attention.type == "mla":
            message = "attention sinks are not expressible for MLA"
            report(("attention", "sinks"), message)

    def plan(self, spec: ModelSpec, layer: int | None) -> Sinks:
        return Sinks(spec.attention.num_heads)

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        return {"attention_sinks": True}

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.attention.type != "gqa":
            return {}
        return {"attention_sinks": spec.attention.sinks}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        return {"sinks": True} if get("attention_sinks", False) else {}

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        sinks = layer.mixer.part(Sinks)
        assert sinks is not None
        name = self.tensor_name(spec, "sinks", layer.index)
        return [TensorPlan(f"{name}.sinks", (sinks.num_heads,), "sinks", layer.index)]

    def describe(self, node: Sinks) -> str:
        return "a learned sink logit per head in each softmax"


COMPONENT = _AttentionSinks()
