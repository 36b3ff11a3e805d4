"""q/k norms (Qwen3, OLMo-2, HunYuan, Command R): q and k normalised before the
scores.

Three scopes, one tensor each for q (``self_attn.q_norm``) and k
(``self_attn.k_norm``):

- ``head``: an RMS norm over each head's dims, one weight [head_dim] shared by
  the heads (Qwen3, Gemma-3); before rope, or after it (HunYuan,
  ``qk_norm_after_rope``);
- ``projection``: an RMS norm over the whole q and the whole k projection, one
  weight per channel of all heads (OLMo-2, OLMoE); tensor-parallel ranks gather
  their heads first;
- ``head_weights``: a LayerNorm without bias over each head's dims, each head
  with a weight row of its own ([heads, head_dim]; Command R's ``use_qk_norm``,
  as vLLM's ``commandr.py``).

A layer that reads another layer's KV cache computes no keys: it keeps q's norm
and leaves k's (weights_probe.left_out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from onboard.components.base import Component, Report, Role, Section, TensorPlan

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec

Scope = Literal["head", "projection", "head_weights"]


class QkNormFields(Section):
    qk_norm: bool = Field(False, description="RMS-normalise q and k per head (Qwen3).")
    qk_norm_scope: Scope = Field(
        "head",
        description="With qk_norm: `head` normalises each head (Qwen3); "
        "`projection` normalises the whole q and the whole k projection, one "
        "weight per channel of all heads (OLMo-2, OLMoE); `head_weights` "
        "normalises each head with a weight of its own ([heads, head_dim]), a "
        "LayerNorm without bias (Cohere's use_qk_norm, as vLLM's commandr.py; "
        "needs norm.type layernorm).",
    )
    qk_norm_after_rope: bool = Field(
        False,
        description="With qk_norm: normalise q and k after rope instead of "
        "before (HunYuan).",
    )


@dataclass(frozen=True)
class QkNorm:
    """The q and k norms of one attention layer."""

    scope: Scope
    after_rope: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def form(self) -> str:
        """What the generated code does: ``head``, ``after_rope`` (per head,
        after rope), ``projection`` or ``head_weights``."""
        if self.scope == "head" and self.after_rope:
            return "after_rope"
        return self.scope

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The q norm's and the k norm's weight shapes."""
        hd = self.head_dim
        if self.scope == "projection":
            return (self.num_heads * hd,), (self.num_kv_heads * hd,)
        if self.scope == "head_weights":
            return (self.num_heads, hd), (self.num_kv_heads, hd)
        return (hd,), (hd,)


def _role(name: str, heads: str) -> Role:
    return Role(
        f"model.layers.{{layer}}.self_attn.{name}",
        ("attn",),
        linear=False,
        guard="norms",
        spec_field="attention.qk_norm",
        dims=(heads, "attention.head_dim"),
    )


