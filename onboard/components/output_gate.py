"""Gated attention (Qwen3-Next, Qwen3.5): a sigmoid gate on GQA's output.

q_proj projects, per head, the head's query and then a gate of the same width
(its rows: each head's query, then its gate); the attention output is
multiplied by ``sigmoid(gate)`` before o_proj, as vLLM's ``qwen3_next.py`` does.
The gate has no tensor of its own: it doubles q_proj's rows
(:attr:`Component.q_slices`), which the tiny writer and the preflight read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import Component, Report, Section

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec


class OutputGateFields(Section):
    output_gate: bool = Field(
        False,
        description="Gated attention (Qwen3-Next): q_proj also projects, per head, a "
        "gate beside the query (each head's query then its gate); the attention "
        "output is multiplied by sigmoid(gate) before o_proj.",
    )


@dataclass(frozen=True)
class OutputGate:
    """The output gate of one GQA layer: one gate per query channel."""

    num_heads: int
    head_dim: int


class _OutputGate(Component):
    name = "output_gate"
    label = "an output gate"
    extends = "attention"
    Fields = OutputGateFields
    Node = OutputGate
    q_slices = 1
    field = "attention.output_gate"
    concept = "attn_output_gate"
    vllm_slots = ("gqa.q_layout", "gqa.split", "gqa.output")
    hf_slots = ("gqa.q_layout", "gqa.q_view", "gqa.output")

    def rules(self, spec: ModelSpec, report: Report) -> None:
        att = spec.attention
        where = ("attention", "output_gate")
        if not att.output_gate:
            return
        if att.type == "mla":
            report(where, "output_gate does not apply to MLA attention")
            return
        if att.qk_norm and att.qk_norm_scope != "head":
            report(where, "with an output gate the q/k norm must be per head")
        if att.kv_sharing:
            report(where, "an output gate is not generated for KV-sharing layers")
        if "qkv_proj" in spec.checkpoint.fused:
            report(where, "an output gate is not generated for a fused qkv_proj")

    def plan(self, spec: ModelSpec, layer: int | None) -> OutputGate | None:
        if spec.attention.type != "gqa":
            return None
        return OutputGate(spec.attention.num_heads, spec.head_dim)

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.attention.type != "gqa":
            return {}
        return {"attn_output_gate": spec.attention.output_gate}

    def describe(self, node: OutputGate) -> str:
        return (
            "the output gated per channel by sigmoid(gate), which q_proj gives "
            "beside each head's query"
        )


COMPONENT = _OutputGate()
