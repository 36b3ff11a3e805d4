"""MLA's output gate (HY-V4, Dots3): a sigmoid gate on the attention output.

Each MLA layer projects a gate from its input, ``gate_proj(x)``, and multiplies
the attention output by ``sigmoid(gate)`` before ``o_proj``: one gate per head
and value dim (``element``: HY-V4's ``gate_proj``, ``[heads * v_head_dim,
hidden]``) or one per head (``head``: Dots3's headwise gate, ``[heads,
hidden]``). transformers' ``hy_v4`` is the reference (``HYV4Attention``);
vLLM's ``hy_v4`` and ``dots3_note`` gate the output of vLLM's ``MLAAttention``
the same way, which is the form the generated model takes (MLA's direct form).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from onboard.components.base import Component, Report, Role, Section, TensorPlan

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec

Per = Literal["element", "head"]


class MLAOutputGateFields(Section):
    output_gate: Per | None = Field(
        None,
        description="A sigmoid gate on the attention output before o_proj, "
        "projected from the layer input by its own `gate_proj`: `element`, one "
        "gate per head and value dim (HY-V4; gate_proj [num_heads * v_head_dim, "
        "hidden]); `head`, one gate per head (Dots3's headwise gate; gate_proj "
        "[num_heads, hidden]). Null: none.",
    )


@dataclass(frozen=True)
class MLAOutputGate:
    """The output gate of one MLA layer."""

    per: Per
    num_heads: int
    v_head_dim: int

    @property
    def width(self) -> int:
        """Gates per head."""
        return self.v_head_dim if self.per == "element" else 1


class _MLAOutputGate(Component):
    name = "mla_output_gate"
    label = "an output gate"
    extends = "attention.mla"
    Fields = MLAOutputGateFields
    Node = MLAOutputGate
    field = "attention.mla.output_gate"
    concept = "mla_output_gate"
    roles = {
        "mla_gate_proj": Role("model.layers.{layer}.self_attn.gate_proj", ("attn",))
    }
    # Plain attributes its reference code sets (no module may take the name).
    attributes = ("gate_width",)
    vllm_slots = hf_slots = ("mla.init", "mla.output")

    def present(self, spec: ModelSpec) -> bool:
        return spec.attention.type == "mla" and super().present(spec)

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if not self.present(spec):
            return
        path = ("attention", "mla", "output_gate")
        att = spec.attention
        for present, what in (
            (bool(att.kv_sharing), "attention.kv_sharing"),
            (att.indexer is not None, "attention.indexer"),
            (att.llama_4_scaling is not None, "attention.llama_4_scaling"),
            (spec.rope.scaling is not None, "rope.scaling"),
        ):
            if present:
                report(path, f"not expressible beside {what} yet")

    def plan(self, spec: ModelSpec, layer: int | None) -> MLAOutputGate:
        mla = spec.attention.mla
        assert mla is not None and mla.output_gate is not None
        return MLAOutputGate(mla.output_gate, spec.attention.num_heads, mla.v_head_dim)

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        gate = layer.mixer.part(MLAOutputGate)
        assert gate is not None
        name = self.tensor_name(spec, "mla_gate_proj", layer.index)
        shape = (gate.num_heads * gate.width, spec.hidden_size)
        return [TensorPlan(f"{name}.weight", shape, "normal", layer.index)]

    def code_context(self, node: MLAOutputGate, keys: ConfigKeys) -> Mapping[str, Any]:
        # Both models read the gate's kind from the config, as vLLM's hy_v4 does.
        return {"key": keys.need("mla_output_gate", node.per)}

    def describe(self, node: MLAOutputGate) -> str:
        per = "per head and value dim" if node.per == "element" else "per head"
        gate = "the output gated by sigmoid(gate_proj(x))"
        return f"{gate}, one gate {per}, before o_proj"


COMPONENT = _MLAOutputGate()