class _QkNorm(Component):
    name = "qk_norm"
    label = "qk-norm"
    extends = "attention"
    Fields = QkNormFields
    Node = QkNorm
    field = "attention.qk_norm"
    roles = {
        "q_norm": _role("q_norm", "attention.num_heads"),
        "k_norm": _role("k_norm", "attention.num_kv_heads"),
    }
    config_aliases = {
        "qk_norm": ("qk_norm", "use_qk_norm"),
        "qk_norm_scope": ("qk_norm_scope",),  # head | projection | head_weights
        "qk_norm_after_rope": ("qk_norm_after_rope",),
    }
    concept_fields = {"qk_norm": ("attention.qk_norm",)}
    # The tensor names show the norms, their shapes the scope.
    visible = ("qk_norm", "qk_norm_scope")
    vllm_slots = (
        "gqa.classes",
        "gqa.init_after_proj",
        "gqa.before_rope",
        "gqa.after_rope",
        "gqa.methods",
        "gqa.q_only_before_rope",
        "gqa.q_only_after_rope",
        "gqa.q_only_skip",
    )
    hf_slots = (
        "norms.classes",
        "gqa.k_init",
        "gqa.q_init",
        "gqa.inputs",
        "gqa.before_rope",
        "gqa.after_rope",
    )

    def rules(self, spec: ModelSpec, report: Report) -> None:
        att = spec.attention
        a = ("attention",)
        if not att.qk_norm:
            for field, default in (
                ("qk_norm_scope", "head"),
                ("qk_norm_after_rope", False),
            ):
                if getattr(att, field) != default:
                    report(a + (field,), f"{field} applies only with qk_norm: true")
            return
        if att.type == "mla":
            report(a + ("qk_norm",), "qk_norm does not apply to MLA attention")
        scope = ("attention", "qk_norm_scope")
        if att.qk_norm_scope == "projection" and att.kv_sharing:
            report(
                scope,
                "a q/k norm over the whole projection is not generated for layers "
                "that share another layer's KV cache",
            )
        if att.qk_norm_scope == "head_weights" and att.kv_sharing:
            report(
                scope,
                "q/k norms with a weight per head are not generated for layers "
                "that share another layer's KV cache",
            )
        if att.qk_norm_scope == "head_weights" and spec.norm.type != "layernorm":
            report(
                scope,
                "q/k norms with a weight per head are LayerNorms (Cohere); they "
                "need norm.type layernorm",
            )
        if att.qk_norm_scope == "head_weights" and att.qk_norm_after_rope:
            report(
                a + ("qk_norm_after_rope",),
                "q/k norms with a weight per head come before rope (Cohere); "
                "qk_norm_after_rope needs qk_norm_scope: head",
            )
        if att.qk_norm_scope == "projection" and att.qk_norm_after_rope:
            report(
                a + ("qk_norm_after_rope",),
                "a norm over the whole projection comes before rope (rope works "
                "per head); qk_norm_after_rope needs qk_norm_scope: head",
            )

    def plan(self, spec: ModelSpec, layer: int | None) -> QkNorm | None:
        att = spec.attention
        if att.type != "gqa":
            return None
        return QkNorm(
            att.qk_norm_scope,
            att.qk_norm_after_rope,
            att.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        att = spec.attention
        out: dict[str, Any] = {"qk_norm": True}
        if att.qk_norm_scope != "head":
            out["qk_norm_scope"] = att.qk_norm_scope
        if att.qk_norm_after_rope:
            out["qk_norm_after_rope"] = True
        return out

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        att = spec.attention
        if att.type != "gqa":
            return {}
        return {
            "qk_norm": att.qk_norm,
            "qk_norm_scope": att.qk_norm_scope,
            "qk_norm_after_rope": att.qk_norm_after_rope,
        }

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if get("qk_norm", False):
            out["qk_norm"] = True
        scope = get("qk_norm_scope", "head")
        if scope != "head":
            out["qk_norm_scope"] = scope
        after = get("qk_norm_after_rope", False)
        if after is not False:
            out["qk_norm_after_rope"] = after
        return out

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        norm = layer.mixer.part(QkNorm)
        assert norm is not None
        # A 1 + weight norm (Gemma) holds the scale less one.
        init = "zeros" if spec.norm.unit_offset else "ones"
        return [
            TensorPlan(
                f"{self.tensor_name(spec, role, layer.index)}.weight",
                shape,
                init,
                layer.index,
            )
            for role, shape in zip(("q_norm", "k_norm"), norm.shapes(), strict=True)
        ]

    def vllm_context(self, node: QkNorm, keys: ConfigKeys) -> Mapping[str, Any]:
        return {"form": node.form}

    def describe(self, node: QkNorm) -> str:
        return {
            "head": "q and k RMS-normalised per head",
            "after_rope": "q and k RMS-normalised per head after rope",
            "projection": "q and k each RMS-normalised over the whole projection",
            "head_weights": "q and k layer-normalised per head, each head with its "
            "own weight",
        }[node.form]


COMPONENT = _QkNorm()
