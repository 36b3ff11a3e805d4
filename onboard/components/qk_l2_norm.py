"""Llama-4's q/k norm (``use_qk_norm``): on the layers that rotate, each head of
q and k RMS-normalised after rope, without a weight (an L2 norm scaled by
sqrt(head_dim)), eps the model's norm eps; the NoPE layers have none.

Not Qwen3's q/k norms (:mod:`onboard.components.qk_norm`): no tensor, after
rope, and on the rope layers only. The generated vLLM model normalises as
vLLM's ``llama4.py`` does (a float32 ``RMSNorm`` without weight over each head);
the reference as transformers' ``Llama4TextL2Norm``.
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


class QkL2NormFields(Section):
    qk_l2_norm: bool = Field(
        False,
        description="On the layers that rotate, RMS-normalise each head of q and "
        "k after rope, without a weight (eps norm.eps); the NoPE layers have none "
        "(Llama-4's use_qk_norm). Not beside qk_norm.",
    )


@dataclass(frozen=True)
class QkL2Norm:
    """The weightless q/k norm of the rope layers."""

    eps: float


class _QkL2Norm(Component):
    name = "qk_l2_norm"
    label = "q/k L2 norm"
    extends = "attention"
    Fields = QkL2NormFields
    Node = QkL2Norm
    field = "attention.qk_l2_norm"
    concept = "qk_l2_norm"
    attributes = ("qk_l2_norm", "qk_l2_norm_eps")
    vllm_slots = hf_slots = ("gqa.init", "gqa.after_rope")

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if not self.present(spec):
            return
        where = ("attention", "qk_l2_norm")
        att = spec.attention
        if att.type != "gqa":
            report(where, "generated for GQA attention only")
        if att.qk_norm:
            report(where, "not beside qk_norm (one q/k norm per layer)")
        if att.kv_sharing:
            report(where, "not generated beside cross-layer KV sharing")
        if spec.norm.type != "rmsnorm" or spec.norm.unit_offset:
            report(where, "needs norm.type rmsnorm without unit_offset (its eps)")
        if len(spec.rope.nope_layers) == spec.num_hidden_layers:
            report(where, "applies to the layers that rotate, and none does")

    def plan(self, spec: ModelSpec, layer: int | None) -> QkL2Norm | None:
        return QkL2Norm(spec.norm.eps) if self.present(spec) else None

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        return {"qk_l2_norm": self.present(spec)}

    def code_context(self, node: QkL2Norm, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"key": keys.need("qk_l2_norm", True)}

    def describe(self, node: QkL2Norm) -> str:
        return "q and k of the rope layers RMS-normalised per head after rope"


COMPONENT = _QkL2Norm()
